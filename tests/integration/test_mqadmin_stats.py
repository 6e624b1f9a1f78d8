"""mqadmin brokerStatus, clusterList and statsAll against real daemons with traffic, and
their error paths (bad broker address, unknown cluster, unknown topic).

The TPS windows fill on the broker's own schedule (1 s samples for putTps, 10 s for the
per-topic minute window), so what they show is polled within a bound.
"""
from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest

from pocketmq.client import LitePullConsumer, Message, Producer
from tests.integration.test_client_cluster import create_topic
from tests.support.daemons import Cluster, free_port
from tests.support.workloads import run_mqadmin

pytestmark = pytest.mark.slow

TOPIC = "StatsTopic"
IDLE_TOPIC = "StatsIdleTopic"
NO_CONSUMER_TOPIC = "StatsNoConsumer"
GROUP = "stats_group"
SENT, CONSUMED, SENT_NO_CONSUMER = 35, 30, 4


def run_cli(*args):
    return run_mqadmin(*args, timeout_s=60)


def assert_clean_failure(r, *needles, code=1):
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("mqadmin: "), r.stderr
    for n in needles:
        assert n in lines[0], r.stderr


async def _traffic(c: Cluster) -> None:
    for t in (TOPIC, IDLE_TOPIC, NO_CONSUMER_TOPIC):
        await create_topic(c, t, 2)
    async with Producer("stats_pg", c.namesrv_addr) as p:
        for i in range(SENT):
            assert (await p.send(Message(TOPIC, f"s{i}".encode()))).ok
        for i in range(SENT_NO_CONSUMER):
            assert (await p.send(Message(NO_CONSUMER_TOPIC, f"n{i}".encode()))).ok
    # 30 of 35 polled and committed: 5 stay behind (the accumulation); the consumer's
    # first pull per queue fetched all 35 (that is what the broker counts as got)
    consumer = LitePullConsumer(GROUP, c.namesrv_addr, consume_from_where="FIRST_OFFSET", max_poll_records=1)
    consumer.subscribe(TOPIC)
    got = 0
    async with consumer:      # commits what poll() returned at close
        while got < CONSUMED:
            got += len(await consumer.poll(1.0, max_records=CONSUMED - got))
    assert got == CONSUMED


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("mqadmin-stats")))
    c.start()
    try:
        asyncio.run(asyncio.wait_for(_traffic(c), 90))
    except BaseException:
        c.stop()
        raise
    yield c
    c.stop()


def ns(c):
    return ["-n", c.namesrv_addr]


def poll_cli(args, pred, what, timeout_s=40.0):
    end = time.monotonic() + timeout_s
    while True:
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
        if pred(r.stdout):
            return r.stdout
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}; last output:\n{r.stdout}")
        time.sleep(0.5)


def rows(text: str, first_header: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(first_header))
    return [re.split(r"\s{2,}", ln.strip()) for ln in lines[start + 1:] if ln.strip()]


# ------------------------------------------------------------------------------ statsAll

def test_stats_all_shows_tps_accumulation_and_counts(cluster):
    def ready(out):
        r = {(row[0], row[1] if len(row) == 7 else ""): row for row in rows(out, "#Topic")}
        row = r.get((TOPIC, GROUP))
        return row is not None and float(row[3]) > 0 and float(row[4]) > 0
    out = poll_cli(["statsAll", *ns(cluster)], ready, "statsAll's minute window to show the traffic")
    by_topic = {}
    for row in rows(out, "#Topic"):
        by_topic.setdefault(row[0], []).append(row)
    (row,) = by_topic[TOPIC]
    assert row[:3] == [TOPIC, GROUP, str(SENT - CONSUMED)]
    assert row[5:] == [str(SENT), str(SENT)]
    (nc,) = by_topic[NO_CONSUMER_TOPIC]
    assert nc[-1] == "NO_CONSUMER" and nc[-2] == str(SENT_NO_CONSUMER)
    assert IDLE_TOPIC in by_topic                  # listed without -a
    assert not any(t.startswith("%RETRY%") for t in by_topic)


def test_stats_all_active_only_and_one_topic(cluster):
    r = run_cli("statsAll", *ns(cluster), "-a")
    assert r.returncode == 0, r.stderr
    listed = {row[0] for row in rows(r.stdout, "#Topic")}
    assert IDLE_TOPIC not in listed and TOPIC in listed
    r = run_cli("statsAll", *ns(cluster), "-t", TOPIC)
    assert r.returncode == 0, r.stderr
    assert {row[0] for row in rows(r.stdout, "#Topic")} == {TOPIC}


def test_stats_all_unknown_topic(cluster):
    assert_clean_failure(run_cli("statsAll", *ns(cluster), "-t", "NoSuchStatsTopic"),
                         "topic NoSuchStatsTopic does not exist")


# --------------------------------------------------------------------------- brokerStatus

def _status_table(out: str) -> dict:
    table = {}
    for ln in out.splitlines():
        key, sep, v = ln.partition(": ")
        if sep:
            table[key.strip()] = v
    return table


