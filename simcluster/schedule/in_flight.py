"""Activation memory proxy: how many chunk-forwards are stashed awaiting their backward."""

from __future__ import annotations

from collections.abc import Iterable

from simcluster.schedule.tasks import Phase, Task


def in_flight_counts(stage_tasks: Iterable[Task]) -> list[int]:
    """Stashed chunk-forwards after each task of one stage's order (+1 per forward,
    −1 per backward). Megatron's invariant: never negative, zero at the end."""
    counts: list[int] = []
    current = 0
    for task in stage_tasks:
        current += 1 if task.phase is Phase.FORWARD else -1
        counts.append(current)
    return counts


def peak_in_flight(stage_tasks: Iterable[Task]) -> int:
    """Maximum number of chunk-forwards whose backward has not yet run on one stage:
    min(p − r, m) for 1F1B (megatron.md §4.1), v·p + p − 1 on rank 0 for interleaved
    with enough microbatches (§4.2, Korthikanti §4.2.3)."""
    return max(in_flight_counts(stage_tasks), default=0)


InFlightStates = tuple[frozenset[tuple[int, ...]], frozenset[tuple[int, ...]]]


def chunk_in_flight_states(stage_tasks: Iterable[Task], num_chunks: int) -> InFlightStates:
    """The distinct per-chunk counts of stashed chunk-forwards one stage goes through: just
    after each forward (it stores its activations at its start) and just before each
    backward frees its chunk's. Every peak of a stage's activation memory is the bytes of
    one of these states (a forward stores, a backward holds its transient bytes)."""
    counts = [0] * num_chunks
    after_forward: set[tuple[int, ...]] = set()
    before_backward: set[tuple[int, ...]] = set()
    for task in stage_tasks:
        if task.phase is Phase.FORWARD:
            counts[task.chunk] += 1
            after_forward.add(tuple(counts))
        else:
            before_backward.add(tuple(counts))
            counts[task.chunk] -= 1
    return frozenset(after_forward), frozenset(before_backward)
