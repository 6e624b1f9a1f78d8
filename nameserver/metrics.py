"""The nameserver's Prometheus metrics, read from the route tables at scrape time
(served by remoting/metrics.serve_metrics; names in docs/operations.md)."""
from __future__ import annotations

from pocketmq.remoting.acl import acl_metrics
from pocketmq.remoting.metrics import RequestLatency, RequestLatencyCollector


class NamesrvCollector:
    def __init__(self, namesrv, latency: RequestLatency) -> None:
        self.namesrv = namesrv
        self.latency = RequestLatencyCollector(latency, "nameserver")

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily
        ns = self.namesrv
        routes = ns.routes
        brokers = GaugeMetricFamily("pocketmq_namesrv_brokers", "Broker addresses registered (alive), per cluster",
                                    labels=["cluster"])
        live = routes.broker_live_table
        for cluster, names in sorted(routes.cluster_addr_table.items()):
            n = 0
            for name in names:
                bd = routes.broker_addr_table.get(name)
                if bd is not None:
                    n += sum(1 for addr in bd.broker_addrs.values() if addr in live)
            brokers.add_metric([cluster], n)
        yield brokers
        for metric, doc, value in (
                ("pocketmq_namesrv_broker_names", "Broker names (master/slave sets) known", len(routes.broker_addr_table)),
                ("pocketmq_namesrv_topics", "Topics with a route", len(routes.topic_queue_table)),
                ("pocketmq_namesrv_clusters", "Clusters known", len(routes.cluster_addr_table)),
                ("pocketmq_connections", "Open connections (brokers and clients)", ns.connection_count())):
            f = GaugeMetricFamily(metric, doc)
            f.add_metric([], value)
            yield f
        yield from acl_metrics(ns.acl, [], [])
        yield from self.latency.collect()
