"""The consensus clients against real stores, one contract for both: etcd
(broker/services/consensus.py EtcdConsensus, tests/support/etcd.py) and the pysyncobj
measurement backend (broker/services/consensus_pso.py PsoConsensus, members of
tests/support/pso_store.py; skipped when pysyncobj is not installed). Leases, the state's
CAS and its guards, the group read, timeouts on a paused store and the endpoint rotation
in a 3-member cluster with one member dead. Each test has its own key prefix; every wait
is bounded."""
import asyncio
import time
import uuid

import pytest

from pocketmq.broker.services.consensus import ConsensusError, EtcdConsensus, GroupSnapshot, LeaseLost
from pocketmq.broker.services.consensus_pso import PsoConsensus
from tests.support.etcd import SKIP_REASON, EtcdCluster, EtcdServer, etcd_available
from tests.support.pso_store import SKIP_REASON as PSO_SKIP_REASON
from tests.support.pso_store import PsoCluster, pysyncobj_available

C, G = "DefaultCluster", "broker-a"


class Store:
    """One kind of store: its processes and its client."""

    def __init__(self, kind: str):
        self.kind = kind

    def single(self, root: str):
        """One member, not started (start/stop, pause/resume, kill, endpoint)."""
        return EtcdServer(root) if self.kind == "etcd" else PsoCluster(1, root)

    def cluster(self, n: int, root: str):
        return EtcdCluster(n, root) if self.kind == "etcd" else PsoCluster(n, root)

    def client(self, endpoints, timeout_s: float = 1.0, prefix: str | None = None):
        cls = EtcdConsensus if self.kind == "etcd" else PsoConsensus
        return cls(endpoints, prefix=prefix or f"/t-{uuid.uuid4().hex[:8]}", timeout_s=timeout_s)


@pytest.fixture(scope="module", params=[
    pytest.param("etcd", marks=pytest.mark.skipif(not etcd_available(), reason=SKIP_REASON)),
    pytest.param("pysyncobj", marks=pytest.mark.skipif(not pysyncobj_available(), reason=PSO_SKIP_REASON))])
def store(request):
    return Store(request.param)


@pytest.fixture(scope="module")
def etcd(store, tmp_path_factory):
    """The module's shared one-member store (etcd or pysyncobj)."""
    with store.single(str(tmp_path_factory.mktemp(store.kind))) as server:
        yield server


@pytest.fixture
def own_etcd(store, tmp_path):
    with store.single(str(tmp_path)) as server:
        yield server


@pytest.fixture
async def cs(store, etcd):
    c = store.client([etcd.endpoint])
    yield c
    await c.close()


async def until(what: str, check, limit_s: float = 5.0):
    """Poll the async `check` until it returns something true; its value."""
    deadline = time.monotonic() + limit_s
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {limit_s} s"
        await asyncio.sleep(0.05)


async def test_lease_lives_while_kept_alive_then_expires_with_its_keys(cs):
    async with asyncio.timeout(10):
        lease = await cs.grant_lease(1)
        await cs.put_alive(C, G, 1, b"r1", lease)
        for _ in range(5):      # 1.5 s: past the TTL, kept alive
            assert await cs.keepalive(lease) == 1
            await asyncio.sleep(0.3)
        assert (await cs.read_group(C, G)).alive == {1: (b"r1", lease)}
        t0 = time.monotonic()
        await until("the alive key's expiry", lambda: _alive_empty(cs))
        assert time.monotonic() - t0 < 3.0
        with pytest.raises(LeaseLost):
            await cs.keepalive(lease)
        with pytest.raises(LeaseLost):
            await cs.put_alive(C, G, 1, b"r1", lease)
        await cs.revoke(lease)      # gone already: not an error


async def _alive_empty(cs) -> bool:
    return not (await cs.read_group(C, G)).alive


async def test_revoke_deletes_the_leases_keys_at_once(cs):
    async with asyncio.timeout(10):
        lease = await cs.grant_lease(30)
        await cs.put_alive(C, G, 2, b"x", lease)
        await cs.revoke(lease)
        assert (await cs.read_group(C, G)).alive == {}
        with pytest.raises(LeaseLost):
            await cs.keepalive(lease)


