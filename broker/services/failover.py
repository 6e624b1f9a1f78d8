"""Automatic failover's agent: one per broker process in controller mode
(``enableControllerMode=true``), as RocketMQ 5's ReplicasManager, with etcd as the
controller (Patroni's shape: a leader key bound to a lease, state changed by CAS).

The agent owns the Broker (broker/app.py) and its role. It holds a lease in etcd
(controllerLeaseSeconds), publishes ``alive/{brokerId}`` under it (addresses, log end,
epoch) and every POLL_S reads the group's keys (broker/services/consensus.py):

* no state yet: the first replica to CAS-create it is master of epoch 1;
* the leader key holds our token: we are master of the state's epoch (restart the Broker
  as master if it is not: brokerId 0, the configured master role), and maintain the
  SyncStateSet (broker/core/failover.py SyncStateTracker; every change is a CAS guarded by
  our leader token, so a master that lost its lease cannot change it);
* another replica holds it: run as its slave (the HA stream's epoch handshake may call for
  a truncation: the Broker is stopped, the log cut with the store closed
  (store/recovery.py truncate_files), and started again);
* nobody holds it (the master's lease expired): the live members of the SyncStateSet
  (broker/core/failover.py candidates) race to CAS the next epoch in, the best ranked one
  first (others wait a second per rank). A candidate stops replicating first, so the end
  it claims as the new epoch's start is its log's end. The winner appends (epoch, end) to
  its epoch file and restarts as master.

Fencing: the lease's local deadline is the time a keepalive was SENT plus the TTL, minus
a margin; past it the master answers no send with SEND_OK (ControllerLink.fence, checked
before storing and again before answering) and does not register as brokerId 0. etcd
expires the lease no earlier than that, so by the time a new master can be elected the old
one has stopped acknowledging. The SyncStateSet adds the second guard: a SYNC_MASTER
acknowledges only what every (allAckInSyncStateSet) or one member holds, and only members
can be elected.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time

from pocketmq.broker.config import BrokerRole
from pocketmq.broker.core.failover import (
    AliveInfo,
    GroupState,
    StateError,
    SyncStateTracker,
    bootstrap,
    candidates,
    elected,
    with_sync_state_set,
)
from pocketmq.common import controller_keys
from pocketmq.broker.services.consensus import ConsensusError, EtcdConsensus, LeaseLost
from pocketmq.broker.store.epoch import EPOCH_FILE_NAME, read_epoch_file, write_epoch_file
from pocketmq.protocol.codes import ResponseCode
from pocketmq.remoting.tasks import cancel_and_wait

log = logging.getLogger("pocketmq.broker.failover")

POLL_S = 0.2
# a slave this close to the master's end joins the SyncStateSet's acks at once (sends then
# wait for it while it closes the gap); further behind it first catches up
JOIN_GAP_BYTES = 1 << 20
RANK_DELAY_S = 1.0
ALIVE_REFRESH_S = 1.0
# what is taken off the lease's TTL locally: etcd's and our clocks may run at slightly
# different rates, and etcd checks expiry every 500 ms (never earlier than the TTL)
LEASE_MARGIN = 0.8
SWITCHOVER = controller_keys.SWITCHOVER      # the planned switchover request
SWITCHOVER_WAIT_S = 10.0


def split_endpoints(value: str) -> list[str]:
    return [e.strip() for e in value.replace(",", ";").split(";") if e.strip()]


class ControllerLink:
    """What a Broker started by the agent needs of it (app.py, services/ha.py, send.py)."""

    def __init__(self, agent: "FailoverAgent", epoch: int, entries: list[tuple[int, int]],
                 tracker: SyncStateTracker | None) -> None:
        self.agent = agent
        self.replica_id = agent.replica_id
        self.epoch = epoch
        self.entries = entries
        self.tracker = tracker
        self.all_ack = agent.config.allAckInSyncStateSet
        self.min_in_sync = agent.config.minInSyncReplicas

    def fence(self) -> tuple[int, str] | None:
        """None, or why a send must not be acknowledged by this master now."""
        agent = self.agent
        if agent.handing_over is not None:
            return (ResponseCode.SERVICE_NOT_AVAILABLE,
                    f"broker {agent.group} replica {self.replica_id} is handing mastership to replica "
                    f"{agent.handing_over} (electMaster): send to the new master")
        if not agent.lease_valid() or agent.epoch != self.epoch or agent.role != "master":
            return (ResponseCode.SERVICE_NOT_AVAILABLE,
                    f"broker {agent.group} replica {self.replica_id} is not sure to be the master any more (its "
                    f"lease in the consensus store lapsed or a newer epoch exists): send to the new master")
        if self.tracker is not None and len(self.tracker.committed) < self.min_in_sync:
            return (ResponseCode.SYSTEM_ERROR,
                    f"in-sync replicas not enough: the SyncStateSet {sorted(self.tracker.committed)} has fewer than "
                    f"minInSyncReplicas={self.min_in_sync} members")
        return None

    def may_register(self) -> bool:
        return self.agent.lease_valid() and self.agent.epoch == self.epoch

    def on_sync_change(self) -> None:
        self.agent.kick()

    def on_stale(self, epoch: int) -> None:
        log.warning("a replica knows epoch %d, newer than this master's %d", epoch, self.epoch)
        self.agent.kick()

    def need_truncate(self, offset: int) -> None:
        self.agent.request_truncate(offset)

    def local_entries(self) -> list[tuple[int, int]]:
        return self.agent.read_entries()

    def adopt_entries(self, entries: list[tuple[int, int]]) -> None:
        self.agent.write_entries([tuple(e) for e in entries])


class FailoverAgent:
    """Runs a Broker in controller mode (start/close like a Broker: run_until_signal)."""

    def __init__(self, config, *, broker_factory, host: str = "0.0.0.0", config_path: str | None = None,
                 consensus=None, clock=time.time) -> None:
        self.config = config
        self.host = host
        self.config_path = config_path
        self.clock = clock
        self.replica_id = config.brokerId
        self.cluster = config.brokerClusterName
        self.group = config.brokerName
        self.ttl = config.controllerLeaseSeconds
        if consensus is None and config.controllerStore == "pysyncobj":    # the measurement backend
            from pocketmq.broker.services.consensus_pso import PsoConsensus
            consensus = PsoConsensus(split_endpoints(config.pysyncobjEndpoints or ""), timeout_s=max(0.3, self.ttl / 4))
        self.consensus = consensus or EtcdConsensus(split_endpoints(config.etcdEndpoints or ""),
                                                    timeout_s=max(0.3, self.ttl / 4))
        # the Broker class (broker/app.py, the composition root, injected: services never import it)
        self.broker_factory = broker_factory
        self.master_mode = config.brokerRole if config.brokerRole is not BrokerRole.SLAVE \
            else BrokerRole.ASYNC_MASTER
        self.app = None
        self.role: str | None = None        # "master" | "slave" | None (starting, or between roles)
        self.epoch = 0                      # the epoch the Broker runs in
        self.state: GroupState | None = None
        self.master_ha: str | None = None
        self.lease_id = 0
        self._deadline = 0.0                # monotonic: the lease is sure until then
        self._kick = asyncio.Event()
        self._truncate_at: int | None = None
        self._leaderless_since: float | None = None
        self._alive_sent: tuple | None = None
        self._alive_sent_at = 0.0
        self._ports: dict = {}
        self._tasks: list[asyncio.Task] = []
        self._last_logged: str | None = None
        self._closing = False
        self.handing_over: int | None = None     # a planned switchover's target (electMaster)
        self._deadline_timer: asyncio.TimerHandle | None = None
        # metrics / mqadmin
        self.elections_won = 0
        self.epoch_changes = 0
        self.last_election_ms = -1.0        # leader key seen missing -> we run as master
        self.role_changes = 0

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        # the store opens (recovery) as a slave that follows nobody yet: its end is then known,
        # and nothing is written until etcd says who the master is
        await self._start_app("slave", ControllerLink(self, 0, [], None), 0)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._keepalive_loop(), name="failover-lease"),
                       loop.create_task(self._run(), name="failover-agent")]

    async def close(self) -> None:
        self._closing = True
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        for t in self._tasks:
            try:
                await cancel_and_wait(t)
            except Exception:
                log.debug("failover task ended with an error at close", exc_info=True)
        self._tasks = []
        await self._stop_app()
        if self.lease_id:
            # a planned stop: the leader key goes with the lease, the group elects at once
            try:
                await self.consensus.revoke(self.lease_id)
            except ConsensusError as e:
                log.warning("could not revoke the lease at close (it expires in %d s): %s", self.ttl, e)
        await self.consensus.close()

    # -- the lease ---------------------------------------------------------------------------
    def lease_valid(self) -> bool:
        return self.lease_id != 0 and time.monotonic() < self._deadline

    async def _keepalive_loop(self) -> None:
        every = self.ttl / 4
        while True:
            t0 = time.monotonic()
            try:
                if not self.lease_id:
                    lease = await self.consensus.grant_lease(self.ttl)
                    self.lease_id = lease
                    self._alive_sent = None
                    self._deadline = t0 + self.ttl * LEASE_MARGIN
                    log.info("lease %x granted (%d s)", lease, self.ttl)
                    self.kick()
                else:
                    ttl = await self.consensus.keepalive(self.lease_id)
                    self._deadline = t0 + min(ttl, self.ttl) * LEASE_MARGIN
                self._arm_deadline()
            except LeaseLost:
                log.warning("lease %x lost (expired in the consensus store)", self.lease_id)
                self.lease_id = 0
                self._deadline = 0.0
                self.kick()
                continue
            except ConsensusError as e:
                self._say(f"consensus store unreachable: {e}", logging.WARNING)
            await asyncio.sleep(max(0.0, every - (time.monotonic() - t0)))

    def _arm_deadline(self) -> None:
        """At the lease's local deadline a master's waiting sends are answered (refused by
        the fence) at once: a cut-off master neither acknowledges nor keeps clients waiting."""
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        loop = asyncio.get_running_loop()
        self._deadline_timer = loop.call_at(loop.time() + max(0.0, self._deadline - time.monotonic()),
                                            self._on_deadline)

    def _on_deadline(self) -> None:
        self._deadline_timer = None
        if self.lease_valid():
            return
        app = self.app
        if app is not None and app.ha_master is not None and self.role == "master":
            log.warning("lease of replica %d (master of %s, epoch %d) lapsed: refusing sends until the group "
                        "decides", self.replica_id, self.group, self.epoch)
            app.ha_master.end_waits()
        self.kick()

    # -- the loop ----------------------------------------------------------------------------
    def kick(self) -> None:
        self._kick.set()

    def request_truncate(self, offset: int) -> None:
        self._truncate_at = offset
        self.kick()

    async def _run(self) -> None:
        while True:
            try:
                if self.lease_id:
                    snap = await self.consensus.read_group(self.cluster, self.group)
                    await self._step(snap)
            except ConsensusError as e:
                self._say(f"consensus store unreachable: {e}", logging.WARNING)
            except Exception:
                log.exception("failover agent step failed")
            self._kick.clear()
            try:
                async with asyncio.timeout(POLL_S):
                    await self._kick.wait()
            except TimeoutError:
                pass

    def _say(self, what: str, level: int = logging.INFO) -> None:
        if what != self._last_logged:
            log.log(level, "%s", what)
            self._last_logged = what

    def _token(self) -> bytes:
        return f"{self.replica_id}:{self.lease_id:x}".encode()

    async def _step(self, snap) -> None:
        try:
            state = GroupState.decode(snap.state) if snap.state is not None else None
        except StateError as e:
            self._say(f"group {self.group}: {e}; not acting on it", logging.ERROR)
            return
        alive = {}
        for rid, (value, _lease) in snap.alive.items():
            try:
                alive[rid] = AliveInfo.decode(value)
            except StateError:
                continue
        await self._publish_alive(snap)
        if self._truncate_at is not None:
            await self._truncate_and_follow(state, alive)
            return
        leader_id = _leader_id(snap.leader)
        if state is None:
            await self._bootstrap()
            return
        self.state = state
        if leader_id is not None:
            self._leaderless_since = None
        if snap.leader is not None and snap.leader == self._token() and state.master == self.replica_id:
            if self.role != "master" or self.epoch != state.epoch:
                await self._become_master(state, None)
            else:
                await self._master_duties(snap, state)
            return
        if leader_id is not None and leader_id != self.replica_id:
            info = alive.get(leader_id)
            if info is None:
                return
            if self.role != "slave" or self.epoch != state.epoch or self.master_ha != info.ha_addr:
                if self.role == "master":
                    log.warning("replica %d holds the leadership of %s (epoch %d): this broker steps down",
                                leader_id, self.group, state.epoch)
                await self._become_slave(state, info)
            return
        if leader_id is not None:
            return      # our id under an older lease: it expires; then we are a candidate
        await self._elect(snap, state, alive)

    async def _bootstrap(self) -> None:
        end = self._end()
        st = bootstrap(self.replica_id, end)
        if await self.consensus.cas_state(self.cluster, self.group, expect_state_rev=0, new_state=st.encode(),
                                          leader_absent=True, put_leader=(self._token(), self.lease_id)):
            log.info("group %s created: replica %d is master of epoch 1 (log end %d)", self.group,
                     self.replica_id, end)
            await self._become_master(st, None)

    async def _elect(self, snap, state: GroupState, alive: dict) -> None:
        now = time.monotonic()
        if self._leaderless_since is None:
            self._leaderless_since = now
            log.warning("group %s has no master (epoch %d's lease is gone); SyncStateSet %s, alive %s", self.group,
                        state.epoch, sorted(state.sync_state_set), sorted(alive))
        if self.role == "master":
            self.role = None        # fenced already (the lease); not a master until elected again
        order = candidates(state, alive, self.config.enableElectUncleanMaster)
        if self.replica_id not in order:
            if not order:
                self._say(f"group {self.group}: no live member of the SyncStateSet {sorted(state.sync_state_set)} "
                          f"(alive: {sorted(alive)}); staying without a master rather than electing a replica that "
                          f"may lack acknowledged messages (enableElectUncleanMaster=false)", logging.ERROR)
            return
        rank = order.index(self.replica_id)
        if rank and now - self._leaderless_since < rank * RANK_DELAY_S:
            return
        # stop copying from the old master: the end claimed below must stay the end
        if self.app is not None and self.app.ha_slave is not None:
            await self.app.ha_slave.close()
        end = self._end()
        new = elected(state, self.replica_id, end)
        won = await self.consensus.cas_state(self.cluster, self.group, expect_state_rev=snap.state_rev,
                                             new_state=new.encode(), leader_absent=True,
                                             put_leader=(self._token(), self.lease_id))
        if not won:
            if self.role == "slave":
                self.role = None      # its HA stream is stopped: restarted by the next step
            return
        took = (time.monotonic() - self._leaderless_since) * 1000
        self.elections_won += 1
        log.warning("replica %d elected master of %s, epoch %d, from log end %d (%.0f ms without a master)",
                    self.replica_id, self.group, new.epoch, end, took)
        await self._become_master(new, took)

    # -- roles ---------------------------------------------------------------------------------
    def _end(self) -> int:
        return self.app.store.commit_log_max_offset if self.app is not None and self.app.store is not None else 0

    @property
    def _epoch_path(self) -> str:
        return os.path.join(os.path.expanduser(self.config.storePathRootDir), EPOCH_FILE_NAME)

    def read_entries(self) -> list[tuple[int, int]]:
        return read_epoch_file(self._epoch_path)

    def write_entries(self, entries: list[tuple[int, int]]) -> None:
        if entries != self.read_entries():
            write_epoch_file(self._epoch_path, entries)

    async def _become_master(self, state: GroupState, took_ms: float | None) -> None:
        await self._stop_app()
        start = dict(state.history).get(state.epoch, 0)
        entries = [e for e in self.read_entries() if e[0] < state.epoch and e[1] <= start]
        if not entries and start > 0:
            entries = [(0, 0)]      # a log from before controller mode (failover.epoch_entries_for)
        entries.append((state.epoch, start))
        self.write_entries(entries)
        tracker = SyncStateTracker(self.replica_id, state.sync_state_set,
                                   max_not_catchup_ms=self.config.haMaxTimeSlaveNotCatchup)
        self.epoch_changes += state.epoch != self.epoch       # /metrics: epochs entered, as master or slave
        self.epoch = state.epoch
        self.state = state
        await self._start_app("master", ControllerLink(self, state.epoch, entries, tracker), state.epoch)
        if took_ms is not None:
            self.last_election_ms = took_ms + 0.0

    async def _become_slave(self, state: GroupState, info: AliveInfo) -> None:
        await self._stop_app()
        self.epoch_changes += state.epoch != self.epoch
        self.epoch = state.epoch
        self.master_ha = info.ha_addr
        await self._start_app("slave", ControllerLink(self, state.epoch, [], None), state.epoch,
                               master_ha=info.ha_addr)
        log.info("replica %d follows replica %d (%s) of %s, epoch %d", self.replica_id, info.replica_id,
                 info.ha_addr, self.group, state.epoch)

    async def _truncate_and_follow(self, state, alive) -> None:
        offset = self._truncate_at
        self._truncate_at = None
        await self._stop_app()
        from pocketmq.broker.store.recovery import truncate_files
        from pocketmq.broker.store.store_config import StoreConfig
        dropped = truncate_files(StoreConfig(**self.config.store_config_kwargs()), offset)
        log.warning("replica %d cut its log at %d (%d bytes its new master does not have) before following it",
                    self.replica_id, offset, dropped)
        await self._start_app("slave", ControllerLink(self, self.epoch, [], None), self.epoch,
                              master_ha=self.master_ha)

    async def _start_app(self, role: str, link, epoch: int, master_ha: str | None = None) -> None:
        cfg = self.config
        update = dict(self._ports)
        if role == "master":
            update.update(brokerId=0, brokerRole=self.master_mode, haMasterAddress=None)
        else:
            update.update(brokerId=self.replica_id, brokerRole=BrokerRole.SLAVE, haMasterAddress=master_ha)
        app = self.broker_factory(cfg.model_copy(update=update), host=self.host, config_path=self.config_path,
                                  link=link, clock=self.clock)
        try:
            await app.start()
        except BaseException:
            try:
                await app.close()
            except Exception:
                log.debug("close after a failed start failed", exc_info=True)
            raise
        self.app = app
        self.role = role
        self.role_changes += 1
        # the same ports after every restart: clients and replicas keep the addresses
        self._ports = {"listenPort": int(app.addr.rsplit(":", 1)[1]), "haListenPort": app.ha_port}
        self._alive_sent = None
        self.kick()

    async def _stop_app(self) -> None:
        app, self.app = self.app, None
        self.role = None
        if app is not None:
            app.unregister_on_close = self._closing
            await app.close()

    # -- the master's work ----------------------------------------------------------------------
    async def _master_duties(self, snap, state: GroupState) -> None:
        app = self.app
        if app is None or app.ha_master is None or not self.lease_valid():
            return
        link = app.link
        tracker = link.tracker
        end = app.store.commit_log_max_offset
        now_ms = int(time.monotonic() * 1000)
        req = snap.requests.get(SWITCHOVER)
        if req is not None:
            await self._switchover(snap, state, req)
            return
        proposal = tracker.proposal(end, now_ms, JOIN_GAP_BYTES)
        app.ha_master.sync_changed()        # joiners count at once
        if proposal is None or proposal == tracker.committed:
            return
        new = with_sync_state_set(state, proposal)
        if await self.consensus.cas_state(self.cluster, self.group, expect_state_rev=snap.state_rev,
                                          new_state=new.encode(), expect_leader=self._token()):
            log.info("SyncStateSet of %s: %s -> %s (epoch %d)", self.group, sorted(tracker.committed),
                     sorted(proposal), new.sync_state_set_epoch)
            tracker.committed_as(proposal)
            self.state = new
            app.ha_master.sync_changed()

    async def _switchover(self, snap, state: GroupState, req: bytes) -> None:
        """A planned switchover (mqadmin electMaster): stop acknowledging, let the target
        copy everything, then hand it the leader key (bound to its own lease) and the next
        epoch in one CAS. Refused (logged, request removed) when the target is not a live
        member of the SyncStateSet."""
        try:
            target = int(req)
        except ValueError:
            target = -1
        alive = snap.alive.get(target)
        app = self.app
        tracker = app.link.tracker
        member = tracker.members.get(target)
        if target == self.replica_id or target not in tracker.committed or alive is None or member is None \
                or not member.connected:
            log.warning("electMaster %r refused: replica %s is %s", req, target,
                        "already the master" if target == self.replica_id else
                        "not a live, connected member of the SyncStateSet " + str(sorted(tracker.committed)))
            await self.consensus.delete_request(self.cluster, self.group, SWITCHOVER)
            return
        self.handing_over = target
        try:
            deadline = time.monotonic() + SWITCHOVER_WAIT_S
            while time.monotonic() < deadline:
                end = app.store.commit_log_max_offset
                if member.ack >= end:
                    break
                await asyncio.sleep(0.01)
            else:
                log.warning("electMaster: replica %d did not catch up within %.0f s; refused", target,
                            SWITCHOVER_WAIT_S)
                await self.consensus.delete_request(self.cluster, self.group, SWITCHOVER)
                return
            new = elected(state, target, end)
            token = f"{target}:{alive[1]:x}".encode()
            try:
                handed = await self.consensus.cas_state(
                    self.cluster, self.group, expect_state_rev=snap.state_rev, new_state=new.encode(),
                    expect_leader=self._token(), put_leader=(token, alive[1]), delete_requests=(SWITCHOVER,))
            except LeaseLost:
                # the TARGET's lease went while it caught up (ours is checked by expect_leader)
                log.warning("electMaster: replica %d's lease expired during the handover; refused", target)
                await self.consensus.delete_request(self.cluster, self.group, SWITCHOVER)
                handed = False
            if handed:
                log.warning("mastership of %s handed to replica %d (epoch %d, from %d)", self.group, target,
                            new.epoch, end)
                self.role = None
        finally:
            self.handing_over = None
        self.kick()

    async def _publish_alive(self, snap) -> None:
        app = self.app
        if app is None or not self.lease_id:
            return
        cfg = self.config
        ha = cfg.haAdvertisedAddress or f"{cfg.brokerIP2 or cfg.brokerIP1}:{app.ha_port}"
        entries = self.read_entries()
        info = AliveInfo(self.replica_id, app.addr, ha, self._end(), entries[-1][0] if entries else 0)
        key = (info.addr, info.ha_addr, info.epoch)
        now = time.monotonic()
        mine = snap.alive.get(self.replica_id)
        if mine is not None and mine[1] == self.lease_id and key == self._alive_sent \
                and now - self._alive_sent_at < ALIVE_REFRESH_S:
            return
        await self.consensus.put_alive(self.cluster, self.group, self.replica_id, info.encode(), self.lease_id)
        self._alive_sent = key
        self._alive_sent_at = now

    # -- for mqadmin and /metrics ---------------------------------------------------------------
    def status(self) -> dict:
        st = self.state
        return {"replicaId": self.replica_id, "role": self.role or "none", "epoch": self.epoch,
                "leaseValid": self.lease_valid(),
                "syncStateSet": sorted(st.sync_state_set) if st else [],
                "syncStateSetEpoch": st.sync_state_set_epoch if st else 0,
                "masterId": st.master if st else -1,
                "electionsWon": self.elections_won, "lastElectionMillis": self.last_election_ms}


def _leader_id(value: bytes | None) -> int | None:
    if not value:
        return None
    try:
        return int(value.split(b":", 1)[0])
    except ValueError:
        return None
