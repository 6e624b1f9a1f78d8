"""Route-derived views (pure): the queues a producer writes to and a consumer reads.

Built from TopicRouteData like Java's MQClientInstance.topicRouteData2TopicPublishInfo
and topicRouteData2TopicSubscribeInfo: only brokers with a master address,
writable queues for producers (`writeQueueNums`), readable ones for consumers
(`readQueueNums`; a group whose master is down stays readable from its slaves).
`orderTopicConf` ("broker-a:8;broker-b:8"), when present, overrides the publish
queues the way Java does. Which member of a group a request goes to is
client.replica's rule; BrokerAddrTable applies it to the members the routes show.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pocketmq.client.replica import (
    MASTER_ID,
    BrokerChanges,
    broker_changes,
    find_broker_address_in_admin,
    find_broker_address_in_subscribe,
)
from pocketmq.protocol.bodies import MessageQueue, TopicRouteData
from pocketmq.protocol.codes import PermName


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

    def update(self, route: TopicRouteData) -> BrokerChanges:
        """Take the route's members of each group it names (the newest view wins); returns
        what changed (client.replica.broker_changes)."""
        new = {b.broker_name: dict(b.broker_addrs) for b in route.broker_datas}
        changes = broker_changes(self.table, new)
        self.table.update(new)
        return changes

    def master(self, broker_name: str) -> str | None:
        return self.table.get(broker_name, {}).get(MASTER_ID)

    def any_addr(self, broker_name: str) -> str | None:
        found = find_broker_address_in_admin(self.table.get(broker_name) or {})
        return None if found is None else found[0]

    def find_broker_address_in_admin(self, broker_name: str) -> tuple[str, int] | None:
        """(address, broker id) for offsets and queue bounds: the master, else a slave."""
        return find_broker_address_in_admin(self.table.get(broker_name) or {})

    def find_broker_address_in_subscribe(self, broker_name: str, broker_id: int) -> tuple[str, int] | None:
        """(address, broker id) to pull from: member `broker_id`, else the master, else a slave."""
        return find_broker_address_in_subscribe(self.table.get(broker_name) or {}, broker_id)

    def all_masters(self) -> dict[str, str]:
        return {n: a[MASTER_ID] for n, a in self.table.items() if MASTER_ID in a}
