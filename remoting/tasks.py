"""Task helpers the asyncio shells share."""
from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel a background task and wait until it has ended (its finally blocks ran).

    The task's own CancelledError is swallowed; a cancellation of the caller while it
    waits is not (Task.cancelling() tells the two apart). An exception the task had
    already ended with is raised, as awaiting it would."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
