"""Interleaved (virtual-pipeline) 1F1B, exactly as Megatron orders it.

Source: Megatron-LM `forward_backward_pipelining_with_interleaving` in
`megatron/core/pipeline_parallel/schedules.py` (2021 code to core_v0.8.0, i.e. microbatch
groups of size p). Each rank holds v model chunks and runs M = m·v
chunk-sized "virtual microbatches" forward and backward.
"""

from __future__ import annotations

from simcluster.schedule.ordering import Schedule, warmup_steady_cooldown
from simcluster.schedule.tasks import Phase, Task
from simcluster.schedule.validation import require_positive, require_stage


def virtual_chunk(k: int, num_stages: int, num_chunks: int) -> int:
    """Chunk of forward virtual index k: (k mod (p·v)) div p (Megatron's `get_model_chunk_id`)."""
    return (k % (num_stages * num_chunks)) // num_stages


def virtual_microbatch(k: int, num_stages: int, num_chunks: int) -> int:
    """Microbatch of virtual index k: (k div (p·v))·p + (k mod p) (Megatron's schedules.py)."""
    return (k // (num_stages * num_chunks)) * num_stages + k % num_stages


def check_interleavable(num_stages: int, num_microbatches: int, num_chunks: int) -> None:
    """Megatron's constraint (2021 .. core_v0.8.0): m must be a multiple of p."""
    require_positive("num_stages", num_stages)
    require_positive("num_microbatches", num_microbatches)
    require_positive("num_chunks", num_chunks)
    if num_microbatches % num_stages != 0:
        raise ValueError(
            f"num_microbatches={num_microbatches} is not divisible by "
            f"num_stages={num_stages}; Megatron's interleaved schedule requires it"
        )


def interleaved_warmup(
    num_stages: int, stage: int, num_microbatches: int, num_chunks: int, extra_warmup: int = 0
) -> int:
    """Warm-up chunk-forwards on rank r (Megatron's schedules.py):
    W = min((p − r − 1)·2 + (v − 1)·p + e, M), and W = M when m == p (all warm-up); e =
    `extra_warmup` (1 under the EP overlap's combined schedule, `schedule.build`)."""
    check_interleavable(num_stages, num_microbatches, num_chunks)
    require_stage(stage, num_stages)
    num_total = num_microbatches * num_chunks
    if num_microbatches == num_stages:
        return num_total
    return min((num_stages - stage - 1) * 2 + (num_chunks - 1) * num_stages + extra_warmup, num_total)


def _virtual_tasks(num_stages: int, num_microbatches: int, num_chunks: int) -> tuple[list[Task], list[Task]]:
    """Forward and backward task of every virtual index k < M; backward k runs chunk
    v − 1 − chunk(k) (backward traverses the chunks in reverse, as in Megatron)."""
    forwards: list[Task] = []
    backwards: list[Task] = []
    for k in range(num_microbatches * num_chunks):
        mb = virtual_microbatch(k, num_stages, num_chunks)
        chunk = virtual_chunk(k, num_stages, num_chunks)
        forwards.append(Task(Phase.FORWARD, mb, chunk))
        backwards.append(Task(Phase.BACKWARD, mb, num_chunks - 1 - chunk))
    return forwards, backwards


def interleaved_one_f_one_b(
    num_stages: int, num_microbatches: int, num_chunks: int, extra_warmup: int = 0
) -> Schedule:
    """Per-stage task order of Megatron's interleaved 1F1B (`forward_backward_pipelining_with_interleaving`).

    Warm-up: forward(k) for k < W; steady: forward(k + W) then backward(k); cooldown:
    the remaining backwards. Peak in-flight on rank 0 is W + 1 = v·p + p − 1 chunks when
    m is large enough, the memory factor 1 + (p − 1)/(p·v) of Korthikanti §4.2.3.
    Raises ValueError when m is not a multiple of p.
    """
    check_interleavable(num_stages, num_microbatches, num_chunks)
    forwards, backwards = _virtual_tasks(num_stages, num_microbatches, num_chunks)
    return tuple(
        warmup_steady_cooldown(
            forwards,
            backwards,
            interleaved_warmup(num_stages, stage, num_microbatches, num_chunks, extra_warmup),
        )
        for stage in range(num_stages)
    )
