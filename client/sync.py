"""Blocking facade: the same clients for code without asyncio.

    from pocketmq.client.sync import Producer, PushConsumer, LitePullConsumer, TransactionProducer

    with Producer("PG", "127.0.0.1:9876") as p:
        p.send(Message("T", b"hello"))

Every facade object wraps its asyncio twin and runs it on one private event
loop in a daemon thread, shared by all facade objects of the process (so they
also share client instances per clientId). Methods have the same names and
arguments and block until the coroutine finishes. Listeners of a sync
PushConsumer run in its worker thread pool (plain functions) or on the
private loop (async functions). Do not call facade methods from inside that
private loop (for instance from an async listener): use the asyncio client there.
A plain listener may call its own consumer's close() / drain(): the call starts the
drain and returns at once (the drain has to wait for that listener to return); this
works because run() schedules the coroutine in a copy of the caller's context, and a
plain listener's thread carries its consumer's worker context.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import threading

from pocketmq.client.errors import ClientStateError, InvalidArgumentError
from pocketmq.client.lite_pull_consumer import LitePullConsumer as _AsyncLite
from pocketmq.client.producer import Producer as _AsyncProducer
from pocketmq.client.push_consumer import PushConsumer as _AsyncPush
from pocketmq.client.selector import MessageSelector
from pocketmq.client.transaction_producer import TransactionProducer as _AsyncTransactionProducer

__all__ = ["LitePullConsumer", "Producer", "PushConsumer", "TransactionProducer", "run"]

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None


def _forget_loop_after_fork() -> None:
    # A forked child inherits _loop but not the thread running it: start afresh there,
    # or every blocking call would wait forever for a loop nobody runs.
    global _loop, _thread, _lock
    _loop = None
    _thread = None
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_loop_after_fork)


def _get_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _lock:
        if _loop is None or _loop.is_closed() or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def runner():
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()
            _thread = threading.Thread(target=runner, name="pocketmq-client-loop", daemon=True)
            _thread.start()
            ready.wait(5)
            _loop = loop
        return _loop


def run(coro, timeout_s: float | None = None):
    """Run a coroutine on the facade's loop and wait for its result."""
    return submit(coro).result(timeout_s)


def submit(coro) -> concurrent.futures.Future:
    """Start a coroutine on the facade's loop; its result is the returned Future's (whose
    cancel() cancels the coroutine). From a thread other than the loop's only: waiting on
    the Future there would block the loop."""
    loop = _get_loop()
    if threading.current_thread() is _thread:
        coro.close()
        raise ClientStateError("blocking client call from inside its own event loop; use the asyncio client")
    return asyncio.run_coroutine_threadsafe(coro, loop)


class _Facade:
    _async_cls = None

    def __init__(self, *args, **kwargs):
        self._impl = self._async_cls(*args, **kwargs)

    def start(self):
        run(self._impl.start())
        return self

    def close(self) -> None:
        run(self._impl.close())

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def impl(self):
        """The asyncio client underneath."""
        return self._impl

    @property
    def stats(self) -> dict:
        """The async client's counters, a copy (a consumer's pulls, pulls_by_broker_id, ...;
        route_refreshes_on_failure of producers and consumers)."""
        return run(_on_loop(_stats_snapshot, self._impl.stats))

    def query_message(self, topic: str, key: str, max_num: int = 64, begin_ms: int = 0,
                      end_ms: int | None = None) -> list:
        """Messages of `topic` with `key` among their keys, newest first (client/query.py)."""
        return run(self._impl.query_message(topic, key, max_num, begin_ms, end_ms))

    def view_message(self, msg_id: str, topic: str | None = None):
        """The message with this offsetMsgId, or with this client msgId when `topic` is given."""
        return run(self._impl.view_message(msg_id, topic))


class Producer(_Facade):
    _async_cls = _AsyncProducer

    def send(self, msg, **kwargs):
        return run(self._impl.send(msg, **kwargs))

    def send_oneway(self, msg, **kwargs) -> None:
        run(self._impl.send_oneway(msg, **kwargs))

    def send_batch(self, msgs, **kwargs):
        return run(self._impl.send_batch(list(msgs), **kwargs))


