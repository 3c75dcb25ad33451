"""`simcluster plan`: the fastest layouts of a model on N GPUs that fit in memory, found by
a bound-pruned exact search over Megatron's layouts (see `search`)."""

from simcluster.plan.search import (
    DEFAULT_HEADROOM_FRACTION,
    PlanCandidate,
    PlanResult,
    capacity_bytes,
    plan_layouts,
)
from simcluster.plan.space import PLAN_AXES, PlanError

__all__ = [
    "DEFAULT_HEADROOM_FRACTION",
    "PLAN_AXES",
    "PlanCandidate",
    "PlanError",
    "PlanResult",
    "capacity_bytes",
    "plan_layouts",
]
