"""The warm-up / steady / cooldown shape every Megatron pipeline schedule shares.

Megatron-core `pipeline_parallel/schedules.py` (1F1B, interleaved or not): a rank runs
`num_warmup` forwards, then alternates one forward with one backward (the oldest
outstanding one) while forwards remain, then runs the remaining backwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from simcluster.schedule.tasks import Task

StageTasks: TypeAlias = tuple[Task, ...]
"""The ordered tasks one pipeline stage (rank) executes in one iteration."""

Schedule: TypeAlias = tuple[StageTasks, ...]
"""One `StageTasks` per pipeline stage, indexed by pipeline rank."""


def warmup_steady_cooldown(
    forwards: Sequence[Task], backwards: Sequence[Task], num_warmup: int
) -> StageTasks:
    """Order one stage: forwards[:W], then (forwards[W+k], backwards[k]) pairs for
    k < M − W, then backwards[M−W:], with M = len(forwards) = len(backwards).

    `backwards[k]` is the backward Megatron runs k-th
    (`forward_backward_pipelining_without_interleaving`'s steady state: forward of the next
    microbatch, then backward of the oldest).
    """
    num_total = len(forwards)
    num_steady = num_total - num_warmup
    order: list[Task] = list(forwards[:num_warmup])
    for k in range(num_steady):
        order.append(forwards[k + num_warmup])
        order.append(backwards[k])
    order.extend(backwards[num_steady:])
    return tuple(order)