async def test_create_if_absent_has_exactly_one_winner(store, etcd):
    async with asyncio.timeout(10):
        callers = [store.client([etcd.endpoint]) for _ in range(4)]
        for c in callers[1:]:
            c.prefix = callers[0].prefix
        try:
            for round_ in range(5):
                group = f"g{round_}"
                won = await asyncio.gather(*(c.cas_state(C, group, expect_state_rev=0, new_state=f"s{i}".encode())
                                             for i, c in enumerate(callers)))
                assert won.count(True) == 1, won
                snap = await callers[0].read_group(C, group)
                assert snap.state == f"s{won.index(True)}".encode()
                # and never again, whoever tries
                assert not await callers[1].cas_state(C, group, expect_state_rev=0, new_state=b"late")
        finally:
            for c in callers:
                await c.close()


async def test_a_stale_state_revision_loses(cs):
    async with asyncio.timeout(10):
        assert await cs.cas_state(C, G, expect_state_rev=0, new_state=b"e1")
        first = (await cs.read_group(C, G)).state_rev
        assert first > 0
        assert await cs.cas_state(C, G, expect_state_rev=first, new_state=b"e2")
        assert not await cs.cas_state(C, G, expect_state_rev=first, new_state=b"e3")     # read before e2
        snap = await cs.read_group(C, G)
        assert (snap.state, snap.state_rev > first) == (b"e2", True)
        assert await cs.cas_state(C, G, expect_state_rev=snap.state_rev, new_state=b"e3")
        assert (await cs.read_group(C, G)).state == b"e3"


async def test_leader_absent_holds_while_the_leaders_lease_lives(cs):
    async with asyncio.timeout(10):
        old = await cs.grant_lease(1)
        assert await cs.cas_state(C, G, expect_state_rev=0, new_state=b"epoch1", leader_absent=True,
                                  put_leader=(b"1:old", old))
        snap = await cs.read_group(C, G)
        assert (snap.leader, snap.leader_lease) == (b"1:old", old)
        new = await cs.grant_lease(30)
        for _ in range(4):
            await cs.keepalive(old)
            assert not await cs.cas_state(C, G, expect_state_rev=snap.state_rev, new_state=b"epoch2",
                                          leader_absent=True, put_leader=(b"2:new", new))
            await asyncio.sleep(0.3)
        # the old master stops: its leader key goes with its lease
        await until("the leader key's expiry", lambda: _leaderless(cs))
        after = await cs.read_group(C, G)
        assert after.state_rev == snap.state_rev          # the state itself untouched
        assert await cs.cas_state(C, G, expect_state_rev=after.state_rev, new_state=b"epoch2",
                                  leader_absent=True, put_leader=(b"2:new", new))
        final = await cs.read_group(C, G)
        assert (final.state, final.leader, final.leader_lease) == (b"epoch2", b"2:new", new)
        await cs.revoke(new)
        assert (await cs.read_group(C, G)).leader is None


async def _leaderless(cs) -> bool:
    return (await cs.read_group(C, G)).leader is None


async def test_put_leader_with_a_dead_lease_is_lease_lost(cs):
    async with asyncio.timeout(10):
        lease = await cs.grant_lease(30)
        await cs.revoke(lease)
        with pytest.raises(LeaseLost):
            await cs.cas_state(C, G, expect_state_rev=0, new_state=b"s", put_leader=(b"1:x", lease))
        assert (await cs.read_group(C, G)).state is None


async def test_expect_leader_guard(cs):
    async with asyncio.timeout(10):
        # no leader key: a value compare on an absent key fails
        assert not await cs.cas_state(C, G, expect_state_rev=0, new_state=b"s", expect_leader=b"1:a")
        lease = await cs.grant_lease(30)
        assert await cs.cas_state(C, G, expect_state_rev=0, new_state=b"s0", put_leader=(b"1:a", lease))
        rev = (await cs.read_group(C, G)).state_rev
        assert not await cs.cas_state(C, G, expect_state_rev=rev, new_state=b"s1", expect_leader=b"2:b")
        assert await cs.cas_state(C, G, expect_state_rev=rev, new_state=b"s1", expect_leader=b"1:a")
        snap = await cs.read_group(C, G)
        assert (snap.state, snap.leader, snap.leader_lease) == (b"s1", b"1:a", lease)   # leader kept
        await cs.revoke(lease)


