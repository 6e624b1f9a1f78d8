"""Rebalance: pure allocation strategies and the per-topic plan."""
from client.rebalance.allocate import (AllocateAveragely, AllocateAveragelyByCircle,  # noqa: F401
                                       AllocateByConfig, AllocateByMachineRoom,
                                       AllocateConsistentHash, AllocateError, AllocateStrategy,
                                       strategy_by_name)
from client.rebalance.plan import RebalancePlan, plan_broadcasting, plan_clustering  # noqa: F401
