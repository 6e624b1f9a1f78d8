"""The web console's list pages with many objects (issue 34: with 1,000 topics and 500 groups
every list page renders in under 500 ms server time).

Starts a nameserver and a broker (tests/support/daemons.py), creates TOPICS topics and GROUPS
subscription groups, each group with a committed offset on one topic, then serves the console
in this process and times each page over HTTP on loopback (so the figure is server time plus a
loopback round trip): cold (the console's 3 s cache cleared before each request) and warm.
Also times one lag-sampling round (what the groups page reads).

    python3 -m bench.bench_console [--topics 1000] [--groups 500] [--runs 5]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import urllib.request

from bench.bench_broker import temp_cluster
from pocketmq.console.server import start_console
from pocketmq.protocol.bodies import MessageQueue, SubscriptionGroupConfig, TopicConfig
from pocketmq.tools.mqadmin.session import AdminSession
from tests.support.daemons import Cluster


async def populate(c: Cluster, topics: int, groups: int) -> None:
    s = AdminSession(c.namesrv_addr)
    sem = asyncio.Semaphore(32)

    async def one(coro):
        async with sem:
            await coro
    try:
        await asyncio.gather(*(one(s.api.create_topic(c.broker_addr, TopicConfig(f"BenchTopic{i:04d}", 4, 4), "TBW102"))
                               for i in range(topics)))
        await asyncio.gather(*(one(s.api.update_subscription_group(c.broker_addr,
                                                                   SubscriptionGroupConfig(f"bench_group_{g:03d}")))
                               for g in range(groups)))
        await asyncio.gather(*(one(s.api.update_consumer_offset(
            c.broker_addr, f"bench_group_{g:03d}", MessageQueue(f"BenchTopic{g % topics:04d}", "broker-a", 0), 0))
            for g in range(groups)))
        # the broker registers its topics with the nameserver after the changes: wait for all
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if sum(t.startswith("BenchTopic") for t in await s.topic_list()) >= topics:
                break
            await asyncio.sleep(0.2)
    finally:
        await s.close()


def fetch(url: str, must_show: str) -> float:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        page = r.read().decode()
        took = (time.perf_counter() - t) * 1000
    assert r.status == 200 and must_show in page and 'class="error"' not in page, (url, r.status, page[-2000:])
    return took


async def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topics", type=int, default=1000)
    p.add_argument("--groups", type=int, default=500)
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args(argv)
    with temp_cluster("bench-console-") as c:
        t = time.perf_counter()
        await populate(c, a.topics, a.groups)
        print(f"created {a.topics} topics and {a.groups} groups in {time.perf_counter() - t:.1f} s")
        con = await start_console(c.namesrv_addr, port=0, sample_interval_s=3600)
        try:
            sampler = con.console.sampler
            await asyncio.wait_for(sampler.ready.wait(), 120)
            t = time.perf_counter()
            await sampler.sample_once()
            print(f"one lag-sampling round over {len(sampler.latest)} groups: "
                  f"{(time.perf_counter() - t) * 1000:.0f} ms")
            loop = asyncio.get_running_loop()
            # each page with a text it must show (a page of errors would be fast too)
            pages = [("cluster", "ASYNC_MASTER"), ("topics", "BenchTopic0049"),
                     ("topics?q=BenchTopic09", "BenchTopic0949"), ("topics?page=10", "BenchTopic0499"),
                     ("groups", "bench_group_"), ("groups?page=5", "bench_group_"),
                     ("groups/bench_group_007", "BenchTopic0007"), ("topics/BenchTopic0007", "bench_group_007")]
            print(f"{'page':<28} {'cold median':>12} {'cold max':>9} {'warm median':>12}")
            for page, must_show in pages:
                cold, warm = [], []
                for _ in range(a.runs):
                    sampler.cluster.cache.clear()
                    cold.append(await loop.run_in_executor(None, fetch, con.url + page, must_show))
                    warm.append(await loop.run_in_executor(None, fetch, con.url + page, must_show))
                print(f"/{page:<27} {statistics.median(cold):>9.1f} ms {max(cold):>6.1f} ms "
                      f"{statistics.median(warm):>9.1f} ms")
        finally:
            await con.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
