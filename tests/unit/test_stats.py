"""broker/core/stats.py with an integer clock: StatsItem windows (Java's computeStatsData),
the 10/60/600 s TPS, today's counts moved at local midnight, VIEW_BROKER_STATS_DATA lookup;
and remoting/metrics.py's latency histogram and timed processor table."""
from __future__ import annotations

import asyncio

import pytest

from pocketmq.broker.core import stats as S
from pocketmq.broker.core.stats import BrokerStats, StatsItem, StatsSnapshot, window_snapshot
from pocketmq.broker.store.api import PutMessageResult, PutMessageStatus
from pocketmq.protocol.command import RemotingCommand
from pocketmq.remoting.metrics import LATENCY_BOUNDS, LatencyHistogram, RequestLatency, timed_table

DAY = 738_000


def put(n=1, size=100):
    return PutMessageResult(PutMessageStatus.PUT_OK, 0, size, 0, "", 0, n)


def test_window_snapshot_is_javas_compute_stats_data():
    assert window_snapshot([]) == StatsSnapshot(0, 0.0, 0.0)
    assert window_snapshot([(0, 0, 0)]) == StatsSnapshot(0, 0.0, 0.0)
    # 600 messages in 60 s over 30 requests: 10 TPS, 20 per request
    assert window_snapshot([(0, 10, 100), (30_000, 25, 400), (60_000, 40, 700)]) == StatsSnapshot(600, 10.0, 20.0)
    # no requests between the samples: avgpt 0, not a division by zero
    assert window_snapshot([(0, 5, 50), (10_000, 5, 50)]) == StatsSnapshot(0, 0.0, 0.0)


def test_minute_window_keeps_seven_samples_seeded_one_period_back():
    item = StatsItem()
    item.sample_minute(100_000)
    # Java seeds the empty window with a zero sample 10 s back
    assert list(item.minute) == [(90_000, 0, 0), (100_000, 0, 0)]
    for i in range(1, 10):
        item.add(10)
        item.sample_minute(100_000 + i * 10_000)
    assert len(item.minute) == 7
    # the window spans the last 60 s: 6 samples x 10 per 10 s
    assert item.in_minute() == StatsSnapshot(60, 1.0, 10.0)
    assert item.stats_data() == {"statsMinute": {"sum": 60, "tps": 1.0, "avgpt": 10.0},
                                 "statsHour": {"sum": 0, "tps": 0.0, "avgpt": 0.0},
                                 "statsDay": {"sum": 0, "tps": 0.0, "avgpt": 0.0}}


def test_tick_samples_each_window_on_its_own_period():
    st = BrokerStats()
    st.count_put("T", put(3, 300))
    st.tick(0, DAY)
    c = st.put["T"]
    assert len(c.nums.minute) == len(c.nums.hour) == len(c.nums.day) == 2
    for now in range(1000, 600_000, 1000):
        st.tick(now, DAY)
    # 10 s samples: 59 more, trimmed to 7; 10 min and 1 h: not due yet
    assert len(c.nums.minute) == 7 and len(c.nums.hour) == 2 and len(c.nums.day) == 2
    st.tick(600_000, DAY)
    assert len(c.nums.hour) == 3 and len(c.nums.day) == 2


def test_put_and_get_counts_per_topic_and_group():
    st = BrokerStats()
    st.count_put("T", put(1, 120))
    st.count_put("T", put(10, 2000))      # a batch: one request, ten messages
    st.count_put("U", put(1, 50))
    st.count_get("T", "G", 7, 700)
    st.count_miss()
    c = st.put["T"]
    assert (c.msgs, c.times, c.bytes) == (11, 2, 2120)
    assert st.msg_put_total == 12 and st.msg_get_total == 7 and st.put_size_total == 2170
    g = st.get["T"]["G"]
    assert (g.msgs, g.bytes, st.get_found, st.get_miss) == (7, 700, 1, 1)
    # the windows are brought up to the counts when sampled
    assert c.nums.value == 0
    st.tick(0, DAY)
    assert (c.nums.value, c.nums.times, c.size.value, c.size.times) == (11, 2, 2120, 2)
    assert (st.broker_put.value, st.broker_put.times, st.broker_get.value) == (12, 3, 7)
    assert [(n, k) for n, k, _ in st.items()] == [
        (S.TOPIC_PUT_NUMS, "T"), (S.TOPIC_PUT_SIZE, "T"), (S.TOPIC_PUT_NUMS, "U"), (S.TOPIC_PUT_SIZE, "U"),
        (S.GROUP_GET_NUMS, "T@G"), (S.GROUP_GET_SIZE, "T@G")]


