"""Helpers shared by the offset-reset tests: a topic with messages on both sides of a
timestamp, and the `mqadmin` CLI run as a subprocess."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

from pocketmq.client import Message, Producer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


async def produce_around_a_timestamp(namesrv_addr: str, topic: str, n: int = 10) -> int:
    """Send old-0..old-{n-1}, then new-0..new-{n-1} at least 50 ms after the returned
    timestamp (ms) and 300 ms after the old ones."""
    async with Producer("WorkloadProducer", namesrv_addr, instance_name=f"workload-{os.getpid()}") as p:
        for i in range(n):
            await p.send(Message(topic, f"old-{i}".encode()))
        await asyncio.sleep(0.3)
        t_mid = int(time.time() * 1000)
        await asyncio.sleep(0.05)
        for i in range(n):
            await p.send(Message(topic, f"new-{i}".encode()))
    return t_mid


def poll_until(predicate, timeout_s: float = 10.0, interval_s: float = 0.2):
    """predicate()'s first truthy value, or its last value after timeout_s: for state that
    changes in another process (a route after a broker re-registers) with no event to await."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


def run_mqadmin(*args: str, env_extra: dict | None = None, timeout_s: float = 30) -> subprocess.CompletedProcess:
    """`python -m pocketmq.tools.mqadmin ARGS` from the repository root, without the caller's
    NAMESRV_ADDR (pass it in env_extra to test it)."""
    env = dict(os.environ)
    env.pop("NAMESRV_ADDR", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "pocketmq.tools.mqadmin", *args], capture_output=True, text=True,
                          timeout=timeout_s, cwd=ROOT, env=env, check=False)
