"""pocketmq: a pure-Python messaging system speaking Apache RocketMQ 4.x's wire protocol.

One import root. The packages under it (source folders at the top of the checkout,
mapped into this namespace by pyproject.toml; see docs/architecture.md):

    pocketmq.protocol     the wire format (pure)
    pocketmq.common       constants, config loading, atomic files (pure apart from file I/O)
    pocketmq.remoting     the asyncio transport shared by every role
    pocketmq.broker       the broker and its store (pocketmq.broker.store)
    pocketmq.nameserver   the name server
    pocketmq.client       the Python client (asyncio first; pocketmq.client.sync blocks)
    pocketmq.tools        mqadmin

The common client names are importable from here too:

    from pocketmq import Producer, PushConsumer, LitePullConsumer, Message

They are loaded on first use, so `import pocketmq.broker` does not import the client.
"""
from __future__ import annotations

# The one place the version is written: pyproject.toml reads it (dynamic version), installed
# metadata carries it, `pocketmq --version` and `mqadmin --version` print it.
__version__ = "0.1.0"

# The client's public names, re-exported lazily (PEP 562): a daemon importing
# pocketmq.broker must not pay for, or depend on, the client package.
_CLIENT_NAMES = frozenset({
    "CONSUME_SUCCESS", "RECONSUME_LATER", "AclDeniedError", "AllocateAveragely", "AllocateAveragelyByCircle",
    "AllocateByConfig", "AllocateByMachineRoom", "AllocateConsistentHash", "BrokerError",
    "ClientStateError", "ConsumeStatus", "Credentials", "FlowLimits", "InvalidArgumentError", "LitePullConsumer",
    "LitePullConsumerConfig", "PushConsumerConfig", "LocalTransactionState", "TransactionProducer",
    "TransactionSendResult", "MessageNotFoundError",
    "MQClientError", "Message", "MessageExt", "MessageQueue", "MessageSelector", "MessageTooLargeError", "NoRouteError",
    "Producer", "PushConsumer", "RemotingFailure", "RequestTimeoutError", "SendResult", "SendStatus",
    "SUSPEND_CURRENT_QUEUE_A_MOMENT",
})

__all__ = ["__version__", *sorted(_CLIENT_NAMES)]


def __getattr__(name: str):
    if name in _CLIENT_NAMES:
        from pocketmq import client
        value = getattr(client, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pocketmq' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _CLIENT_NAMES)
