"""Queue locks for orderly consumption (pure): LOCK_BATCH_MQ / UNLOCK_BATCH_MQ.

A queue is locked by (group, clientId); a lock expires `lock_max_live_ms`
(60 s) after its last refresh; the holder refreshes by locking again; an
expired lock can be taken by another client; unlock releases only the
caller's own locks (reference 4.5). When the connection a client locked over
closes, its locks are released at once (`unlock_client`), so the group's next
owner need not wait for the expiry (Java 4.9 has no such release: only the expiry).

Only the locks last taken or renewed over *that* connection: each entry remembers
the connection (an opaque `owner` token) of its last lock call. A client that
reconnected and renewed its locks on the new connection keeps them when the broker
notices the old one closing later (a half-open socket reaped at its idle timeout):
releasing them would let another client take a queue its holder is still consuming.
"""
from __future__ import annotations

LOCK_MAX_LIVE_MS = 60_000


class RebalanceLockManager:
    def __init__(self, lock_max_live_ms: int = LOCK_MAX_LIVE_MS):
        self.lock_max_live_ms = lock_max_live_ms
        self.table: dict[str, dict] = {}   # group -> mq -> [client_id, last_update_ms, owner]

    def _live(self, entry, now_ms: int) -> bool:
        return now_ms - entry[1] <= self.lock_max_live_ms

    def try_lock_batch(self, group: str, mqs, client_id: str, now_ms: int, owner=None) -> set:
        """Lock (or renew) what is free, expired or already `client_id`'s; `owner`: the
        connection the request came over (what `unlock_client` releases by)."""
        locks = self.table.setdefault(group, {})
        # Expired locks are dropped here, so the table only holds live ones.
        for mq in [mq for mq, e in locks.items() if not self._live(e, now_ms)]:
            del locks[mq]
        ok = set()
        for mq in mqs:
            e = locks.get(mq)
            if e is None or e[0] == client_id or not self._live(e, now_ms):
                locks[mq] = [client_id, now_ms, owner]
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

    def unlock_client(self, group: str, client_id: str, owner=None) -> list:
        """Release the queues of `group` that `client_id` last locked over the connection
        `owner` (it closed); owner None: all of the client's."""
        locks = self.table.get(group)
        if not locks:
            return []
        mine = [mq for mq, e in locks.items() if e[0] == client_id and (owner is None or e[2] is owner)]
        for mq in mine:
            del locks[mq]
        if not locks:
            del self.table[group]
        return mine

    def is_locked(self, group: str, mq, client_id: str, now_ms: int) -> bool:
        e = self.table.get(group, {}).get(mq)
        return e is not None and e[0] == client_id and self._live(e, now_ms)
