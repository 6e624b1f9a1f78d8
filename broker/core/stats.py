"""Broker statistics: the counters behind GET_BROKER_RUNTIME_INFO, VIEW_BROKER_STATS_DATA,
mqadmin brokerStatus / clusterList / statsAll and the Prometheus collector.

RocketMQ keeps three things apart; so do we, in one sans-IO module:

* `StatsItem` (Java's common/stats/StatsItem): a running `value` and `times` (requests)
  per stats name and key (TOPIC_PUT_NUMS of a topic, GROUP_GET_NUMS of `topic@group`...),
  sampled every 10 s (the minute window: 7 samples), 10 min (the hour: 7) and 1 h (the
  day: 25). A window's sum is last - first sample, its TPS sum / elapsed, its avgpt
  sum / requests, exactly as Java's computeStatsData.
* the store's per-second samples of the broker totals (Java's StoreStatsService), from
  which putTps / getTransferedTps / getFoundTps / getMissTps are computed over the last
  10, 60 and 600 s.
* today's counts (Java's BrokerStats): at local midnight the totals are copied to
  `*_today_morning` and the previous morning's to `*_yesterday_morning`.

The send and pull processors count with integer additions per request (no allocation
once a topic or group has been seen); the samples are taken by `tick(now_ms, local_day)`,
called about once a second by the shell (broker/services/stats.py), which owns the
clock and knows the local calendar day.
"""
from __future__ import annotations

from collections import deque
from typing import NamedTuple

from pocketmq.common.constants import (
    BROKER_GET_NUMS,
    BROKER_PUT_NUMS,
    GROUP_GET_NUMS,
    GROUP_GET_SIZE,
    TOPIC_PUT_NUMS,
    TOPIC_PUT_SIZE,
)

STATS_NAMES = (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, GROUP_GET_NUMS, GROUP_GET_SIZE, BROKER_PUT_NUMS, BROKER_GET_NUMS)

# (sampling period ms, samples kept) of StatsItem's three windows, as Java's
MINUTE_WINDOW = (10_000, 7)
HOUR_WINDOW = (600_000, 7)
DAY_WINDOW = (3_600_000, 25)
# StoreStatsService: one sample a second, enough for the 600 s TPS
SECOND_SAMPLE_MS = 1000
SECOND_SAMPLES_KEPT = 601
TPS_WINDOWS_S = (10, 60, 600)


class StatsSnapshot(NamedTuple):
    """Java's StatsSnapshot / BrokerStatsItem: one window's sum, TPS and average per request."""

    sum: int
    tps: float
    avgpt: float

    def to_json(self) -> dict:
        return {"sum": self.sum, "tps": self.tps, "avgpt": self.avgpt}


def window_snapshot(samples) -> StatsSnapshot:
    """sum, tps and avgpt between the first and last of (timestamp_ms, times, value)
    samples (Java's StatsItem.computeStatsData)."""
    if len(samples) < 2:
        return StatsSnapshot(0, 0.0, 0.0)
    t0, times0, v0 = samples[0]
    t1, times1, v1 = samples[-1]
    total = v1 - v0
    elapsed = t1 - t0
    tps = total * 1000.0 / elapsed if elapsed > 0 else 0.0
    times = times1 - times0
    return StatsSnapshot(total, tps, total / times if times > 0 else 0.0)


class StatsItem:
    """One counter (value, requests) and its minute / hour / day samples."""

    __slots__ = ("value", "times", "minute", "hour", "day")

    def __init__(self) -> None:
        self.value = 0
        self.times = 0
        self.minute: deque = deque(maxlen=MINUTE_WINDOW[1])
        self.hour: deque = deque(maxlen=HOUR_WINDOW[1])
        self.day: deque = deque(maxlen=DAY_WINDOW[1])

    def add(self, value: int) -> None:
        self.value += value
        self.times += 1

    @staticmethod
    def _sample(samples: deque, period_ms: int, now_ms: int, times: int, value: int) -> None:
        if not samples:
            # Java seeds an empty window with a zero sample one period back, so the first
            # real sample already gives a rate.
            samples.append((now_ms - period_ms, 0, 0))
        samples.append((now_ms, times, value))

    def sample_minute(self, now_ms: int) -> None:
        self._sample(self.minute, MINUTE_WINDOW[0], now_ms, self.times, self.value)

    def sample_hour(self, now_ms: int) -> None:
        self._sample(self.hour, HOUR_WINDOW[0], now_ms, self.times, self.value)

    def sample_day(self, now_ms: int) -> None:
        self._sample(self.day, DAY_WINDOW[0], now_ms, self.times, self.value)

    def in_minute(self) -> StatsSnapshot:
        return window_snapshot(self.minute)

    def in_hour(self) -> StatsSnapshot:
        return window_snapshot(self.hour)

    def in_day(self) -> StatsSnapshot:
        return window_snapshot(self.day)

    def stats_data(self) -> dict:
        """Java's BrokerStatsData JSON (the VIEW_BROKER_STATS_DATA body)."""
        return {"statsMinute": self.in_minute().to_json(), "statsHour": self.in_hour().to_json(),
                "statsDay": self.in_day().to_json()}


