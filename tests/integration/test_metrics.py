"""Prometheus /metrics of real daemons (metricsPort), scraped while traffic flows:
request counters match the requests sent, consumer lag rises while the consumer is
stopped and falls to 0 once it caught up, the nameserver counts its brokers.

What only the broker knows (dispatch, committed offsets) is polled by scraping within
a bound; everything else is awaited.
"""
from __future__ import annotations

import asyncio
import os
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pocketmq.client import LitePullConsumer, Message, Producer
from pocketmq.protocol.codes import RequestCode
from tests.integration.test_client_cluster import create_topic
from tests.support.daemons import Cluster, free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    broker_metrics, ns_metrics = free_port(), free_port()
    c = Cluster(str(tmp_path_factory.mktemp("metrics")), broker_args=[f"--metricsPort={broker_metrics}"])
    c.namesrv.args.append(f"--metricsPort={ns_metrics}")
    c.broker_metrics = f"http://127.0.0.1:{broker_metrics}/metrics"
    c.ns_metrics = f"http://127.0.0.1:{ns_metrics}/metrics"
    c.start()
    yield c
    c.stop()


def uniq(name: str) -> str:
    return f"{name}{os.getpid()}x{int(time.time() * 1000) % 100000}"


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


async def scrape(url: str) -> dict:
    """{(sample name, frozenset of labels): value} of one scrape."""
    status, ctype, text = await asyncio.to_thread(_get, url)
    assert status == 200 and ctype.startswith("text/plain"), (status, ctype)
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: dict, name: str, **labels) -> float | None:
    """The one sample `name` whose labels include `labels`, summed over the others."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    return sum(found) if found else None


async def scrape_until(url: str, pred, what: str, timeout_s: float = 20.0) -> dict:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while True:
        samples = await scrape(url)
        if pred(samples):
            return samples
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def test_request_counters_match_the_requests_sent(cluster):
    async with asyncio.timeout(60):
        topic = uniq("MetricsCount")
        await create_topic(cluster, topic, 2)
        before = await scrape(cluster.broker_metrics)
        sends_before = value(before, "pocketmq_request_latency_seconds_count", code=str(int(RequestCode.SEND_MESSAGE_V2)))
        n = 23
        stop = asyncio.Event()
        scrapes = []

        async def scraper():   # /metrics is scraped while the traffic flows
            while not stop.is_set():
                scrapes.append(await scrape(cluster.broker_metrics))

        task = asyncio.create_task(scraper())
        async with Producer(uniq("MetricsPG"), cluster.namesrv_addr, instance_name=uniq("p")) as p:
            for i in range(n):   # one at a time: concurrent sends would be coalesced into batches
                r = await p.send(Message(topic, f"m{i}".encode()))
                assert r.ok
                await asyncio.sleep(0.01)
            stop.set()
            await task
            after = await scrape(cluster.broker_metrics)   # the producer's connection is open
        assert scrapes
        # what a scrape saw never goes backwards
        seen = [value(x, "pocketmq_topic_put_messages_total", topic=topic) or 0 for x in scrapes]
        assert seen == sorted(seen) and seen[-1] <= n
        sends = value(after, "pocketmq_request_latency_seconds_count", code=str(int(RequestCode.SEND_MESSAGE_V2)),
                      request="SEND_MESSAGE_V2")
        assert sends - (sends_before or 0) == n
        # every observation falls in some bucket: +Inf equals the count
        assert value(after, "pocketmq_request_latency_seconds_bucket", code="310", le="+Inf") == sends
        assert value(after, "pocketmq_topic_put_messages_total", topic=topic) == n
        assert value(after, "pocketmq_topic_put_bytes_total", topic=topic) > 0
        assert value(after, "pocketmq_connections") >= 1
        assert value(after, "rocketmq_brokeruntime_commitlog_disk_ratio") > 0
        assert value(after, "pocketmq_flush_latency_seconds_count") is not None


async def test_lag_rises_while_the_consumer_is_stopped_and_falls_to_zero(cluster):
    async with asyncio.timeout(120):
        topic, group = uniq("MetricsLag"), uniq("MetricsLagG")
        await create_topic(cluster, topic, 2)
        url = cluster.broker_metrics

        def lag(samples):
            return value(samples, "rocketmq_group_diff", group=group, topic=topic)

        async with Producer(uniq("MetricsLagPG"), cluster.namesrv_addr, instance_name=uniq("p")) as p:
            async def produce(k):
                for i in range(k):
                    assert (await p.send(Message(topic, f"lag{i}".encode()))).ok

            async def consume_all(k):
                c = LitePullConsumer(group, cluster.namesrv_addr, consume_from_where="FIRST_OFFSET",
                                     instance_name=uniq("c"))
                c.subscribe(topic)
                got = []
                async with c:      # commits what poll() returned at close
                    while len(got) < k:
                        got.extend(await c.poll(1.0))
                return got

            await produce(10)
            assert len(await consume_all(10)) == 10
            await scrape_until(url, lambda s: lag(s) == 0, "lag 0 after the first catch-up")
            # the consumer is stopped: lag follows the producer
            await produce(25)
            s = await scrape_until(url, lambda s: lag(s) == 25, "lag 25 while the consumer is stopped")
            assert value(s, "pocketmq_consumer_queue_lag", group=group, topic=topic) == 25
            assert value(s, "rocketmq_producer_offset", topic=topic) == 35
            # it comes back and catches up: lag falls to 0
            assert len(await consume_all(25)) == 25
            s = await scrape_until(url, lambda s: lag(s) == 0, "lag 0 after catching up")
            assert value(s, "pocketmq_group_get_messages_total", topic=topic, group=group) == 35
            assert value(s, "rocketmq_consumer_offset", topic=topic, group=group) == 35


async def test_nameserver_metrics(cluster):
    async with asyncio.timeout(30):
        s = await scrape_until(cluster.ns_metrics, lambda s: value(s, "pocketmq_namesrv_brokers",
                                                                   cluster="DefaultCluster") == 1,
                               "the broker registered")
        assert value(s, "pocketmq_namesrv_topics") >= 1
        assert value(s, "pocketmq_request_latency_seconds_count", request="REGISTER_BROKER") >= 1


async def test_only_get_metrics_is_served(cluster):
    base = cluster.broker_metrics.rsplit("/", 1)[0]
    status, _, _ = await asyncio.to_thread(_get, base + "/other")
    assert status == 404
    req = urllib.request.Request(cluster.broker_metrics, data=b"x", method="POST")
    status, _, _ = await asyncio.to_thread(_get, req)
    assert status == 405
