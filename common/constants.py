"""Domain constants every role shares (RocketMQ's `common.MixAll`, `TopicValidator`, `UtilAll`).

One owner: the broker, the nameserver, the client and the tools import these names;
nobody retypes "%RETRY%" or 20. Pure: no I/O.
"""
from __future__ import annotations

import re

from pocketmq.protocol.message import RETRY_GROUP_TOPIC_PREFIX  # noqa: F401 (owned by the record decoder)

# --- system topics (RocketMQ 4.9 TopicValidator / MixAll) -------------------------------------
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"          # template of auto-created topics
DEFAULT_TOPIC_QUEUE_NUMS = 4                    # a producer's queue count for an auto-created topic
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"          # delayed messages wait here, queue = level - 1
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
BENCHMARK_TOPIC = "BenchmarkTest"
OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"   # half messages discarded after transactionCheckMax
# the transaction check service's progress: its consumer offsets in the half and op topics
TRANS_CHECK_GROUP = "CID_RMQ_SYS_TRANS"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
# RocketMQ 5's TimerMessageStore.TIMER_TOPIC: timer messages wait here (queue 0), the timer's
# checkpoints follow them (queue 1); broker/core/timer.py
TIMER_TOPIC = "rmq_sys_wheel_timer"
# Topics a client may not send to (the broker answers NO_PERMISSION).
NOT_ALLOWED_SEND_TOPICS = frozenset({SCHEDULE_TOPIC, TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC,
                                     TRANS_CHECK_MAX_TIME_TOPIC, SELF_TEST_TOPIC, OFFSET_MOVED_EVENT,
                                     TIMER_TOPIC})
# The name rules (Java's TopicValidator.VALID_PATTERN_STR for topics and groups, 127/255
# characters; clientId and brokerName printable ASCII) are owned by protocol.names, whose
# decoders check names where they enter; re-exported here with the other domain constants.
from pocketmq.protocol.names import (  # noqa: E402,F401
    BROKER as NAME_BROKER,
    CLIENT_ID as NAME_CLIENT_ID,
    GROUP as NAME_GROUP,
    GROUP_MAX_LENGTH,
    TOPIC as NAME_TOPIC,
    TOPIC_MAX_LENGTH,
    VALID_NAME_CHARS,
    VALID_NAME_RE,
    name_error,
)
DEFAULT_CONSUMER_GROUP = "DEFAULT_CONSUMER"


def retry_topic(group: str) -> str:
    """`%RETRY%<group>`: where a consumer group's failed messages wait for redelivery."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    """`%DLQ%<group>`: where messages go after the group's last retry."""
    return DLQ_GROUP_TOPIC_PREFIX + group


# --- POP consumption (RocketMQ 5.x PopAckConstants / KeyBuilder) ------------------------------
# Pop checkpoints and acks are records of this system topic (one per cluster, queue 0), so
# the broker rebuilds its pop state from the CommitLog (broker/core/pop_log.py).
REVIVE_LOG_TOPIC_PREFIX = "rmq_sys_REVIVE_LOG_"
# the revive log's progress: its consumer offset in consumerOffset.json, the record from
# which a restart replays the log (every checkpoint before it is resolved)
REVIVE_GROUP = "CID_RMQ_SYS_REVIVE_GROUP"
# a receipt handle's reviveQid for an orderly (FIFO) pop, as RocketMQ's POP_ORDER_REVIVE_QUEUE
POP_ORDER_REVIVE_QUEUE = 999


def revive_topic(cluster: str) -> str:
    """`rmq_sys_REVIVE_LOG_<cluster>`: where a broker writes its pop checkpoints and acks."""
    return REVIVE_LOG_TOPIC_PREFIX + cluster


def pop_retry_topic(group: str, topic: str) -> str:
    """`%RETRY%<group>_<topic>`: where a POP group's unacknowledged messages of `topic` wait
    for redelivery (RocketMQ's buildPopRetryTopicV1: one per topic, so a pop of one topic
    never receives another topic's retries)."""
    return f"{RETRY_GROUP_TOPIC_PREFIX}{group}_{topic}"


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(DLQ_GROUP_TOPIC_PREFIX)


# --- store unit sizes -----------------------------------------------------------------------
CQ_UNIT_SIZE = 20                 # one consume-queue unit: commit_log_offset q, size i, tags_code q
CQ_FILLER_SIZE = 0x7FFFFFFF       # size field of a filler unit (a hole left by a truncated queue)

# --- broker statistics: Java's BrokerStatsManager names (VIEW_BROKER_STATS_DATA statsName) -------
# Keys: a topic for TOPIC_*, "topic@group" for GROUP_*, the cluster name for BROKER_*.
TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
BROKER_GET_NUMS = "BROKER_GET_NUMS"

# --- delay levels ---------------------------------------------------------------------------
DEFAULT_MESSAGE_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_DELAY_LEVEL_RE = re.compile(r"(\d+)([smhd])")
_DELAY_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(spec: str) -> tuple[int, ...]:
    """`messageDelayLevel` -> milliseconds: "1s 5s 1m 2h" -> (1000, 5000, 60000, 7200000).

    Level n is element n-1. Raises ValueError naming the bad token (Java refuses to
    start on one too), or when there is no level at all."""
    levels = []
    for token in spec.split():
        match = _DELAY_LEVEL_RE.fullmatch(token)
        if match is None:
            raise ValueError(f"bad delay level {token!r}; expected e.g. '1s 5s 10s 30s 1m 2h 1d'")
        levels.append(int(match.group(1)) * _DELAY_UNIT_MS[match.group(2)])
    if not levels:
        raise ValueError("needs at least one delay level")
    return tuple(levels)
