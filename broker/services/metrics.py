"""The broker's Prometheus metrics: a collector reading the live tables at scrape time.

Nothing here runs per message: the send and pull processors only add integers to
broker/core/stats.py's counters; this collector turns those, the store's offsets, the
committed offsets and the server's connection and latency tables into metric families
when /metrics is scraped (on the event loop, remoting/metrics.serve_metrics).
rocketmq-exporter's names and labels are used where the meaning is the same; the rest
are pocketmq_*. The list, with a scrape config: docs/operations.md.
"""
from __future__ import annotations

from typing import Callable

from pocketmq.remoting.acl import acl_metrics
from pocketmq.remoting.metrics import LatencyHistogram, RequestLatency, RequestLatencyCollector


class BrokerCollector:
    def __init__(self, broker, latency: RequestLatency, flush_latency: LatencyHistogram,
                 disk_ratio: Callable[[], float]) -> None:
        self.broker = broker
        self.disk_ratio = disk_ratio   # used fraction of the commit log's partition
        self.latency = RequestLatencyCollector(latency, "broker")
        self.flush_latency = flush_latency

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
        b = self.broker
        cfg, stats, store = b.config, b.stats, b.store
        cluster, name = cfg.brokerClusterName, cfg.brokerName
        tl = ["cluster", "broker", "topic"]
        gl = ["cluster", "broker", "topic", "group"]

        put_tps = GaugeMetricFamily("rocketmq_producer_tps", "Messages stored per second, per topic (last minute)", labels=tl)
        put_size = GaugeMetricFamily("rocketmq_producer_message_size",
                                     "Bytes stored per second, per topic (last minute)", labels=tl)
        put_msgs = CounterMetricFamily("pocketmq_topic_put_messages", "Messages stored since start, per topic",
                                       labels=tl)
        put_bytes = CounterMetricFamily("pocketmq_topic_put_bytes", "Bytes stored since start, per topic", labels=tl)
        for topic, c in sorted(stats.put.items()):
            lv = [cluster, name, topic]
            put_tps.add_metric(lv, c.nums.in_minute().tps)
            put_size.add_metric(lv, c.size.in_minute().tps)
            put_msgs.add_metric(lv, c.msgs)
            put_bytes.add_metric(lv, c.bytes)
        yield from (put_tps, put_size, put_msgs, put_bytes)

        get_tps = GaugeMetricFamily("rocketmq_consumer_tps", "Messages pulled per second, per topic and group "
                                    "(last minute)", labels=gl)
        get_size = GaugeMetricFamily("rocketmq_consumer_message_size", "Bytes pulled per second, per topic and "
                                     "group (last minute)", labels=gl)
        get_msgs = CounterMetricFamily("pocketmq_group_get_messages", "Messages pulled since start, per topic and "
                                       "group", labels=gl)
        get_bytes = CounterMetricFamily("pocketmq_group_get_bytes", "Bytes pulled since start, per topic and group",
                                        labels=gl)
        for topic, groups in sorted(stats.get.items()):
            for group, c in sorted(groups.items()):
                lv = [cluster, name, topic, group]
                get_tps.add_metric(lv, c.nums.in_minute().tps)
                get_size.add_metric(lv, c.size.in_minute().tps)
                get_msgs.add_metric(lv, c.msgs)
                get_bytes.add_metric(lv, c.bytes)
        yield from (get_tps, get_size, get_msgs, get_bytes)

        yield from self._offsets(cluster, name, store)

        totals = [
            ("pocketmq_broker_put_messages", "Messages stored since start", stats.msg_put_total),
            ("pocketmq_broker_get_messages", "Messages pulled since start", stats.msg_get_total),
            ("pocketmq_pull_found", "Pull requests answered with messages", stats.get_found),
            ("pocketmq_pull_miss", "Pull requests answered without messages", stats.get_miss),
        ]
        for metric, doc, value in totals:
            f = CounterMetricFamily(metric, doc, labels=["cluster", "broker"])
            f.add_metric([cluster, name], value)
            yield f
        max_offset = store.commit_log_max_offset
        gauges = [
            ("rocketmq_broker_tps", "Messages stored per second (last 10 s)", stats.tps(1, 10)),
            ("rocketmq_broker_qps", "Messages pulled per second (last 10 s)", stats.tps(2, 10)),
            ("rocketmq_brokeruntime_commitlog_disk_ratio", "Used fraction of the commit log's disk partition",
             self.disk_ratio()),
            ("pocketmq_commitlog_min_offset", "First byte of the commit log still on disk", store.commit_log_min_offset),
            ("pocketmq_commitlog_max_offset", "End of the commit log (bytes ever written)", max_offset),
            ("pocketmq_store_size_bytes", "Commit log bytes on disk (max offset - min offset)",
             max_offset - store.commit_log_min_offset),
            ("pocketmq_dispatch_behind_bytes", "Commit log bytes not yet in the consume queues",
             max(0, max_offset - store.reput_from_offset)),
            ("pocketmq_flush_behind_bytes", "Commit log bytes not yet flushed",
             max(0, max_offset - store.flushed_offset)),
            ("pocketmq_held_pulls", "Pull requests parked for long polling", b.held_pulls.count),
            ("pocketmq_timer_messages_waiting", "Timer messages not delivered yet (RocketMQ 5's TIMER_*)",
             b.timer_service.waiting if getattr(b, "timer_service", None) is not None else 0),
            ("pocketmq_connections", "Open client connections",
             len(b.server.connections) if b.server is not None else 0),
        ]
        for metric, doc, value in gauges:
            f = GaugeMetricFamily(metric, doc, labels=["cluster", "broker"])
            f.add_metric([cluster, name], value)
            yield f
        h = self.flush_latency
        flush = HistogramMetricFamily("pocketmq_flush_latency_seconds", "Time one commit log flush (fdatasync) took",
                                      labels=["cluster", "broker"])
        flush.add_metric([cluster, name], h.buckets(), h.sum)
        yield flush
        yield from self._replication(cluster, name)
        yield from self._failover(cluster, name)
        yield from acl_metrics(getattr(b, "acl", None), ["cluster", "broker"], [cluster, name])
        yield from self.latency.collect()

    def _offsets(self, cluster, name, store):
        """Topic offsets and consumer lag: broker max offset - committed offset per queue."""
        from prometheus_client.core import GaugeMetricFamily
        b = self.broker
        produced = GaugeMetricFamily("rocketmq_producer_offset", "Sum of the topic's queue max offsets",
                                     labels=["cluster", "broker", "topic"])
        for topic in sorted(b.topics.topics):
            tc = b.topics.get(topic)
            produced.add_metric([cluster, name, topic],
                                sum(max(0, store.get_max_offset_in_queue(topic, q)) for q in range(tc.read_queue_nums)))
        yield produced
        diff = GaugeMetricFamily("rocketmq_group_diff", "Messages not consumed yet (committed offset to max offset), "
                                 "per group and topic", labels=["group", "topic", "countOfOnlineConsumers", "msgModel"])
        queue_lag = GaugeMetricFamily("pocketmq_consumer_queue_lag", "Messages not consumed yet, per queue",
                                      labels=["cluster", "broker", "group", "topic", "queue"])
        consumed = GaugeMetricFamily("rocketmq_consumer_offset", "Sum of the group's committed offsets",
                                     labels=["cluster", "broker", "topic", "group"])
        for key, queues in sorted(b.offsets.table.items()):
            topic, _, group = key.partition("@")   # topic@group; topic names cannot hold '@'
            tc = b.topics.get(topic)
            if tc is None:
                continue
            g = b.consumers.get(group)
            online = len(g.channels) if g is not None else 0
            model = g.message_model if g is not None else "CLUSTERING"
            total_lag = total_offset = 0
            for q in range(tc.read_queue_nums):
                committed = queues.get(q, -1)
                if committed < 0:
                    continue
                lag = max(0, store.get_max_offset_in_queue(topic, q) - committed)
                total_lag += lag
                total_offset += committed
                queue_lag.add_metric([cluster, name, group, topic, str(q)], lag)
            diff.add_metric([group, topic, str(online), model], total_lag)
            consumed.add_metric([cluster, name, topic, group], total_offset)
        yield from (diff, queue_lag, consumed)

    def _replication(self, cluster, name):
        """Replication, from the one HA view (broker/processors/ha_status.py): per slave on a
        master, the slave's own view on a slave; SYNC_MASTER's waits; bytes replicated."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
        b = self.broker
        if b.ctx is None or b.ctx.ha_status is None:
            return
        info = b.ctx.ha_status()
        bl = ["cluster", "broker"]
        if info["master"]:
            sl = bl + ["slave"]
            lag_bytes = GaugeMetricFamily("pocketmq_ha_slave_lag_bytes", "Commit-log bytes a slave has not "
                                          "acknowledged (master's max offset - its ack), per slave connection",
                                          labels=sl)
            lag_s = GaugeMetricFamily("pocketmq_ha_slave_lag_seconds", "Age of the oldest message a slave does "
                                      "not have (0: it has everything; -1: no ack yet)", labels=sl)
            in_sync = GaugeMetricFamily("pocketmq_ha_slave_in_sync", "1 when the slave is less than "
                                        "haMaxGapNotInSync behind", labels=sl)
            for c in info["haConnectionInfo"]:
                lv = [cluster, name, c["addr"]]
                lag_bytes.add_metric(lv, c["diff"])
                lag_s.add_metric(lv, c["lagMillis"] / 1000 if c["lagMillis"] >= 0 else -1)
                in_sync.add_metric(lv, 1 if c["inSync"] else 0)
            yield from (lag_bytes, lag_s, in_sync)
            yield from _broker_gauges(cluster, name, (
                ("pocketmq_ha_slaves", "Slaves connected to the HA port", len(info["haConnectionInfo"])),
                ("pocketmq_ha_in_sync_slaves", "Slaves less than haMaxGapNotInSync behind",
                 info["inSyncSlaveNums"]),
                ("pocketmq_ha_unreplicated_bytes", "Commit-log bytes no slave has acknowledged (Java's "
                 "slaveFallBehindMuch)", info.get("slaveFallBehindMuch", 0))))
            sent = CounterMetricFamily("pocketmq_ha_sent_bytes", "Commit-log bytes sent to slaves", labels=bl)
            sent.add_metric([cluster, name], info.get("bytesSent", 0))
            yield sent
            if b.ha_master is not None:
                h = b.ha_master.wait_latency
                wait = HistogramMetricFamily("pocketmq_ha_sync_wait_seconds", "Time a SYNC_MASTER send waited "
                                             "for a slave's ack (timeouts included)", labels=bl)
                wait.add_metric([cluster, name], h.buckets(), h.sum)
                yield wait
        else:
            hc = info["haClientRuntimeInfo"]
            lag_ms = hc["lagMillis"]
            yield from _broker_gauges(cluster, name, (
                ("pocketmq_ha_lag_bytes", "This slave's lag behind the master's stream position it has seen "
                 "(-1: none seen yet)", hc["lagBytes"]),
                ("pocketmq_ha_lag_seconds", "0 while this slave is connected, at its master's stream "
                 "position and heard from it within two heartbeats, else the time since the last frame "
                 "from its master (-1: none yet)",
                 lag_ms / 1000 if lag_ms >= 0 else -1),
                ("pocketmq_ha_connected", "1 while this slave's HA connection to its master is up",
                 1 if hc["isActivated"] else 0)))
            got = CounterMetricFamily("pocketmq_ha_received_bytes", "Commit-log bytes received from the master",
                                      labels=bl)
            got.add_metric([cluster, name], hc["bytesReceived"])
            yield got

    def _failover(self, cluster, name):
        """Controller mode (the broker runs under a FailoverAgent, broker/services/failover.py):
        the agent outlives the Broker it restarts at each role change, so its counters are
        the process's; labelled with the replica's own id (every replica has the group's name)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        link = self.broker.link
        if link is None:
            return
        agent = link.agent
        st = agent.status()
        labels = ["cluster", "broker", "replica"]
        lv = [cluster, name, str(agent.replica_id)]
        role = GaugeMetricFamily("pocketmq_failover_role", "1 for the role this replica runs in now (master, slave, "
                                 "or none: starting, between roles, or fenced without a master)",
                                 labels=labels + ["role"])
        for r in ("master", "slave", "none"):
            role.add_metric(lv + [r], 1 if st["role"] == r else 0)
        yield role
        store = self.broker.store
        confirm = store.confirm_offset
        last = st["lastElectionMillis"]
        for metric, doc, value in (
                ("pocketmq_failover_epoch", "The epoch this replica runs in (its master's)", st["epoch"]),
                ("pocketmq_failover_sync_state_set_size", "Members of the group's SyncStateSet as this replica "
                 "last read it", len(st["syncStateSet"])),
                ("pocketmq_failover_last_election_seconds", "How long the group was without a master before this "
                 "replica's last election win (-1: it never won one)", last / 1000 if last >= 0 else -1),
                ("pocketmq_failover_lease_valid", "1 while this replica's lease in the consensus store is sure "
                 "(a master without it acknowledges no send)", 1 if st["leaseValid"] else 0),
                ("pocketmq_failover_confirm_offset", "Commit-log offset consumers are served up to (what the "
                 "SyncStateSet holds; the log's end when no replica is awaited)",
                 store.commit_log_max_offset if confirm is None else confirm)):
            f = GaugeMetricFamily(metric, doc, labels=labels)
            f.add_metric(lv, value)
            yield f
        for metric, doc, value in (
                ("pocketmq_failover_elections_won", "Elections this replica won (a planned switchover to it is "
                 "not one)", agent.elections_won),
                ("pocketmq_failover_epoch_changes", "Epochs this replica entered, as master or slave (its first "
                 "included)", agent.epoch_changes)):
            f = CounterMetricFamily(metric, doc, labels=labels)
            f.add_metric(lv, value)
            yield f


def _broker_gauges(cluster: str, name: str, items):
    """One gauge family labelled (cluster, broker) per (metric, doc, value)."""
    from prometheus_client.core import GaugeMetricFamily
    for metric, doc, value in items:
        f = GaugeMetricFamily(metric, doc, labels=["cluster", "broker"])
        f.add_metric([cluster, name], value)
        yield f