async def test_request_keys_go_in_the_same_transaction(cs):
    async with asyncio.timeout(10):
        assert await cs.cas_state(C, G, expect_state_rev=0, new_state=b"s0")
        await cs.put_request(C, G, "switchover", b"2")
        await cs.put_request(C, G, "other", b"x")
        snap = await cs.read_group(C, G)
        assert snap.requests == {"switchover": b"2", "other": b"x"}
        # a failed CAS deletes nothing
        assert not await cs.cas_state(C, G, expect_state_rev=snap.state_rev + 100, new_state=b"s1",
                                      delete_requests=("switchover",))
        assert (await cs.read_group(C, G)).requests == {"switchover": b"2", "other": b"x"}
        # named twice and one that does not exist: still one valid transaction
        assert await cs.cas_state(C, G, expect_state_rev=snap.state_rev, new_state=b"s1",
                                  delete_requests=("switchover", "switchover", "absent"))
        after = await cs.read_group(C, G)
        assert (after.state, after.requests) == (b"s1", {"other": b"x"})
        await cs.delete_request(C, G, "other")
        await cs.delete_request(C, G, "other")      # absent: fine
        assert (await cs.read_group(C, G)).requests == {}


async def test_read_group_fields(cs):
    async with asyncio.timeout(10):
        empty = await cs.read_group(C, G)
        assert empty == GroupSnapshot(empty.revision, None, 0, None, 0, {}, {})
        assert empty.revision > 0
        a, b = await cs.grant_lease(30), await cs.grant_lease(30)
        await cs.put_alive(C, G, 0, b'{"addr": "m"}', a)
        await cs.put_alive(C, G, 12, b'{"addr": "s"}', b)
        assert await cs.cas_state(C, G, expect_state_rev=0, new_state=b"st", put_leader=(b"0:a", a))
        await cs.put_request(C, G, "switchover", b"12")
        # another group's keys (a name that shares a prefix) are not this group's
        await cs.put_alive(C, G + "x", 5, b"other", b)
        snap = await cs.read_group(C, G)
        assert snap.state == b"st" and snap.state_rev > 0 and snap.revision >= snap.state_rev
        assert (snap.leader, snap.leader_lease) == (b"0:a", a)
        assert snap.alive == {0: (b'{"addr": "m"}', a), 12: (b'{"addr": "s"}', b)}
        assert snap.requests == {"switchover": b"12"}
        with pytest.raises(ValueError):
            await cs.read_group(C, "a/b")
        await cs.revoke(a)
        await cs.revoke(b)


async def test_list_groups(cs):
    async with asyncio.timeout(10):
        assert await cs.list_groups() == []
        for cluster, group in [("c1", "b"), ("c1", "a"), ("c2", "a")]:
            assert await cs.cas_state(cluster, group, expect_state_rev=0, new_state=b"s")
        lease = await cs.grant_lease(30)
        await cs.put_alive("c1", "no-state", 1, b"x", lease)       # alive only: not a group yet
        await cs.put_request("c3", "g", "switchover", b"1")
        assert await cs.list_groups() == [("c1", "a"), ("c1", "b"), ("c2", "a")]
        assert await cs.list_groups("c1") == [("c1", "a"), ("c1", "b")]
        assert await cs.list_groups("c") == []
        await cs.revoke(lease)


