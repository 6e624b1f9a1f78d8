"""pocketmq's Python client for RocketMQ 4.x brokers: asyncio first, blocking facade in client.sync.

    from client import Producer, PushConsumer, LitePullConsumer, Message
"""
from client.errors import (
                           BrokerError,
                           ClientStateError,
                           InvalidArgumentError,
                           MessageTooLargeError,
                           MQClientError,
                           NoRouteError,
                           RemotingFailure,
                           RequestTimeoutError,
)
from client.lite_pull_consumer import LitePullConsumer
from client.message import Message, MessageExt, SendResult, SendStatus
from client.process_queue import FlowLimits
from client.producer import Producer
from client.push_consumer import (
                           CONSUME_SUCCESS,
                           RECONSUME_LATER,
                           ConsumeStatus,
                           PushConsumer,
)
from client.rebalance import (
                           AllocateAveragely,
                           AllocateAveragelyByCircle,
                           AllocateByConfig,
                           AllocateByMachineRoom,
                           AllocateConsistentHash,
)
from protocol.bodies import MessageQueue

__all__ = [
                           "CONSUME_SUCCESS",
                           "RECONSUME_LATER",
                           "AllocateAveragely",
                           "AllocateAveragelyByCircle",
                           "AllocateByConfig",
                           "AllocateByMachineRoom",
                           "AllocateConsistentHash",
                           "BrokerError",
                           "ClientStateError",
                           "ConsumeStatus",
                           "FlowLimits",
                           "InvalidArgumentError",
                           "LitePullConsumer",
                           "MQClientError",
                           "Message",
                           "MessageExt",
                           "MessageQueue",
                           "MessageTooLargeError",
                           "NoRouteError",
                           "Producer",
                           "PushConsumer",
                           "RemotingFailure",
                           "RequestTimeoutError",
                           "SendResult",
                           "SendStatus",
]
