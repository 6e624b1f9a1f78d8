"""remoting.tasks.cancel_and_wait: the task ends, its cancellation is swallowed, the caller's is not."""
import asyncio

import pytest

from pocketmq.remoting.tasks import cancel_and_wait


async def test_cancels_and_waits_for_cleanup():
    cleaned = asyncio.Event()

    async def loop():
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    t = asyncio.create_task(loop())
    await asyncio.sleep(0)          # let it start
    await cancel_and_wait(t)
    assert t.cancelled() and cleaned.is_set()
    await cancel_and_wait(None)     # nothing to do
    await cancel_and_wait(t)        # already ended: no error


async def test_a_cancelled_caller_stays_cancelled():
    started = asyncio.Event()
    release = asyncio.Event()

    async def stubborn():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            started.set()
            await release.wait()    # slow cleanup
            raise

    inner = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    closer = asyncio.create_task(cancel_and_wait(inner))
    await started.wait()
    closer.cancel()                 # the caller itself is cancelled while it waits
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await closer
    assert inner.done()


async def test_an_exception_the_task_ended_with_is_raised():
    async def boom():
        raise ValueError("x")

    t = asyncio.create_task(boom())
    await asyncio.sleep(0)
    with pytest.raises(ValueError):
        await cancel_and_wait(t)


async def test_close_in_a_cancelled_callers_finally_still_completes():
    """A shutdown that runs because its caller was cancelled (Ctrl-C, wait_for, __aexit__)
    must close every background task, not stop at the first."""
    async def loop():
        await asyncio.Event().wait()

    a, b = asyncio.create_task(loop()), asyncio.create_task(loop())
    closed = []

    async def main():
        try:
            await asyncio.Event().wait()
        finally:
            await cancel_and_wait(a)
            closed.append("a")
            await cancel_and_wait(b)
            closed.append("b")

    m = asyncio.create_task(main())
    await asyncio.sleep(0)
    m.cancel()
    with pytest.raises(asyncio.CancelledError):
        await m
    assert closed == ["a", "b"] and a.cancelled() and b.cancelled()
