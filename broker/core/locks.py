"""Queue locks for orderly consumption (pure): LOCK_BATCH_MQ / UNLOCK_BATCH_MQ.

A queue is locked by (group, clientId); a lock expires `lock_max_live_ms`
(60 s) after its last refresh; the holder refreshes by locking again; an
expired lock can be taken by another client; unlock releases only the
caller's own locks (reference 4.5). When the connection a client locked over
closes, its locks are released at once (`unlock_client`), so the group's next
owner need not wait for the expiry.
"""
from __future__ import annotations

LOCK_MAX_LIVE_MS = 60_000


class RebalanceLockManager:
    def __init__(self, lock_max_live_ms: int = LOCK_MAX_LIVE_MS):
        self.lock_max_live_ms = lock_max_live_ms
        self.table: dict[str, dict] = {}   # group -> mq -> [client_id, last_update_ms]

    def _live(self, entry, now_ms: int) -> bool:
        return now_ms - entry[1] <= self.lock_max_live_ms

    def try_lock_batch(self, group: str, mqs, client_id: str, now_ms: int) -> set:
        locks = self.table.setdefault(group, {})
        # Expired locks are dropped here, so the table only holds live ones.
        for mq in [mq for mq, e in locks.items() if not self._live(e, now_ms)]:
            del locks[mq]
        ok = set()
        for mq in mqs:
            e = locks.get(mq)
            if e is None or e[0] == client_id or not self._live(e, now_ms):
                locks[mq] = [client_id, now_ms]
                ok.add(mq)
        return ok

    def unlock_batch(self, group: str, mqs, client_id: str) -> None:
        locks = self.table.get(group)
        if not locks:
            return
        for mq in mqs:
            e = locks.get(mq)
            if e is not None and e[0] == client_id:
                del locks[mq]

    def unlock_client(self, group: str, client_id: str) -> list:
        """Release every queue of `group` locked by `client_id` (its connection closed)."""
        locks = self.table.get(group)
        if not locks:
            return []
        mine = [mq for mq, e in locks.items() if e[0] == client_id]
        for mq in mine:
            del locks[mq]
        if not locks:
            del self.table[group]
        return mine

    def is_locked(self, group: str, mq, client_id: str, now_ms: int) -> bool:
        e = self.table.get(group, {}).get(mq)
        return e is not None and e[0] == client_id and self._live(e, now_ms)
