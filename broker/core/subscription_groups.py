"""Subscription group configs (pure): the table, its rules, subscriptionGroup.json.

A group is auto-created with Java's defaults on first use when
autoCreateSubscriptionGroup is on; UPDATE_AND_CREATE_SUBSCRIPTIONGROUP replaces a
group's whole config (as Java's does: nothing is merged), DELETE_SUBSCRIPTIONGROUP
drops it. Honoured by CONSUMER_SEND_MSG_BACK (retryMaxTimes, retryQueueNums) and
PULL_MESSAGE (consumeEnable, consumeBroadcastEnable).
"""
from __future__ import annotations

import json

from pocketmq.common.constants import GROUP_MAX_LENGTH, VALID_NAME_RE
from pocketmq.protocol.bodies import (DataVersion, SubscriptionGroupConfig, decode_subscription_group_wrapper,
                                      encode_subscription_group_wrapper, loads)

__all__ = ["SubscriptionGroupConfig", "SubscriptionGroupManager", "validate_group_config", "GROUP_MAX_LENGTH",
           "RETRY_QUEUE_NUMS_MAX"]

# A retry topic is an ordinary topic: the same bound as readQueueNums/writeQueueNums.
RETRY_QUEUE_NUMS_MAX = 1024


def validate_group_config(cfg: SubscriptionGroupConfig) -> str | None:
    """None when `cfg` can be stored, else the remark naming what is wrong."""
    name = cfg.groupName
    if not VALID_NAME_RE.fullmatch(name):
        return f"the group name[{name}] contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
    if len(name) > GROUP_MAX_LENGTH:
        return f"the group name is longer than {GROUP_MAX_LENGTH} characters"
    if not 0 <= cfg.retryQueueNums <= RETRY_QUEUE_NUMS_MAX:
        return f"retryQueueNums must be in 0..{RETRY_QUEUE_NUMS_MAX}, got {cfg.retryQueueNums}"
    if cfg.retryMaxTimes < 0:
        return f"retryMaxTimes must be >= 0, got {cfg.retryMaxTimes}"
    if cfg.brokerId < 0 or cfg.whichBrokerWhenConsumeSlowly < 0:
        return "brokerId and whichBrokerWhenConsumeSlowly must be >= 0"
    return None


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
        return json.dumps(encode_subscription_group_wrapper(dict(sorted(self.table.items())), self.data_version),
                          indent=1).encode()

    def load(self, data: bytes) -> None:
        groups, version = decode_subscription_group_wrapper(loads(data))
        self.table.update(groups)
        self.data_version = version