async def test_a_paused_etcd_times_out_within_the_bound_and_serves_again_after(store, own_etcd):
    async with asyncio.timeout(15):
        cs = store.client([own_etcd.endpoint], timeout_s=0.5)
        fresh = store.client([own_etcd.endpoint], timeout_s=0.5)
        try:
            lease = await cs.grant_lease(30)
            assert await cs.cas_state(C, G, expect_state_rev=0, new_state=b"s")
            own_etcd.pause()
            try:
                for call in (lambda c: c.read_group(C, G), lambda c: c.keepalive(lease),
                             lambda c: c.cas_state(C, G, expect_state_rev=1, new_state=b"x")):
                    t0 = time.monotonic()
                    with pytest.raises(ConsensusError) as e:
                        await call(cs)
                    took = time.monotonic() - t0
                    assert took < 1.0, took
                    assert not isinstance(e.value, LeaseLost)
                    assert own_etcd.endpoint in str(e.value), e.value
                t0 = time.monotonic()
                with pytest.raises(ConsensusError):      # no connection yet: the connect hangs as well
                    await fresh.list_groups()
                assert time.monotonic() - t0 < 1.0
            finally:
                own_etcd.resume()
            assert (await cs.read_group(C, G)).state == b"s"
            assert await cs.keepalive(lease) > 0
            assert await fresh.list_groups() == []
        finally:
            await cs.close()
            await fresh.close()


async def test_nothing_listening_is_a_consensus_error_naming_the_endpoint_and_a_return_is_seen_at_once(
        store, own_etcd):
    async with asyncio.timeout(15):
        endpoint = own_etcd.endpoint
        cs = store.client([endpoint], timeout_s=0.5)
        try:
            assert await cs.cas_state(C, G, expect_state_rev=0, new_state=b"s")
            own_etcd.kill()
            for _ in range(3):
                with pytest.raises(ConsensusError) as e:
                    await cs.grant_lease(5)
                assert endpoint in str(e.value)
            # back on the same port: the next call gets through (no reconnect backoff inherited
            # from the dead connection)
            await asyncio.to_thread(own_etcd.start)
            assert (await cs.read_group(C, G)).state == b"s"
        finally:
            await cs.close()


async def test_a_dead_member_costs_one_failed_call_then_the_next_endpoint_serves(store, tmp_path):
    async with asyncio.timeout(25):
        cluster = await asyncio.to_thread(lambda: store.cluster(3, str(tmp_path)).start())
        cs = store.client(cluster.endpoints, timeout_s=1.0)
        try:
            lease = await cs.grant_lease(30)
            assert await cs.cas_state(C, G, expect_state_rev=0, new_state=b"s0", put_leader=(b"0:a", lease))
            for round_ in range(2):
                dead = cluster.endpoints.index(cs.endpoint())       # the member the next call goes to
                await asyncio.to_thread(cluster.kill, dead)
                errors: list[str] = []

                async def served():
                    try:
                        snap = await cs.read_group(C, G)
                    except ConsensusError as e:
                        errors.append(str(e))
                        return None
                    return snap

                snap = await until(f"a read with member {dead} dead", served, limit_s=8.0)
                assert (snap.state, snap.leader) == (f"s{round_}".encode(), b"0:a")
                assert errors and cluster.endpoints[dead] in errors[0], errors
                assert cs.endpoint() != cluster.endpoints[dead]
                # the dead one; when it led, the live members may fail mid-election ("leader
                # changed", a timeout), and on a slow host the rotation may come round to the
                # dead one once more before the election ends: nothing else
                at_dead = [e for e in errors if cluster.endpoints[dead] in e]
                others = [e for e in errors if cluster.endpoints[dead] not in e]
                assert len(at_dead) <= 2 and len(others) <= 2 * (len(cluster.endpoints) - 1), "\n".join(errors)
                election = ("leader changed", "timed out", "no leader")
                assert all(any(w in e.lower().replace("_", " ") for w in election) for e in others), \
                    "\n".join(errors)
                assert len(at_dead) == 1 or others, "\n".join(errors)
                assert await cs.keepalive(lease) > 0
                assert await cs.cas_state(C, G, expect_state_rev=snap.state_rev,
                                          new_state=f"s{round_ + 1}".encode(), expect_leader=b"0:a")
                await asyncio.to_thread(cluster.restart, dead)
            # all three members back: the one in use keeps serving
            for _ in range(3):
                assert (await cs.read_group(C, G)).state == b"s2"
        finally:
            await cs.close()
            await asyncio.to_thread(cluster.stop)
