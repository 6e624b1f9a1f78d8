"""ali-ons (npm, the Node.js RocketMQ 4.x client, pinned in tests/interop/node/package.json and
package-lock.json) against pocketmq's replication: the dead-master scenario of
tests/interop/replication_support.py with its push consumer (node/ons_agent.js), brokers and
nameserver as real processes. Figures and advice: docs/replication.md.

ali-ons is installed by this module (`npm ci` into tests/interop/node/node_modules, ignored by
git) once per session when missing, within INSTALL_TIMEOUT_S; a failed install fails the
tests. Without `node` on PATH the module is skipped, except in CI (CI set), where that is an
error.

Its producer (Producer#send) against a SYNC_MASTER's SLAVE_NOT_AVAILABLE (11) and
FLUSH_SLAVE_TIMEOUT (12) does what Java's does (retryAnotherBrokerWhenNotStoreOK false): it
returns the status, one copy stored, no retry; with a second broker name it returns whatever
the broker it picked answered.

What ali-ons 3.12 does, read from its source (lib/mq_client.js, lib/consumer/mq_push_consumer.js,
lib/store/remote_broker.js) and pinned here:
* it pulls from the broker id the last pull suggested, else any member of the group
  (findBrokerAddressInSubscribe), so once its route (refreshed every pollNameServerInteval,
  30 s by default, from its start) no longer lists the master it pulls from the slave; a pull
  that fails is retried after pullTimeDelayMillsWhenException (3 s);
* it commits offsets every 5 s (oneway) to the master, else the first slave listed
  (findBrokerAddressInAdmin);
* its periodic commit sends -1 for a queue whose offset is 0 (`offsetTable.get(key) || -1`),
  e.g. its %RETRY% queue when nothing was retried. pocketmq's brokers store that -1 (as Java's
  do), and the decoder of GET_ALL_CONSUMER_OFFSET bodies reads such an entry as "no offset"
  (it used to refuse the whole table, so a restarted master took nothing back).
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
import subprocess

import pytest

from tests.interop.replication_support import (
    ONS_AGENT,
    ONE,
    SLAVE_TIMEOUT_MS,
    TWO,
    OnsClient,
    counts,
    dead_master_run,
    dump,
    log_lines,
    msgs,
    stored,
    where,
)
# the fixtures brokers, no_slave, stalled_slave
from tests.interop.replication_support import brokers_fixture, no_slave_fixture, stalled_slave_fixture  # noqa: F401

pytestmark = [pytest.mark.interop, pytest.mark.slow]

NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node")
ALI_ONS_VERSION = "3.12.0"
INSTALL_TIMEOUT_S = 240
# ali-ons' route refresh (default 30 s), rebalance (10 s) and offset commit (5 s) periods,
# shortened to keep the test short: what is pinned is "within one route refresh plus one pull
# retry delay (3 s, its default)"; docs/replication.md has the figures with the defaults
POLL_MS, REBALANCE_MS, PERSIST_MS = 3000, 1000, 1000
PULL_RETRY_S = 3.0


def _installed_version() -> str | None:
    try:
        with open(os.path.join(NODE_DIR, "node_modules", "ali-ons", "package.json")) as f:
            return json.load(f).get("version")
    except (OSError, ValueError):
        return None


def ensure_ali_ons() -> None:
    """`npm ci` in tests/interop/node unless ali-ons ALI_ONS_VERSION is there (under a file lock,
    so parallel sessions install once)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI must have node and npm on PATH for the ali-ons interop tests")
        pytest.skip("node/npm not on PATH (the ali-ons interop tests need them)")
    if _installed_version() == ALI_ONS_VERSION:
        return
    with open(os.path.join(NODE_DIR, ".install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed_version() == ALI_ONS_VERSION:
            return
        try:
            r = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_DIR,
                               capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"npm ci of ali-ons took over {INSTALL_TIMEOUT_S} s") from None
        if r.returncode != 0 or _installed_version() != ALI_ONS_VERSION:
            raise RuntimeError(f"npm ci of ali-ons failed ({r.returncode}): {r.stderr[-2000:]}")


# -- the producer and SYNC_MASTER's 11 and 12 -------------------------------------------------

def ons_produce(brokers, topic: str, n: int, prefix: str) -> list[dict]:
    r = subprocess.run(["node", ONS_AGENT, "produce", "--ns", brokers.namesrv_addr, "--group", f"OnsSyncPG{prefix}",
                        "--topic", topic, "--count", str(n), "--prefix", prefix],
                       cwd=NODE_DIR, capture_output=True, text=True, timeout=60)
    ev = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0 and ev[-1]["event"] == "done", (r.returncode, r.stderr[-2000:], ev)
    out = [e for e in ev if e["event"] in ("sent", "error")]
    assert len(out) == n, ev
    return out


@pytest.fixture(scope="module")
def ali_ons():
    ensure_ali_ons()


async def test_ons_producer_returns_slave_not_available_with_one_copy(ali_ons, brokers, no_slave):
    out = await asyncio.to_thread(ons_produce, brokers, ONE, 3, "ons11")
    assert [(e["event"], e["status"]) for e in out] == [("sent", "SLAVE_NOT_AVAILABLE")] * 3, out
    assert counts(await stored(brokers, ONE), "ons11") == {f"ons11-{i}": 1 for i in range(3)}

    n = 8
    out = await asyncio.to_thread(ons_produce, brokers, TWO, n, "ons11two")
    got = where(await stored(brokers, TWO), "ons11two")
    for e in out:
        assert e["event"] == "sent", e
        # the answer of the one broker it picked, its only copy
        assert got[f"ons11two-{e['idx']}"] == [e["broker"]], (e, got)
        assert e["status"] == {"broker-a": "SLAVE_NOT_AVAILABLE", "broker-b": "SEND_OK"}[e["broker"]], e


async def test_ons_producer_returns_flush_slave_timeout_with_one_copy(ali_ons, brokers, stalled_slave):
    out = await asyncio.to_thread(ons_produce, brokers, ONE, 2, "ons12")
    assert [(e["event"], e["status"]) for e in out] == [("sent", "FLUSH_SLAVE_TIMEOUT")] * 2, out
    floor = SLAVE_TIMEOUT_MS / 1000
    assert all(floor <= e["t1"] - e["t0"] < floor + 1.5 for e in out), [e["t1"] - e["t0"] for e in out]
    assert counts(await stored(brokers, ONE), "ons12") == {f"ons12-{i}": 1 for i in range(2)}


# -- a dead master under an ali-ons push consumer ----------------------------------------------

@pytest.fixture(scope="module")
def ons_dead_master(tmp_path_factory):
    ensure_ali_ons()
    root = str(tmp_path_factory.mktemp("ons-dead-master"))
    return asyncio.run(dead_master_run(root, OnsClient(NODE_DIR, POLL_MS, REBALANCE_MS, PERSIST_MS),
                                       deliver_within_s=2 * POLL_MS / 1000 + PULL_RETRY_S + 10))


def test_ons_push_consumer_goes_on_from_the_slave_within_a_route_refresh(ons_dead_master):
    run = ons_dead_master
    delay, per_queue = run.first_backlog_after_kill(), run.per_queue_after_kill()
    after = [e for e in run.events if e["event"] == "pulled" and e["t"] > run.t_kill]
    from_slave = [e for e in after if e["found"]]
    print(f"\nali-ons push consumer (route refresh every {POLL_MS} ms): killed {run.t_kill - run.t_started:.2f} s "
          f"after its start; first backlog message {delay:.2f} s after the kill; per queue {per_queue}; first "
          f"pull answered by the slave {min(e['t'] for e in after) - run.t_kill:.2f} s after the kill")
    assert sorted(per_queue) == [0, 1, 2, 3], dump(run)
    assert delay <= POLL_MS / 1000 + PULL_RETRY_S + 3.0, dump(run)
    # every pull answered after the kill is the slave's, and the backlog came from there
    assert after and {e["addr"] for e in after} == {run.slave_addr}, after[:5]
    assert sum(e["found"] for e in from_slave) >= len(run.backlog), from_slave
    assert not run.duplicates(fresh=False), run.duplicates(fresh=False)


def test_ons_commits_minus_one_for_a_queue_at_offset_zero(ons_dead_master):
    """ali-ons' periodic commit of a queue it holds at offset 0 (its %RETRY% queue here) sends -1:
    the broker-side consequence is the next test."""
    commits = [e for e in ons_dead_master.events if e["event"] == "offset_commit"]
    assert any(e["offset"] == -1 for e in commits), commits[:10]


def test_ons_offsets_committed_to_the_slave_are_taken_back_and_nothing_is_consumed_twice(ons_dead_master):
    run = ons_dead_master
    print(f"\nali-ons: offsets for everything on the slave {run.slave_offsets_at:.2f} s after the kill; the "
          f"restarted master holds {run.master_offsets} (max offsets {run.maxes}); "
          f"{log_lines(run.logs, 'slave_sync - offsets of')}")
    assert run.master_offsets == run.maxes, dump(run)
    assert not run.duplicates(), run.duplicates()
    assert sorted(m["body"] for m in msgs(run.fresh_events)) == [f"fence-{q}-0" for q in range(4)]
