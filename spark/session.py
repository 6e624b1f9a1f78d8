"""One unstarted ClientInstance per nameserver address per Python process, on the blocking
facade's private loop (pocketmq.client.sync). Spark reuses Python workers, so executor
tasks of one worker share connections; an unstarted instance sends no heartbeats and
registers nothing on the brokers (like mqadmin: connections are dialled on demand)."""
from __future__ import annotations

import os
import threading

from pocketmq.client import sync
from pocketmq.client.instance import ClientInstance, default_instance_name, local_ip

_lock = threading.Lock()
_instances: dict[tuple, ClientInstance] = {}   # (nameserver address, credentials) -> instance


def _forget_after_fork() -> None:
    global _lock
    _instances.clear()
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


async def _instance(namesrv_addr: str, credentials=None, tls: bool = False) -> ClientInstance:
    key = (namesrv_addr, credentials, tls)
    inst = _instances.get(key)
    if inst is None or inst.closed:
        inst = ClientInstance(f"{local_ip()}@spark-{default_instance_name()}", namesrv_addr,
                              credentials=credentials, tls=tls or None)
        _instances[key] = inst
    return inst


def run_with_instance(namesrv_addr: str, fn, timeout_s: float | None = 120.0, credentials=None,
                      tls: bool = False):
    """Run `fn(instance)` (a coroutine function) on the client loop and return its result;
    `credentials` (the accessKey / secretKey options) sign every request, `tls` (tlsEnable)
    encrypts every connection."""
    return submit_with_instance(namesrv_addr, fn, credentials, tls).result(timeout_s)


def submit_with_instance(namesrv_addr: str, fn, credentials=None, tls: bool = False):
    """run_with_instance without the wait: the concurrent Future of `fn(instance)`'s result
    (cancel() cancels it)."""
    async def go():
        return await fn(await _instance(namesrv_addr, credentials, tls))
    return sync.submit(go())
