"""The shells' monotonic clock in integer milliseconds (one owner).

Sans-IO cores take `now_ms` as an argument; the asyncio shells that call them read it
here. Monotonic, so expiry and idle checks are immune to wall-clock steps.
"""
from __future__ import annotations

import time


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000