def _in_thread(fn):
    """A plain function given to the facade, run in a worker thread so a blocking local
    transaction or check never stalls the private loop; async functions run on the loop."""
    if inspect.iscoroutinefunction(fn):
        return fn

    async def call(*args):
        return await asyncio.to_thread(fn, *args)
    call.__name__ = getattr(fn, "__name__", "call")
    return call


class TransactionProducer(Producer):
    """The blocking TransactionProducer: `local_executor` and `checker` run in worker
    threads (plain functions) or on the private loop (async functions)."""
    _async_cls = _AsyncTransactionProducer

    def __init__(self, group: str, namesrv_addr: str, *, checker, **kwargs):
        if not callable(checker):
            raise InvalidArgumentError("checker must be a function of the message returning a LocalTransactionState")
        super().__init__(group, namesrv_addr, checker=_in_thread(checker), **kwargs)

    def send_in_transaction(self, msg, local_executor, arg=None, **kwargs):
        if not callable(local_executor):
            raise InvalidArgumentError("local_executor must be a function (msg, arg) -> LocalTransactionState")
        return run(self._impl.send_in_transaction(msg, _in_thread(local_executor), arg, **kwargs))


def _stats_snapshot(stats: dict) -> dict:
    """A copy of a client's `stats` (nested tables too, e.g. pulls_by_broker_id), taken on
    the client's loop: the counters change there while the caller reads its copy."""
    return {k: dict(v) if isinstance(v, dict) else v for k, v in stats.items()}


class PushConsumer(_Facade):
    _async_cls = _AsyncPush

    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        self._impl.subscribe(topic, expression)

    def register_listener(self, listener) -> None:
        self._impl.register_listener(listener)

    def drain(self, timeout_s: float = 30.0) -> bool:
        return run(self._impl.drain(timeout_s))

    @property
    def client_id(self) -> str:
        return self._impl.client_id

    def in_flight_ages(self) -> dict:
        """{queue: age in ms of its oldest message still in a listener call (0: none)}: the
        async consumer's `in_flight_ages`, read on the consumer's loop (its tables belong
        to that thread)."""
        return run(_on_loop(self._impl.in_flight_ages))


async def _on_loop(fn, *args):
    return fn(*args)


class LitePullConsumer(_Facade):
    _async_cls = _AsyncLite

    def subscribe(self, topic: str, expression: str | MessageSelector = "*") -> None:
        if self._impl.state == "RUNNING":
            run(_on_loop(self._impl.subscribe, topic, expression))
        else:
            self._impl.subscribe(topic, expression)

    def assign(self, mqs) -> None:
        if self._impl.state == "RUNNING":
            run(_on_loop(self._impl.assign, list(mqs)))
        else:
            self._impl.assign(list(mqs))

    def poll(self, timeout_s: float = 5.0, max_records: int | None = None):
        return run(self._impl.poll(timeout_s, max_records))

    def __iter__(self):
        while self._impl.state == "RUNNING":
            yield from self.poll(1.0)

    def seek(self, mq, offset: int) -> None:
        run(_on_loop(self._impl.seek, mq, offset))

    def seek_to_begin(self, mq) -> None:
        run(self._impl.seek_to_begin(mq))

    def seek_to_end(self, mq) -> None:
        run(self._impl.seek_to_end(mq))

    def offset_for_timestamp(self, mq, timestamp_ms: int) -> int:
        return run(self._impl.offset_for_timestamp(mq, timestamp_ms))

    def committed(self, mq) -> int:
        return run(self._impl.committed(mq))

    def position(self, mq) -> int:
        return self._impl.position(mq)

    def commit(self, offsets=None) -> None:
        run(self._impl.commit(offsets))

    def pause(self, mqs) -> None:
        run(_on_loop(self._impl.pause, list(mqs)))

    def resume(self, mqs) -> None:
        run(_on_loop(self._impl.resume, list(mqs)))

    def assignment(self):
        return self._impl.assignment()

    def fetch_message_queues(self, topic: str):
        return run(self._impl.fetch_message_queues(topic))
