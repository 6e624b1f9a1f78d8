"""Replication's metadata over remoting: the shell over broker/core/metadata_sync.py.

`SlaveSyncService` (a slave): first `first_delay_ms` (3 s) after start, then every
`period_ms` (10 s, `slaveSyncIntervalMillis`), while it knows its master's address (the
nameservers' REGISTER_BROKER answers: `Broker.master_addr`), asks the master for its
topics (GET_ALL_TOPIC_CONFIG), subscription groups (GET_ALL_SUBSCRIPTIONGROUP_CONFIG),
consumer offsets (GET_ALL_CONSUMER_OFFSET) and delay offsets (GET_ALL_DELAY_OFFSET), at
once, each bounded by `timeout_s` (3 s, as Java's BrokerOuterAPI), applies what came back
(the core's rules) and persists what changed. What fails is logged through `SyncLog`
(the first failure, changes, a reminder every 10 min, the recovery) and changes nothing.

`take_back_offsets` (a master starting, before it serves): asks the nameservers for its
group's members (GET_BROKER_CLUSTER_INFO), every listed slave for its consumer offsets,
and keeps per queue the larger offset (`metadata_sync.take_back`), all within
TAKE_BACK_TIMEOUT_S; one line says what it took back. Without a slave that answers it
changes nothing.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from pocketmq.broker.core.delay import ScheduleCursors
from pocketmq.broker.core.metadata_sync import (SyncLog, adopt_groups, adopt_offsets, adopt_topics, group_slaves,
                                                take_back)
from pocketmq.broker.core.offsets import ConsumerOffsetManager
from pocketmq.broker.core.subscription_groups import SubscriptionGroupManager
from pocketmq.broker.core.topics import TopicConfigManager
from pocketmq.protocol.acl import sign_request
from pocketmq.protocol.bodies import decode_consumer_offset_wrapper
from pocketmq.protocol.codes import RequestCode, ResponseCode
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.client import RemotingClient, split_addr_list
from pocketmq.remoting.clock import monotonic_ms
from pocketmq.remoting.tasks import cancel_and_wait

log = logging.getLogger("pocketmq.broker.slave_sync")

FIRST_DELAY_MS = 3000
PERIOD_MS = 10_000
REQUEST_TIMEOUT_S = 3.0
# A returning master waits at most this long for its slaves' offsets before serving.
TAKE_BACK_TIMEOUT_S = 3.0


class Refused(Exception):
    """The peer answered, but not SUCCESS."""


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


# The broker's own (accessKey, secretKey), or None: its requests to peers go signed when set.
Credentials = tuple[str, str] | None


def _request(code: int, credentials: Credentials) -> RemotingCommand:
    """A body-less request, signed with `credentials` when given (a master or slave whose
    broker runs aclEnable refuses unsigned ones; these codes need any valid account)."""
    if not credentials or not credentials[0]:
        return RemotingCommand(code)
    return RemotingCommand(code, ext_fields=sign_request({}, b"", credentials[0], credentials[1]))


async def _ask(client, addr: str, code: int, timeout_s: float, credentials: Credentials = None) -> bytes:
    resp = await client.invoke(addr, _request(code, credentials), timeout_s)
    if resp.code != ResponseCode.SUCCESS:
        raise Refused(f"code {resp.code} ({resp.remark})")
    return resp.body_bytes() or b""


class SlaveSyncService:
    """A slave's copy of its master's topics, groups and offsets (module docstring)."""

    def __init__(self, *, master_addr: Callable[[], str | None], own_addr: str, topics: TopicConfigManager,
                 groups: SubscriptionGroupManager, offsets: ConsumerOffsetManager, cursors: ScheduleCursors,
                 persist: Callable[..., Awaitable[None]], period_ms: int = PERIOD_MS,
                 first_delay_ms: int = FIRST_DELAY_MS, timeout_s: float = REQUEST_TIMEOUT_S,
                 client=None, mono_ms: Callable[[], int] = monotonic_ms,
                 delete_queues: Callable[[set[str]], object] | None = None,
                 credentials: Credentials = None) -> None:
        self.master_addr = master_addr
        # (accessKey, secretKey) the requests to the master are signed with (its ACL)
        self.credentials = credentials
        # the store's delete_topics: the consume queues of topics the master deleted go too,
        # so a topic created again there starts its queues afresh here as on the master
        self.delete_queues = delete_queues
        self.own_addr = own_addr
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.cursors = cursors
        # persist(topics=...): writes topics.json when asked, and every table marked dirty
        self.persist = persist
        self.period_s = max(0.01, period_ms / 1000)
        self.first_delay_s = max(0.0, first_delay_ms / 1000)
        self.timeout_s = timeout_s
        self._own_client = client is None
        self.client = client if client is not None else RemotingClient(connect_timeout_s=timeout_s)
        self.mono_ms = mono_ms
        self.sync_log = SyncLog("metadata sync of slave")
        self.rounds = 0            # rounds ended
        self._started = 0          # rounds started
        self.last_failures: dict[str, str] = {}
        self._round_end = asyncio.Condition()
        self._task: asyncio.Task | None = None
        self._appliers = (("topics", RequestCode.GET_ALL_TOPIC_CONFIG, self._topics),
                          ("groups", RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, self._groups),
                          ("consumer offsets", RequestCode.GET_ALL_CONSUMER_OFFSET, self._offsets),
                          ("delay offsets", RequestCode.GET_ALL_DELAY_OFFSET, self.cursors.adopt))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="slave-sync")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._own_client:
            await self.client.close()

    async def synced(self) -> None:
        """Return once a round that started after this call has ended."""
        target = self._started + 1
        async with self._round_end:
            await self._round_end.wait_for(lambda: self.rounds >= target)

    async def _run(self) -> None:
        await asyncio.sleep(self.first_delay_s)
        while True:
            try:
                await self.sync_once()
            except Exception:   # a bug: the next round tries again
                log.exception("metadata sync round failed")
            await asyncio.sleep(self.period_s)

    async def sync_once(self) -> dict[str, str]:
        """One round; returns what failed ({item: reason}, empty when all went well or
        there is no master to follow yet)."""
        self._started += 1
        try:
            failures = await self._round()
            self.last_failures = failures
            return failures
        finally:
            self.rounds += 1
            async with self._round_end:
                self._round_end.notify_all()

    async def _round(self) -> dict[str, str]:
        addr = self.master_addr()
        if not addr or addr == self.own_addr:
            return {}
        answers = await asyncio.gather(*(_ask(self.client, addr, code, self.timeout_s, self.credentials)
                                         for _, code, _ in self._appliers), return_exceptions=True)
        failures: dict[str, str] = {}
        changed: list[str] = []
        # applied together, with no await between: a request sees all of a round or none of it
        for (item, _, apply), answer in zip(self._appliers, answers):
            if isinstance(answer, asyncio.CancelledError):
                raise answer
            if isinstance(answer, BaseException):
                failures[item] = _reason(answer)
                continue
            try:
                if apply(answer):
                    changed.append(item)
            except Exception as e:   # BodyError: the table is as it was
                failures[item] = _reason(e)
        if changed:
            replaced = [c for c in changed if c in ("topics", "groups")]
            log.log(logging.INFO if replaced else logging.DEBUG, "slave copied from master %s: %s%s", addr,
                    ", ".join(changed),
                    f" (topics dataVersion {self.topics.data_version.to_json()})" if "topics" in replaced else "")
            try:
                await self.persist(topics="topics" in changed)
            except Exception as e:
                failures["persist"] = _reason(e)
        line = self.sync_log.round(addr, failures, self.mono_ms())
        if line is not None:
            log.log(*line)
        return failures

    def _topics(self, body) -> bool:
        before = set(self.topics.topics)
        changed = adopt_topics(self.topics, body)
        dropped = before - set(self.topics.topics)
        if dropped and self.delete_queues is not None:
            log.info("topics deleted on the master, their queues here too: %s", ", ".join(sorted(dropped)))
            self.delete_queues(dropped)
        return changed

    def _groups(self, body) -> bool:
        return adopt_groups(self.groups, body)

    def _offsets(self, body) -> bool:
        return adopt_offsets(self.offsets, body) > 0


async def _ask_all(client, addrs: list[str], code: int, deadline: float,
                   credentials: Credentials = None) -> dict[str, bytes | str]:
    """Ask every address at once; what each answered by `deadline` (loop time): the body,
    or the reason it did not."""
    loop = asyncio.get_running_loop()
    tasks = {addr: loop.create_task(_ask(client, addr, code, max(0.001, deadline - loop.time()), credentials))
             for addr in addrs}
    if tasks:
        await asyncio.wait(tasks.values(), timeout=max(0.0, deadline - loop.time()))
    out: dict[str, bytes | str] = {}
    for addr, task in tasks.items():
        if not task.done():
            task.cancel()
            out[addr] = "no answer in time"
        elif task.cancelled():
            out[addr] = "cancelled"
        elif task.exception() is not None:
            out[addr] = _reason(task.exception())
        else:
            out[addr] = task.result()
    pending = [t for t in tasks.values() if not t.done()]
    if pending:
        await asyncio.wait(pending)
    return out


async def take_back_offsets(namesrv_addr: str, broker_name: str, own_addr: str, offsets: ConsumerOffsetManager, *,
                            timeout_s: float = TAKE_BACK_TIMEOUT_S, client=None,
                            credentials: Credentials = None) -> int:
    """A master starting: merge its slaves' newer consumer offsets into `offsets` (module
    docstring); returns how many queues moved. Bounded by `timeout_s` as a whole; never
    raises for a peer that fails. `credentials` sign the requests (the nameservers' cluster
    info and the slaves' offsets) for peers running ACL."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    own_client = client is None
    if own_client:
        client = RemotingClient(connect_timeout_s=timeout_s)
    try:
        infos = await _ask_all(client, split_addr_list(namesrv_addr), RequestCode.GET_BROKER_CLUSTER_INFO, deadline,
                               credentials)
        slaves: list[str] = []
        for ns, info in infos.items():
            if isinstance(info, str):
                continue
            try:
                slaves += [s for s in group_slaves(info, broker_name, own_addr) if s not in slaves]
            except Exception as e:
                infos[ns] = _reason(e)
        if not slaves:
            asked = "; ".join(f"{ns}: {v}" for ns, v in infos.items() if isinstance(v, str))
            # the usual case (no slaves) is not worth a line; a nameserver that failed is
            log.log(logging.INFO if asked else logging.DEBUG, "offsets of %s: no slave to take newer offsets "
                    "back from%s", broker_name, f" (nameservers: {asked})" if asked else "")
            return 0
        answers = await _ask_all(client, slaves, RequestCode.GET_ALL_CONSUMER_OFFSET, deadline, credentials)
        moved: set[tuple[str, int]] = set()
        took: list[str] = []
        failed: list[str] = []
        for slave, answer in answers.items():
            if isinstance(answer, str):
                failed.append(f"{slave}: {answer}")
                continue
            try:
                table = decode_consumer_offset_wrapper(answer)
            except Exception as e:
                failed.append(f"{slave}: {_reason(e)}")
                continue
            moved |= take_back(offsets, table)
            took.append(slave)
        if took:
            keys = len({key for key, _ in moved})
            log.info("offsets of %s taken back from slave(s) %s: %d queue offset(s) of %d topic@group moved "
                     "forward (committed there while this master was away)%s", broker_name, ", ".join(took),
                     len(moved), keys, f"; no answer from {'; '.join(failed)}" if failed else "")
        else:
            log.info("offsets of %s: no slave answered (%s); starting with this master's own offsets",
                     broker_name, "; ".join(failed))
        return len(moved)
    finally:
        if own_client:
            await client.close()
