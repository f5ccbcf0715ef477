"""Team queues: guaranteed shares, borrowing and reclaim (the division every caller shares)."""

from tessera.policy.queues.division import (
    Division,
    DivisionError,
    QueueNode,
    children_of,
    divide,
    divide_with_reserves,
    headroom,
    own_share,
    quantize,
    water_fill,
)
from tessera.policy.queues.reclaim import Holding, Reclaim, ReclaimRule, plan_reclaim

__all__ = [
    "Division",
    "DivisionError",
    "Holding",
    "QueueNode",
    "Reclaim",
    "ReclaimRule",
    "children_of",
    "divide",
    "divide_with_reserves",
    "headroom",
    "own_share",
    "plan_reclaim",
    "quantize",
    "water_fill",
]
