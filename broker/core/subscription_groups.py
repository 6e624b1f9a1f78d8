"""Subscription group configs (pure); auto-created on first use when enabled."""
from __future__ import annotations

import json
from dataclasses import dataclass, asdict

from pocketmq.protocol.bodies import DataVersion, loads


@dataclass(slots=True)
class SubscriptionGroupConfig:
    groupName: str
    consumeEnable: bool = True
    consumeFromMinEnable: bool = True
    consumeBroadcastEnable: bool = True
    retryQueueNums: int = 1
    retryMaxTimes: int = 16
    brokerId: int = 0
    whichBrokerWhenConsumeSlowly: int = 1
    notifyConsumerIdsChangedEnable: bool = True

    def to_json(self) -> dict:
        return asdict(self)


class SubscriptionGroupManager:
    def __init__(self, auto_create: bool = True):
        self.auto_create = auto_create
        self.table: dict[str, SubscriptionGroupConfig] = {}
        self.data_version = DataVersion()
        self.dirty = False

    def find(self, group: str, now_ms: int = 0) -> SubscriptionGroupConfig | None:
        cfg = self.table.get(group)
        if cfg is None and self.auto_create:
            cfg = SubscriptionGroupConfig(group)
            self.table[group] = cfg
            self.data_version = self.data_version.next_version(now_ms)
            self.dirty = True
        return cfg

    def update(self, cfg: SubscriptionGroupConfig, now_ms: int) -> None:
        self.table[cfg.groupName] = cfg
        self.data_version = self.data_version.next_version(now_ms)
        self.dirty = True

    def delete(self, group: str, now_ms: int) -> bool:
        if self.table.pop(group, None) is None:
            return False
        self.data_version = self.data_version.next_version(now_ms)
        self.dirty = True
        return True

    def encode(self) -> bytes:
        return json.dumps({"dataVersion": self.data_version.to_json(),
                           "subscriptionGroupTable": {g: c.to_json() for g, c in sorted(self.table.items())}},
                          indent=1).encode()

    def load(self, data: bytes) -> None:
        d = loads(data)
        known = set(SubscriptionGroupConfig.__dataclass_fields__)
        for g, c in (d.get("subscriptionGroupTable") or {}).items():
            self.table[str(g)] = SubscriptionGroupConfig(**{k: v for k, v in c.items() if k in known})
        self.data_version = DataVersion.from_json(d.get("dataVersion"))
