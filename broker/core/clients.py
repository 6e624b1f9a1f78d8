"""Producer and consumer registries (pure; channels are opaque hashable keys).

Consumers are keyed by channel (connection) with their clientID, language and
version. A group's subscription table follows the latest heartbeat of any
member: topics missing from it are removed, new ones added, an existing one
replaced only when its subVersion is larger. `register_consumer` reports
whether the group's membership or topic set changed, which is when the broker
sends NOTIFY_CONSUMER_IDS_CHANGED to every member (reference 4.4).
Channels not heard from for `channel_expired_ms` are dropped by `expire`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

CHANNEL_EXPIRED_MS = 120_000


@dataclass(slots=True)
class ClientChannelInfo:
    client_id: str
    language: int          # remoting LanguageCode (a gRPC client's UA language mapped onto it)
    version: int           # MQVersion ordinal
    remote_addr: str
    last_update_ms: int
    # a RocketMQ 5.x client on the gRPC endpoint (broker/proxy): "grpc", its ClientType, and
    # its user agent's language and version as it said them (NODE_JS has no LanguageCode;
    # "1.0.8" no MQVersion)
    protocol: str = "remoting"
    client_type: str = ""
    language_name: str = ""
    version_text: str = ""


@dataclass(slots=True)
class ConsumerGroupInfo:
    group: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    channels: dict = field(default_factory=dict)        # channel -> ClientChannelInfo
    subscriptions: dict = field(default_factory=dict)   # topic -> SubscriptionData
    last_update_ms: int = 0

    def client_ids(self) -> list[str]:
        return [c.client_id for c in self.channels.values()]


class ConsumerManager:
    def __init__(self, channel_expired_ms: int = CHANNEL_EXPIRED_MS):
        self.groups: dict[str, ConsumerGroupInfo] = {}
        self.channel_expired_ms = channel_expired_ms

    def register(self, group: str, channel, info: ClientChannelInfo, consume_type: str, message_model: str,
                 consume_from_where: str, subscriptions: list, now_ms: int) -> bool:
        g = self.groups.get(group)
        if g is None:
            g = self.groups[group] = ConsumerGroupInfo(group)
        changed = False
        old = g.channels.get(channel)
        if old is None or old.client_id != info.client_id:
            changed = True
        g.channels[channel] = info
        if g.consume_type != consume_type or g.message_model != message_model:
            if old is not None or len(g.channels) > 1:
                changed = True
            g.consume_type = consume_type
            g.message_model = message_model
        g.consume_from_where = consume_from_where
        new_topics = {s.topic: s for s in subscriptions}
        for topic, sub in new_topics.items():
            cur = g.subscriptions.get(topic)
            if cur is None:
                g.subscriptions[topic] = sub
                changed = True
            elif sub.sub_version > cur.sub_version:
                g.subscriptions[topic] = sub
        for topic in [t for t in g.subscriptions if t not in new_topics]:
            del g.subscriptions[topic]
            changed = True
        g.last_update_ms = now_ms
        return changed

    def unregister(self, group: str, channel) -> bool:
        g = self.groups.get(group)
        if g is None or g.channels.pop(channel, None) is None:
            return False
        if not g.channels:
            del self.groups[group]
        return True

    def remove_channel(self, channel) -> list[str]:
        """A connection closed: drop it everywhere; returns the groups it left."""
        left = []
        for name in list(self.groups):
            if self.unregister(name, channel):
                left.append(name)
        return left

    def expire(self, now_ms: int) -> list[tuple[str, object]]:
        removed = []
        for name, g in list(self.groups.items()):
            for ch, info in list(g.channels.items()):
                if now_ms - info.last_update_ms > self.channel_expired_ms:
                    removed.append((name, ch))
                    self.unregister(name, ch)
        return removed

    def get(self, group: str) -> ConsumerGroupInfo | None:
        return self.groups.get(group)

    def find_subscription(self, group: str, topic: str):
        g = self.groups.get(group)
        return None if g is None else g.subscriptions.get(topic)

    def groups_subscribing(self, topic: str) -> set[str]:
        return {n for n, g in self.groups.items() if topic in g.subscriptions}


class ProducerManager:
    def __init__(self, channel_expired_ms: int = CHANNEL_EXPIRED_MS):
        self.groups: dict[str, dict] = {}  # group -> channel -> ClientChannelInfo
        self.channel_expired_ms = channel_expired_ms

    def register(self, group: str, channel, info: ClientChannelInfo) -> None:
        self.groups.setdefault(group, {})[channel] = info

    def unregister(self, group: str, channel) -> None:
        chans = self.groups.get(group)
        if chans is not None:
            chans.pop(channel, None)
            if not chans:
                del self.groups[group]

    def remove_channel(self, channel) -> None:
        for g in list(self.groups):
            self.unregister(g, channel)

    def expire(self, now_ms: int) -> list:
        removed = []
        for g, chans in list(self.groups.items()):
            for ch, info in list(chans.items()):
                if now_ms - info.last_update_ms > self.channel_expired_ms:
                    removed.append((g, ch))
                    self.unregister(g, ch)
        return removed
