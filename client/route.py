"""Route-derived views (pure): the queues a producer writes to and a consumer reads.

Built from TopicRouteData like Java's MQClientInstance.topicRouteData2TopicPublishInfo
and topicRouteData2TopicSubscribeInfo: only brokers with a master address,
writable queues for producers (`writeQueueNums`), readable ones for consumers
(`readQueueNums`). `orderTopicConf` ("broker-a:8;broker-b:8"), when present,
overrides the publish queues the way Java does.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pocketmq.protocol.bodies import MessageQueue, TopicRouteData
from pocketmq.protocol.codes import PermName

MASTER_ID = 0


@dataclass(slots=True)
class TopicPublishInfo:
    topic: str
    queues: list                                   # sorted MessageQueue list
    order_topic: bool = False
    send_which_queue: int = 0                       # round-robin cursor (Java ThreadLocalIndex)

    @property
    def ok(self) -> bool:
        return bool(self.queues)

    def next_index(self) -> int:
        i = self.send_which_queue
        self.send_which_queue = (i + 1) & 0x7FFFFFFF
        return i

    def select_one(self, last_broker_name: str | None = None) -> MessageQueue:
        """Round robin, skipping the broker that just failed when another exists."""
        n = len(self.queues)
        if last_broker_name is None:
            return self.queues[self.next_index() % n]
        for _ in range(n):
            mq = self.queues[self.next_index() % n]
            if mq.broker_name != last_broker_name:
                return mq
        return self.queues[self.next_index() % n]

    def queue_nums_of(self, broker_name: str) -> int:
        return sum(1 for q in self.queues if q.broker_name == broker_name)


def master_addrs(route: TopicRouteData) -> dict[str, str]:
    return {b.broker_name: b.broker_addrs[MASTER_ID] for b in route.broker_datas
            if MASTER_ID in b.broker_addrs}


def publish_info(topic: str, route: TopicRouteData) -> TopicPublishInfo:
    queues = []
    if route.order_topic_conf:
        for item in route.order_topic_conf.split(";"):
            name, _, nums = item.partition(":")
            if name and nums.strip().isdigit():
                queues.extend(MessageQueue(topic, name, i) for i in range(int(nums)))
        return TopicPublishInfo(topic, queues, order_topic=True)
    masters = master_addrs(route)
    for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
        if not PermName.writeable(qd.perm) or qd.broker_name not in masters:
            continue
        queues.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
    return TopicPublishInfo(topic, queues)


def subscribe_queues(topic: str, route: TopicRouteData) -> list[MessageQueue]:
    out = []
    for qd in route.queue_datas:
        if PermName.readable(qd.perm):
            out.extend(MessageQueue(topic, qd.broker_name, i) for i in range(qd.read_queue_nums))
    return sorted(out)


@dataclass(slots=True)
class BrokerAddrTable:
    """brokerName -> {brokerId: addr}, merged from every route we have seen."""
    table: dict = field(default_factory=dict)

    def update(self, route: TopicRouteData) -> None:
        for b in route.broker_datas:
            self.table[b.broker_name] = dict(b.broker_addrs)

    def master(self, broker_name: str) -> str | None:
        return self.table.get(broker_name, {}).get(MASTER_ID)

    def any_addr(self, broker_name: str) -> str | None:
        addrs = self.table.get(broker_name) or {}
        if MASTER_ID in addrs:
            return addrs[MASTER_ID]
        return addrs[min(addrs)] if addrs else None

    def all_masters(self) -> dict[str, str]:
        return {n: a[MASTER_ID] for n, a in self.table.items() if MASTER_ID in a}
