"""Rebalance: pure allocation strategies and the per-topic plan."""
from pocketmq.client.rebalance.allocate import (  # noqa: F401
                                       AllocateAveragely,
                                       AllocateAveragelyByCircle,
                                       AllocateByConfig,
                                       AllocateByMachineRoom,
                                       AllocateConsistentHash,
                                       AllocateError,
                                       AllocateStrategy,
                                       strategy_by_name,
)
from pocketmq.client.rebalance.plan import RebalancePlan, plan_broadcasting, plan_clustering  # noqa: F401
