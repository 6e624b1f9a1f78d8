"""Task helpers the asyncio shells share."""
from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel a background task and wait until it has ended (its finally blocks ran).

    The task's own CancelledError is swallowed, also when close() runs while the caller
    is already being cancelled (a `finally`, an `__aexit__`): shutting down must go on.
    Only a cancellation of the caller that arrives *while it waits here* is raised
    (Task.cancelling() counted before and after). An exception the task had already
    ended with is raised, as awaiting it would."""
    if task is None:
        return
    current = asyncio.current_task()
    pending = current.cancelling() if current is not None else 0
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if current is not None and current.cancelling() > pending:
            raise
