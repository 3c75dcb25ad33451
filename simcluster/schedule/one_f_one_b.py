"""Non-interleaved 1F1B (PipeDream-Flush), exactly as Megatron orders it.

Source: Megatron-LM `forward_backward_pipelining_without_interleaving` in
`megatron/core/pipeline_parallel/schedules.py` (same logic since the 2021
`megatron/schedules.py`).
"""

from __future__ import annotations

from simcluster.schedule.ordering import Schedule, warmup_steady_cooldown
from simcluster.schedule.tasks import Phase, Task
from simcluster.schedule.validation import require_positive, require_stage


def one_f_one_b_warmup(num_stages: int, stage: int, num_microbatches: int, extra_warmup: int = 0) -> int:
    """Warm-up forwards on rank r: W = min(p − r − 1 + e, m) (Megatron's `num_warmup_microbatches`),
    e = `extra_warmup` (1 under the EP overlap's combined schedule, `schedule.build`)."""
    require_positive("num_microbatches", num_microbatches)
    require_stage(stage, num_stages)
    return min(num_stages - stage - 1 + extra_warmup, num_microbatches)


def one_f_one_b(num_stages: int, num_microbatches: int, extra_warmup: int = 0) -> Schedule:
    """Per-stage task order of Megatron's non-interleaved 1F1B
    (`forward_backward_pipelining_without_interleaving`).

    Rank r runs W = min(p − r − 1, m) forwards, then m − W pairs (forward of the next
    microbatch, backward of the oldest), then W backwards. Every task has chunk 0.
    Peak in-flight microbatches on rank r is min(p − r, m) (one more with `extra_warmup`).
    """
    require_positive("num_stages", num_stages)
    require_positive("num_microbatches", num_microbatches)
    forwards = [Task(Phase.FORWARD, mb, 0) for mb in range(num_microbatches)]
    backwards = [Task(Phase.BACKWARD, mb, 0) for mb in range(num_microbatches)]
    return tuple(
        warmup_steady_cooldown(
            forwards, backwards, one_f_one_b_warmup(num_stages, stage, num_microbatches, extra_warmup)
        )
        for stage in range(num_stages)
    )
