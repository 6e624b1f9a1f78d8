"""pocketmq's Python client for RocketMQ 4.x brokers: asyncio first, blocking facade in pocketmq.client.sync.

    from pocketmq.client import Producer, PushConsumer, LitePullConsumer, Message, MessageSelector
    from pocketmq.client import TransactionProducer, LocalTransactionState
"""
from pocketmq.client.consumer_config import LitePullConsumerConfig, PushConsumerConfig
from pocketmq.client.credentials import Credentials
from pocketmq.client.errors import (
    AclDeniedError,
    BrokerError,
    ClientStateError,
    InvalidArgumentError,
    MessageNotFoundError,
    MessageTooLargeError,
    MQClientError,
    NoRouteError,
    RemotingFailure,
    RequestTimeoutError,
)
from pocketmq.client.lite_pull_consumer import LitePullConsumer
from pocketmq.client.message import Message, MessageExt, SendResult, SendStatus
from pocketmq.client.process_queue import FlowLimits
from pocketmq.client.producer import Producer
from pocketmq.client.push_consumer import (
    CONSUME_SUCCESS,
    RECONSUME_LATER,
    SUSPEND_CURRENT_QUEUE_A_MOMENT,
    ConsumeStatus,
    PushConsumer,
)
from pocketmq.client.rebalance import (
    AllocateAveragely,
    AllocateAveragelyByCircle,
    AllocateByConfig,
    AllocateByMachineRoom,
    AllocateConsistentHash,
)
from pocketmq.client.selector import MessageSelector
from pocketmq.client.transaction_producer import (
    LocalTransactionState,
    TransactionProducer,
    TransactionSendResult,
)
from pocketmq.protocol.bodies import MessageQueue

__all__ = [
    "CONSUME_SUCCESS",
    "RECONSUME_LATER",
    "SUSPEND_CURRENT_QUEUE_A_MOMENT",
    "AclDeniedError",
    "AllocateAveragely",
    "AllocateAveragelyByCircle",
    "AllocateByConfig",
    "AllocateByMachineRoom",
    "AllocateConsistentHash",
    "BrokerError",
    "ClientStateError",
    "ConsumeStatus",
    "Credentials",
    "FlowLimits",
    "InvalidArgumentError",
    "LitePullConsumer",
    "LitePullConsumerConfig",
    "LocalTransactionState",
    "MQClientError",
    "Message",
    "MessageExt",
    "MessageQueue",
    "MessageSelector",
    "MessageNotFoundError",
    "MessageTooLargeError",
    "NoRouteError",
    "Producer",
    "PushConsumer",
    "PushConsumerConfig",
    "RemotingFailure",
    "RequestTimeoutError",
    "SendResult",
    "SendStatus",
    "TransactionProducer",
    "TransactionSendResult",
]
