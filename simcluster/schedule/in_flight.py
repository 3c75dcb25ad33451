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
    min(p − r, m) for 1F1B, v·p + p − 1 on rank 0 for interleaved with enough
    microbatches (`pipeline_parallel/schedules.py`; Korthikanti §4.2.3)."""
    return max(in_flight_counts(stage_tasks), default=0)


InFlightStates = tuple[frozenset[tuple[int, ...]], frozenset[tuple[int, ...]]]


def chunk_in_flight_states(stage_tasks: Iterable[Task], num_chunks: int) -> InFlightStates:
    """The per-chunk counts of stashed chunk-forwards one stage holds just after a forward
    (it stores its activations at its start) and just before a backward frees its chunk's:
    every peak of a stage's activation memory is the bytes of one of these states (a
    forward stores, a backward holds its transient bytes). Only the last forward of a run
    of forwards and the first backward of a run of backwards are kept: the states between
    hold no more of any chunk (a forward adds one, a backward frees one)."""
    counts = [0] * num_chunks
    after_forward: set[tuple[int, ...]] = set()
    before_backward: set[tuple[int, ...]] = set()
    previous_forward, first = False, True
    for task in stage_tasks:
        if task.phase is Phase.FORWARD:
            counts[task.chunk] += 1
            previous_forward = True
        else:
            if previous_forward:
                after_forward.add(tuple(counts))  # the run of forwards ends here
            if previous_forward or first:
                before_backward.add(tuple(counts))  # a run of backwards starts here
            counts[task.chunk] -= 1
            previous_forward = False
        first = False
    if previous_forward:
        after_forward.add(tuple(counts))
    return frozenset(after_forward), frozenset(before_backward)
