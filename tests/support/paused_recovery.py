"""`mqbroker` whose store recovery stops half-way, for the crash test's kill during recovery.

    POCKETMQ_PAUSE_AT=cut|reput python -m tests.support.paused_recovery <mqbroker arguments>

Runs the real broker with one change: recovery prints `RECOVERY-PAUSED` and sleeps at the
chosen point, so the test can SIGKILL it exactly there:

* `cut` (default): right after the commit log's recovery returns (the torn tail zeroed,
  later segments deleted, nothing else flushed; the consume queues not yet cut or
  re-dispatched, the checkpoint not yet rewritten);
* `reput`: right after recovery's re-dispatch wrote the consume-queue units (not yet
  flushed; the checkpoint and the abort file not yet rewritten).

Test tooling only: it patches the classes in this process and is never shipped.
"""
from __future__ import annotations

import os
import sys
import time

from pocketmq.broker.store import commitlog, dispatch


def _pause(what: str) -> None:
    print(f"RECOVERY-PAUSED {what}", flush=True)
    time.sleep(120)


def _patch_cut() -> None:
    recover = commitlog.CommitLog.recover

    def paused(self, *args, **kwargs):
        outcome = recover(self, *args, **kwargs)
        _pause(f"after the commit log: {outcome}")
        return outcome

    commitlog.CommitLog.recover = paused


def _patch_reput() -> None:
    reput = dispatch.DispatchPart._reput
    done = []

    def paused(self):
        n = reput(self)
        if not done:                    # the first reput is recovery's; later ones are the put path's
            done.append(n)
            _pause(f"after recovery's reput of {n} units")
        return n

    dispatch.DispatchPart._reput = paused


{"cut": _patch_cut, "reput": _patch_reput}[os.environ.get("POCKETMQ_PAUSE_AT", "cut")]()

if __name__ == "__main__":
    from pocketmq.broker.__main__ import main
    sys.exit(main())