def test_find_resolves_javas_stats_names_and_keys():
    st = BrokerStats()
    st.count_put("T", put(2))
    st.count_get("T", "G", 1, 10)
    assert st.find(S.TOPIC_PUT_NUMS, "T", "C") is st.put["T"].nums
    assert st.find(S.TOPIC_PUT_SIZE, "T", "C") is st.put["T"].size
    assert st.find(S.GROUP_GET_NUMS, "T@G", "C") is st.get["T"]["G"].nums
    assert st.find(S.GROUP_GET_SIZE, "T@G", "C") is st.get["T"]["G"].size
    assert st.find(S.BROKER_PUT_NUMS, "C", "C") is st.broker_put
    assert st.find(S.BROKER_GET_NUMS, "C", "C") is st.broker_get
    for name, key in ((S.TOPIC_PUT_NUMS, "nope"), (S.GROUP_GET_NUMS, "T"), (S.GROUP_GET_NUMS, "T@other"),
                      (S.BROKER_PUT_NUMS, "other-cluster"), ("NO_SUCH_STATS", "T")):
        assert st.find(name, key, "C") is None, (name, key)


def test_tps_over_10_60_600_seconds():
    st = BrokerStats()
    st.tick(0, DAY)
    # 5 messages a second for 20 s, then nothing for 40 s
    for sec in range(1, 61):
        if sec <= 20:
            for _ in range(5):
                st.count_put("T", put())
        st.tick(sec * 1000, DAY)
    assert st.tps(1, 10) == 0.0                       # the last 10 s were quiet
    assert st.tps(1, 60) == pytest.approx(100 / 60)   # 100 messages in the last 60 s
    assert st.tps(1, 600) == pytest.approx(100 / 60)  # younger than 600 s: what there is
    assert st.tps_text(1) == "0.00 1.67 1.67"
    # a sample is taken once a second, however often tick is called
    st.tick(60_500, DAY)
    assert len(st._seconds) == 61


def test_tps_of_a_new_broker_is_zero():
    st = BrokerStats()
    assert st.tps(1, 10) == 0.0
    st.tick(0, DAY)
    assert st.tps_text(2) == "0.00 0.00 0.00"


def test_todays_counts_move_at_local_midnight():
    st = BrokerStats()
    st.tick(0, DAY)
    for _ in range(7):
        st.count_put("T", put())
    st.count_get("T", "G", 3, 30)
    st.tick(1000, DAY)
    r = st.runtime_counts()
    # like Java's BrokerStats: the morning counts start at 0 on the first day
    assert (r["msgPutTotalTodayNow"], r["msgPutTotalTodayMorning"], r["msgPutTotalYesterdayMorning"]) == (7, 0, 0)
    st.tick(2000, DAY + 1)                             # midnight
    st.count_put("T", put(2))
    r = st.runtime_counts()
    assert (r["msgPutTotalTodayNow"], r["msgPutTotalTodayMorning"], r["msgPutTotalYesterdayMorning"]) == (9, 7, 0)
    assert (r["msgGetTotalTodayNow"], r["msgGetTotalTodayMorning"]) == (3, 3)
    st.tick(3000, DAY + 2)
    r = st.runtime_counts()
    assert (r["msgPutTotalTodayMorning"], r["msgPutTotalYesterdayMorning"]) == (9, 7)
    assert r["putMessageSizeTotal"] == 800 and r["getMessageTimesTotalFound"] == 1


# ------------------------------------------------------------------------ remoting/metrics.py

def test_latency_histogram_buckets_are_cumulative_with_inf_last():
    h = LatencyHistogram()
    for s in (0.00001, LATENCY_BOUNDS[0], 0.003, 0.003, 99.0):
        h.observe(s)
    b = dict(h.buckets())
    assert b[repr(LATENCY_BOUNDS[0])] == 2               # le is inclusive
    assert b["0.005"] == 4 and b["10.0"] == 4 and b["+Inf"] == 5
    assert h.count == 5 and h.sum == pytest.approx(99.00606)
    assert [le for le, _ in h.buckets()][-1] == "+Inf"


async def test_timed_table_times_sync_async_parked_and_failing_processors():
    resp = RemotingCommand(0)

    async def later(conn, cmd):
        await asyncio.sleep(0)
        return resp

    def boom(conn, cmd):
        raise ValueError("bad")

    latency = RequestLatency()
    table = timed_table({1: lambda conn, cmd: resp, 2: later, 3: lambda conn, cmd: None, 4: boom}, latency)
    assert table[1](None, None) is resp
    assert await table[2](None, None) is resp
    assert table[3](None, None) is None          # a parked pull: timed until parked
    with pytest.raises(ValueError):
        table[4](None, None)
    assert {code: h.count for code, h in latency.by_code.items()} == {1: 1, 2: 1, 3: 1, 4: 1}


def test_runtime_is_javas_format():
    from pocketmq.broker.processors.stats import format_runtime
    assert format_runtime(90_061_999) == "[ 1 days, 1 hours, 1 minutes, 1 seconds ]"
    assert format_runtime(-5) == "[ 0 days, 0 hours, 0 minutes, 0 seconds ]"
