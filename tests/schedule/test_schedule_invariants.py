"""Invariants every pipeline schedule must satisfy (Megatron-core `pipeline_parallel/schedules.py`)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from schedule_cases import Shape, any_shape

from simcluster.schedule import Phase, Task, in_flight_counts


def _expected_tasks(shape: Shape) -> Counter[Task]:
    return Counter(
        Task(phase, mb, chunk)
        for phase in Phase
        for mb in range(shape.num_microbatches)
        for chunk in range(shape.num_chunks)
    )


@given(any_shape)
def test_one_stage_per_rank(shape: Shape) -> None:
    """The schedule has one task list per pipeline rank."""
    assert len(shape.build()) == shape.num_stages


@given(any_shape)
def test_every_task_exactly_once_on_every_stage(shape: Shape) -> None:
    """Each (microbatch, chunk) forward and backward appears exactly once per stage."""
    expected = _expected_tasks(shape)
    for stage_tasks in shape.build():
        assert Counter(stage_tasks) == expected


@given(any_shape)
def test_backward_after_own_forward(shape: Shape) -> None:
    """On every stage a backward comes after the forward of the same (mb, chunk)."""
    for stage_tasks in shape.build():
        position = {task: i for i, task in enumerate(stage_tasks)}
        for task, i in position.items():
            if task.phase is Phase.BACKWARD:
                assert position[Task(Phase.FORWARD, task.microbatch, task.chunk)] < i


@given(any_shape)
def test_in_flight_never_negative_and_ends_at_zero(shape: Shape) -> None:
    """The stashed-forward count never goes negative and returns to zero."""
    for stage_tasks in shape.build():
        counts = in_flight_counts(stage_tasks)
        assert min(counts) >= 0
        assert counts[-1] == 0
