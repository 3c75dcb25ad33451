"""Dispatch from a scenario's schedule choice to the per-stage task order."""

from __future__ import annotations

from simcluster.config.choices import ScheduleKind
from simcluster.schedule.gpipe import gpipe, gpipe_warmup
from simcluster.schedule.interleaved import interleaved_one_f_one_b, interleaved_warmup
from simcluster.schedule.one_f_one_b import one_f_one_b, one_f_one_b_warmup
from simcluster.schedule.ordering import Schedule, StageTasks
from simcluster.schedule.validation import require_positive, require_stage


def build_schedule(
    kind: ScheduleKind, num_stages: int, num_microbatches: int, num_chunks: int, extra_warmup: int = 0
) -> Schedule:
    """Per-stage ordered tasks for `kind`; 1F1B with num_chunks > 1 is Megatron's
    interleaved schedule (Megatron-core `pipeline_parallel/schedules.py`). `extra_warmup`
    more warm-up forwards per stage (capped at every forward): 1 under the EP overlap
    (`ep_overlap_extra_warmup`); GPipe, all warm-up already, ignores it."""
    require_positive("num_chunks", num_chunks)
    if kind is ScheduleKind.GPIPE:
        return gpipe(num_stages, num_microbatches, num_chunks)
    if kind is ScheduleKind.ONE_F_ONE_B:
        if num_chunks == 1:
            return one_f_one_b(num_stages, num_microbatches, extra_warmup)
        return interleaved_one_f_one_b(num_stages, num_microbatches, num_chunks, extra_warmup)
    raise ValueError(f"unknown schedule kind {kind!r}")


def warmup_microbatches(
    kind: ScheduleKind, num_stages: int, stage: int, num_microbatches: int, num_chunks: int,
    extra_warmup: int = 0,
) -> int:  # fmt: skip
    """Chunk-forwards `stage` runs before its first backward: min(p − r − 1 + e, m) for
    1F1B (§4.1), min((p − r − 1)·2 + (v − 1)·p + e, m·v) for interleaved (§4.2), m·v for
    GPipe; e = `extra_warmup`."""
    require_positive("num_chunks", num_chunks)
    require_stage(stage, num_stages)
    if kind is ScheduleKind.GPIPE:
        return gpipe_warmup(num_microbatches, num_chunks)
    if kind is ScheduleKind.ONE_F_ONE_B:
        if num_chunks == 1:
            return one_f_one_b_warmup(num_stages, stage, num_microbatches, extra_warmup)
        return interleaved_warmup(num_stages, stage, num_microbatches, num_chunks, extra_warmup)
    raise ValueError(f"unknown schedule kind {kind!r}")


def ep_overlap_extra_warmup(ep_overlap: bool) -> int:
    """The warm-up forwards the EP overlap adds: one. Megatron-core's combined 1F1B
    schedule runs "one extra micro-batch forward step before the 1f1b stages ... to ensure
    the forward and backward computations are independent in all 1f1b steps"
    (`get_pp_rank_microbatches`, megatron/core/pipeline_parallel/schedules.py, Megatron-LM
    @d98e8a64ddf34856e74b24714e3bedb2f5a39553); without a pipeline,
    `combined_1f1b_schedule_for_no_pipelining` (combined_1f1b.py) runs microbatch 0's forward
    alone, then forward i + 1 with backward i: the same order with one warm-up forward."""
    return 1 if ep_overlap else 0


def unpaired_positions(stage_tasks: StageTasks, num_warmup: int) -> frozenset[int]:
    """Positions of a warm-up / steady / cooldown order (`ordering.warmup_steady_cooldown`)
    that run alone: the W warm-up forwards and the W cooldown backwards. Every other
    forward is paired with the backward after it (Megatron's 1F1B steady state), which the
    EP overlap runs as one combined step (`costs.ep_overlap`). All of them when W covers
    every forward (GPipe, or m·v ≤ W)."""
    n = len(stage_tasks)
    warmup = min(num_warmup, n // 2)
    return frozenset((*range(warmup), *range(n - warmup, n)))