class Counters:
    """The running counts of one topic (its puts) or one topic@group (its gets): messages,
    requests, bytes, added on the request path; and their windows (the NUMS and SIZE
    StatsItems), brought up to the counts when sampled."""

    __slots__ = ("msgs", "times", "bytes", "nums", "size")

    def __init__(self) -> None:
        self.msgs = self.times = self.bytes = 0
        self.nums = StatsItem()
        self.size = StatsItem()

    def sync(self) -> None:
        nums, size = self.nums, self.size
        nums.value, nums.times = self.msgs, self.times
        size.value, size.times = self.bytes, self.times


class BrokerStats:
    """All of a broker's statistics. Counting (count_put, count_get, count_miss) is on the
    request path and only adds to a topic's or group's integers; totals are summed when
    read (admin requests, scrapes, the tick)."""

    __slots__ = ("boot_timestamp", "put", "get", "broker_put", "broker_get", "get_miss",
                 "_seconds", "_next_second", "_next_minute", "_next_hour", "_next_day", "_day",
                 "put_today_morning", "get_today_morning", "put_yesterday_morning", "get_yesterday_morning")

    def __init__(self) -> None:
        self.boot_timestamp = 0
        self.put: dict[str, Counters] = {}                     # topic -> its puts
        self.get: dict[str, dict[str, Counters]] = {}          # topic -> group -> its gets
        self.broker_put = StatsItem()                          # BROKER_PUT_NUMS windows
        self.broker_get = StatsItem()                          # BROKER_GET_NUMS windows
        self.get_miss = 0                                      # pulls that found none
        # (ms, put total, get total, found, miss) once a second
        self._seconds: deque = deque(maxlen=SECOND_SAMPLES_KEPT)
        self._next_second = self._next_minute = self._next_hour = self._next_day = None
        self._day = None
        self.put_today_morning = self.get_today_morning = 0
        self.put_yesterday_morning = self.get_yesterday_morning = 0

    # -- counting (request path) -------------------------------------------------------
    def count_put(self, topic: str, result) -> None:
        """A stored PutMessageResult (one message or a batch) of `topic`."""
        c = self.put.get(topic)
        if c is None:
            c = self.put[topic] = Counters()
        c.msgs += result.msg_count or 1
        c.times += 1
        c.bytes += result.wrote_bytes

    def count_get(self, topic: str, group: str, n: int, size: int) -> None:
        """A pull that found `n` messages, `size` bytes."""
        groups = self.get.get(topic)
        if groups is None:
            groups = self.get[topic] = {}
        c = groups.get(group)
        if c is None:
            c = groups[group] = Counters()
        c.msgs += n
        c.times += 1
        c.bytes += size

    def count_miss(self) -> None:
        """A pull answered without messages (not found, offset moved, no match...)."""
        self.get_miss += 1

    # -- totals (summed when read) ---------------------------------------------------------
    def _gets(self):
        for groups in self.get.values():
            yield from groups.values()

    @property
    def msg_put_total(self) -> int:
        return sum(c.msgs for c in self.put.values())

    @property
    def msg_get_total(self) -> int:
        return sum(c.msgs for c in self._gets())

    @property
    def put_size_total(self) -> int:
        return sum(c.bytes for c in self.put.values())

    @property
    def get_found(self) -> int:
        """Pulls that found messages."""
        return sum(c.times for c in self._gets())

    # -- sampling (the shell's tick) -----------------------------------------------------
    def items(self):
        """Every StatsItem as (stats name, stats key, item)."""
        for topic, c in self.put.items():
            yield TOPIC_PUT_NUMS, topic, c.nums
            yield TOPIC_PUT_SIZE, topic, c.size
        for topic, groups in self.get.items():
            for group, c in groups.items():
                key = f"{topic}@{group}"
                yield GROUP_GET_NUMS, key, c.nums
                yield GROUP_GET_SIZE, key, c.size

    def _sync_all(self) -> list[StatsItem]:
        """Every StatsItem, brought up to the counts."""
        items = [self.broker_put, self.broker_get]
        put_msgs = put_times = 0
        for c in self.put.values():
            c.sync()
            put_msgs += c.msgs
            put_times += c.times
            items += (c.nums, c.size)
        get_msgs = get_times = 0
        for c in self._gets():
            c.sync()
            get_msgs += c.msgs
            get_times += c.times
            items += (c.nums, c.size)
        self.broker_put.value, self.broker_put.times = put_msgs, put_times
        self.broker_get.value, self.broker_get.times = get_msgs, get_times
        return items

    def tick(self, now_ms: int, local_day: int) -> None:
        """Take the samples that are due at `now_ms`; `local_day` (any number that changes
        at local midnight, e.g. a date's ordinal) moves today's counts to yesterday's."""
        if self._day is None:
            self._day = local_day
        elif local_day != self._day:
            self._day = local_day
            self.put_yesterday_morning, self.get_yesterday_morning = self.put_today_morning, self.get_today_morning
            self.put_today_morning, self.get_today_morning = self.msg_put_total, self.msg_get_total
        items = None
        if self._next_second is None or now_ms >= self._next_second:
            items = self._sync_all()
            self._seconds.append((now_ms, self.broker_put.value, self.broker_get.value, self.broker_get.times,
                                  self.get_miss))
            self._next_second = now_ms + SECOND_SAMPLE_MS
        for attr, (period, _), sample in (("_next_minute", MINUTE_WINDOW, StatsItem.sample_minute),
                                          ("_next_hour", HOUR_WINDOW, StatsItem.sample_hour),
                                          ("_next_day", DAY_WINDOW, StatsItem.sample_day)):
            due = getattr(self, attr)
            if due is None or now_ms >= due:
                if items is None:
                    items = self._sync_all()
                for item in items:
                    sample(item, now_ms)
                setattr(self, attr, now_ms + period)

    # -- reading -------------------------------------------------------------------------
    def tps(self, column: int, window_s: int) -> float:
        """Rate of a per-second column (1 put, 2 get, 3 found, 4 miss) over the last
        `window_s` seconds, or over the samples there are when the broker is younger."""
        s = self._seconds
        if len(s) < 2:
            return 0.0
        last = s[-1]
        first = s[max(0, len(s) - 1 - window_s)]
        elapsed = last[0] - first[0]
        return (last[column] - first[column]) * 1000.0 / elapsed if elapsed > 0 else 0.0

    def tps_text(self, column: int) -> str:
        """Java's "10s 60s 600s" TPS string (StoreStatsService.getPutTps())."""
        return " ".join(f"{self.tps(column, w):.2f}" for w in TPS_WINDOWS_S)

    def find(self, stats_name: str, stats_key: str, cluster_name: str) -> StatsItem | None:
        """The StatsItem VIEW_BROKER_STATS_DATA names, or None. Group keys are
        `topic@group` (topic names cannot hold '@'); broker keys the cluster name."""
        if stats_name in (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE):
            c = self.put.get(stats_key)
            return None if c is None else (c.nums if stats_name == TOPIC_PUT_NUMS else c.size)
        if stats_name in (GROUP_GET_NUMS, GROUP_GET_SIZE):
            topic, at, group = stats_key.partition("@")
            c = self.get.get(topic, {}).get(group) if at else None
            return None if c is None else (c.nums if stats_name == GROUP_GET_NUMS else c.size)
        if stats_name == BROKER_PUT_NUMS and stats_key == cluster_name:
            return self.broker_put
        if stats_name == BROKER_GET_NUMS and stats_key == cluster_name:
            return self.broker_get
        return None

    def runtime_counts(self) -> dict:
        """The GET_BROKER_RUNTIME_INFO keys this module owns (Java's names)."""
        put_total, get_total, found = self.msg_put_total, self.msg_get_total, self.get_found
        return {
            "msgPutTotalTodayNow": put_total, "msgGetTotalTodayNow": get_total,
            "msgPutTotalTodayMorning": self.put_today_morning, "msgGetTotalTodayMorning": self.get_today_morning,
            "msgPutTotalYesterdayMorning": self.put_yesterday_morning,
            "msgGetTotalYesterdayMorning": self.get_yesterday_morning,
            "putTps": self.tps_text(1), "getTransferedTps": self.tps_text(2), "getFoundTps": self.tps_text(3),
            "getMissTps": self.tps_text(4),
            "getTotalTps": " ".join(f"{self.tps(3, w) + self.tps(4, w):.2f}" for w in TPS_WINDOWS_S),
            "putMessageTimesTotal": put_total, "putMessageSizeTotal": self.put_size_total,
            "getMessageTransferedMsgCount": get_total,
            "getMessageTimesTotalFound": found, "getMessageTimesTotalMiss": self.get_miss,
        }
