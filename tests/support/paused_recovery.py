"""`mqbroker` whose store recovery stops half-way, for the crash test's kill during recovery.

    python -m tests.support.paused_recovery <mqbroker arguments>

Runs the real broker with one change: right after the commit log's recovery returns (the
torn tail zeroed in the mapping, later segments deleted, nothing flushed, the consume
queues not yet cut or re-dispatched, the checkpoint not yet rewritten) it prints
`RECOVERY-PAUSED` and sleeps, so the test can SIGKILL it at exactly that point. Test
tooling only: it patches the class in this process and is never shipped.
"""
from __future__ import annotations

import sys
import time

from pocketmq.broker.store import commitlog

_recover = commitlog.CommitLog.recover


def _paused_recover(self, *args, **kwargs):
    outcome = _recover(self, *args, **kwargs)
    print(f"RECOVERY-PAUSED after the commit log: {outcome}", flush=True)
    time.sleep(120)
    return outcome


commitlog.CommitLog.recover = _paused_recover

if __name__ == "__main__":
    from pocketmq.broker.__main__ import main
    sys.exit(main())
