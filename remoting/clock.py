"""The shells' clocks in integer milliseconds (one owner).

Sans-IO cores take `now_ms` as an argument; the asyncio shells that call them read it
here. `monotonic_ms` for deadlines, expiry and idle checks (immune to wall-clock steps);
`wall_ms` where RocketMQ puts wall time on the wire (born/store timestamps, offsets by time).
"""
from __future__ import annotations

import time


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def wall_ms() -> int:
    return time.time_ns() // 1_000_000