def test_broker_status_by_address(cluster):
    out = poll_cli(["brokerStatus", *ns(cluster), "-b", cluster.broker_addr],
                   lambda o: float(_status_table(o).get("putTps", "0").split()[-1]) > 0,
                   "putTps to show the traffic")
    keys = [ln.partition(":")[0].strip() for ln in out.splitlines()]
    assert keys == sorted(keys)                       # Java prints the table sorted by key
    t = _status_table(out)
    assert int(t["msgPutTotalTodayNow"]) == SENT + SENT_NO_CONSUMER
    assert int(t["msgGetTotalTodayNow"]) == SENT
    assert int(t["msgPutTotalTodayMorning"]) == 0     # the broker started today
    assert len(t["putTps"].split()) == 3              # 10 s, 60 s, 600 s
    assert 0 < float(t["commitLogDiskRatio"]) < 1
    assert int(t["commitLogMaxOffset"]) > 0
    assert t["runtime"].startswith("[ 0 days, ")
    assert int(t["bootTimestamp"]) <= int(t["earliestMessageTimeStamp"]) <= time.time() * 1000
    for key in ("getTransferedTps", "getFoundTps", "getMissTps", "bootTimestamp", "brokerVersionDesc",
                "dispatchBehindBytes", "remainHowManyDataToFlush"):
        assert key in t, key
    # pocketmq's own: the busy-polling window (remoting/busy_poll.py) and the gap it follows,
    # measured from the requests this module sent (at most the busyPollMicros cap, 500)
    assert int(t["busyPollCapMicros"]) == 500
    assert 0 < int(t["busyPollWindowMicros"]) <= 500 and int(t["busyPollGapAvgMicros"]) > 0
    assert int(t["busyPollWindows"]) > 0 and t["busyPollSuspended"] in ("True", "False")


def test_broker_status_by_cluster(cluster):
    r = run_cli("brokerStatus", *ns(cluster), "-c", "DefaultCluster")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines and all(ln.startswith(cluster.broker_addr + " ") for ln in lines)
    assert any(re.match(rf"{re.escape(cluster.broker_addr)}\s+msgPutTotalTodayNow\s*: {SENT + SENT_NO_CONSUMER}$",
                        ln) for ln in lines), r.stdout


def test_broker_status_errors(cluster):
    dead = f"127.0.0.1:{free_port()}"
    assert_clean_failure(run_cli("brokerStatus", *ns(cluster), "-b", dead), f"cannot reach broker {dead}")
    assert_clean_failure(run_cli("brokerStatus", *ns(cluster), "-b", "nohost"), "bad broker address")
    assert_clean_failure(run_cli("brokerStatus", *ns(cluster), "-c", "NoSuchCluster"),
                         "cluster NoSuchCluster not found", "DefaultCluster")
    assert_clean_failure(run_cli("brokerStatus", *ns(cluster)), "-b brokerAddr or -c clusterName", code=2)


# ---------------------------------------------------------------------------- clusterList

class BackgroundSends:
    """Sends to TOPIC from a thread until stopped: the 10 s TPS clusterList shows needs
    traffic while it is asked."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        async with Producer("stats_bg_pg", self.c.namesrv_addr) as p:
            while not self.stop.is_set():
                await p.send(Message(TOPIC, b"bg"))
                await asyncio.sleep(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)


def test_cluster_list_shows_real_tps_and_todays_counts(cluster):
    def row_of(out):
        return next(r for r in rows(out, "#Cluster Name") if r[3] == cluster.broker_addr)
    r = run_cli("clusterList", *ns(cluster))
    assert r.returncode == 0, r.stderr
    header = r.stdout.splitlines()[0].split()
    assert header[-6:] == ["#InTPS", "#OutTPS", "#InTotalYest", "#OutTotalYest", "#InTotalToday", "#OutTotalToday"]
    row = row_of(r.stdout)
    assert row[0] == "DefaultCluster" and row[2] == "0"
    assert row[7:] == ["0", "0", str(SENT + SENT_NO_CONSUMER), str(SENT)]
    with BackgroundSends(cluster):
        poll_cli(["clusterList", *ns(cluster)], lambda o: float(row_of(o)[5]) > 0, "InTPS to show the traffic")
    r = run_cli("clusterList", *ns(cluster), "-c", "DefaultCluster")
    assert r.returncode == 0 and cluster.broker_addr in r.stdout, r.stderr
    r = run_cli("clusterList", *ns(cluster), "-m")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split()[-4:] == ["#InTotalYest", "#OutTotalYest", "#InTotalToday",
                                                     "#OutTotalToday"]
    (more,) = rows(r.stdout, "#Cluster Name")
    assert more[:2] == ["DefaultCluster", "broker-a"] and more[2:4] == ["0", "0"]
    assert int(more[4]) > SENT + SENT_NO_CONSUMER      # the background sends came on top


def test_cluster_list_errors(cluster):
    assert_clean_failure(run_cli("clusterList", *ns(cluster), "-c", "NoSuchCluster"),
                         "cluster NoSuchCluster not found")
    dead = f"127.0.0.1:{free_port()}"
    assert_clean_failure(run_cli("clusterList", "-n", dead), f"cannot reach nameserver {dead}")
