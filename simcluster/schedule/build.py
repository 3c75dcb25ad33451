"""Dispatch from a scenario's schedule choice to the per-stage task order."""

from __future__ import annotations

from simcluster.config.choices import ScheduleKind
from simcluster.schedule.gpipe import gpipe, gpipe_warmup
from simcluster.schedule.interleaved import interleaved_one_f_one_b, interleaved_warmup
from simcluster.schedule.one_f_one_b import one_f_one_b, one_f_one_b_warmup
from simcluster.schedule.ordering import Schedule
from simcluster.schedule.validation import require_positive, require_stage


def build_schedule(kind: ScheduleKind, num_stages: int, num_microbatches: int, num_chunks: int) -> Schedule:
    """Per-stage ordered tasks for `kind`; 1F1B with num_chunks > 1 is Megatron's
    interleaved schedule (Megatron-core `pipeline_parallel/schedules.py`)."""
    require_positive("num_chunks", num_chunks)
    if kind is ScheduleKind.GPIPE:
        return gpipe(num_stages, num_microbatches, num_chunks)
    if kind is ScheduleKind.ONE_F_ONE_B:
        if num_chunks == 1:
            return one_f_one_b(num_stages, num_microbatches)
        return interleaved_one_f_one_b(num_stages, num_microbatches, num_chunks)
    raise ValueError(f"unknown schedule kind {kind!r}")


def warmup_microbatches(
    kind: ScheduleKind, num_stages: int, stage: int, num_microbatches: int, num_chunks: int
) -> int:
    """Chunk-forwards `stage` runs before its first backward: min(p − r − 1, m) for
    1F1B (§4.1), min((p − r − 1)·2 + (v − 1)·p, m·v) for interleaved (§4.2), m·v for GPipe."""
    require_positive("num_chunks", num_chunks)
    require_stage(stage, num_stages)
    if kind is ScheduleKind.GPIPE:
        return gpipe_warmup(num_microbatches, num_chunks)
    if kind is ScheduleKind.ONE_F_ONE_B:
        if num_chunks == 1:
            return one_f_one_b_warmup(num_stages, stage, num_microbatches)
        return interleaved_warmup(num_stages, stage, num_microbatches, num_chunks)
    raise ValueError(f"unknown schedule kind {kind!r}")
