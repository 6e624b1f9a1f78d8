"""Topic configuration table (pure): system topics, auto-creation, validation.

Rules from RocketMQ 4.9 (reference 8.2, 8.3): names match ^[%|a-zA-Z0-9_-]+$
and are at most 127 characters; some system topics cannot be sent to; a send
to an unknown topic creates it from `defaultTopic` (normally TBW102) when that
topic has the INHERIT permission; `%RETRY%` topics are created with one queue.
Every change bumps the DataVersion so the broker re-registers at once.
"""
from __future__ import annotations


from pocketmq.common.constants import (AUTO_CREATE_TOPIC_KEY_TOPIC, BENCHMARK_TOPIC, NOT_ALLOWED_SEND_TOPICS, OFFSET_MOVED_EVENT, RETRY_GROUP_TOPIC_PREFIX,
                                       SCHEDULE_TOPIC, SELF_TEST_TOPIC, TOPIC_MAX_LENGTH, TRACE_TOPIC,
                                       VALID_NAME_RE)
from pocketmq.protocol.bodies import DataVersion, TopicConfig, decode_topic_config_wrapper, encode_topic_config_wrapper, loads
from pocketmq.protocol.codes import PermName



def validate_topic(topic: str | None) -> str | None:
    """Return None when valid, else the RocketMQ error remark."""
    if topic is None or not topic.strip():
        return "The specified topic is blank."
    if not VALID_NAME_RE.fullmatch(topic):   # match() would accept a trailing newline
        return "The specified topic[%s] contains illegal characters, allowing only ^[%%|a-zA-Z0-9_-]+$" % topic
    if len(topic) > TOPIC_MAX_LENGTH:
        return "The specified topic is longer than topic max length."
    return None


class TopicConfigManager:
    def __init__(self, *, cluster_name: str, broker_name: str, auto_create_topic_enable: bool,
                 default_topic_queue_nums: int, cluster_topic_enable: bool = True,
                 broker_topic_enable: bool = True, trace_topic_enable: bool = False):
        self.cluster_name = cluster_name
        self.broker_name = broker_name
        self.auto_create_topic_enable = auto_create_topic_enable
        self.default_topic_queue_nums = default_topic_queue_nums
        self.topics: dict[str, TopicConfig] = {}
        self.data_version = DataVersion()
        self.system_topics: set[str] = set()
        rw = PermName.READ | PermName.WRITE
        self._system(SELF_TEST_TOPIC, 1, rw)
        if auto_create_topic_enable:
            self._system(AUTO_CREATE_TOPIC_KEY_TOPIC, default_topic_queue_nums, rw | PermName.INHERIT)
        self._system(BENCHMARK_TOPIC, 1024, rw)
        self._system(cluster_name, 16, PermName.INHERIT | (rw if cluster_topic_enable else 0))
        self._system(broker_name, 1, PermName.INHERIT | (rw if broker_topic_enable else 0))
        self._system(OFFSET_MOVED_EVENT, 1, rw)
        self._system(SCHEDULE_TOPIC, 18, rw)
        if trace_topic_enable:
            self._system(TRACE_TOPIC, 1, rw)
        self._system(f"{cluster_name}_REPLY_TOPIC", 1, rw)

    def _system(self, name: str, queues: int, perm: int) -> None:
        self.topics[name] = TopicConfig(name, queues, queues, perm)
        self.system_topics.add(name)

    def is_system_topic(self, topic: str) -> bool:
        return topic in self.system_topics or topic == TRACE_TOPIC or topic.startswith("rmq_sys_") \
            or topic in NOT_ALLOWED_SEND_TOPICS

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def bump(self, now_ms: int) -> None:
        self.data_version = self.data_version.next_version(now_ms)

    def create_from_default(self, topic: str, default_topic: str, queue_nums: int,
                            now_ms: int) -> TopicConfig | None:
        """SEND to an unknown topic: inherit from `default_topic` if it allows it."""
        existing = self.topics.get(topic)
        if existing is not None:
            return existing
        default = self.topics.get(default_topic)
        if default is not None and default_topic == AUTO_CREATE_TOPIC_KEY_TOPIC and not self.auto_create_topic_enable:
            default = None
        if default is not None and default.perm & PermName.INHERIT:
            n = max(1, min(queue_nums, default.write_queue_nums))
            tc = TopicConfig(topic, n, n, default.perm & ~PermName.INHERIT, default.topic_filter_type)
        elif topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            tc = TopicConfig(topic, 1, 1, PermName.READ | PermName.WRITE)
        else:
            return None
        self.topics[topic] = tc
        self.bump(now_ms)
        return tc

    def create_retry_or_dlq(self, topic: str, queue_nums: int, perm: int, now_ms: int) -> TopicConfig:
        tc = self.topics.get(topic)
        if tc is None:
            tc = TopicConfig(topic, queue_nums, queue_nums, perm)
            self.topics[topic] = tc
            self.bump(now_ms)
        return tc

    def update(self, tc: TopicConfig, now_ms: int) -> None:
        self.topics[tc.topic_name] = tc
        self.bump(now_ms)

    def delete(self, topic: str, now_ms: int) -> bool:
        if self.topics.pop(topic, None) is None:
            return False
        self.bump(now_ms)
        return True

    # -- persistence (topics.json) -------------------------------------------------------
    def encode(self) -> bytes:
        import json
        return json.dumps(encode_topic_config_wrapper(self.topics, self.data_version), indent=1,
                          sort_keys=True).encode()

    def load(self, data: bytes) -> None:
        topics, version = decode_topic_config_wrapper(loads(data))
        # Persisted configs win over defaults, except that system topics keep existing.
        self.topics.update(topics)
        self.data_version = version
