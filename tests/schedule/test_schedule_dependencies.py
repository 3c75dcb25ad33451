"""The virtual-stage chain: who waits for whom (Megatron's `_get_layer_offset` placement)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simcluster.schedule import Phase, Task, downstream, upstream, virtual_stage

F, B = Phase.FORWARD, Phase.BACKWARD


@pytest.mark.parametrize(
    ("task", "stage", "expected"),
    [
        (Task(F, 3, 0), 0, None),  # first virtual stage
        (Task(F, 3, 0), 1, (0, Task(F, 3, 0))),
        (Task(F, 3, 1), 0, (1, Task(F, 3, 0))),  # wrap-around p − 1 -> 0
        (Task(B, 3, 1), 1, (1, Task(F, 3, 1))),  # last virtual stage: own forward
        (Task(B, 3, 1), 0, (1, Task(B, 3, 1))),
        (Task(B, 3, 0), 1, (0, Task(B, 3, 1))),  # wrap-around 0 -> p − 1
        (Task(B, 3, 0), 0, (1, Task(B, 3, 0))),
    ],
)
def test_upstream_p2_v2(task: Task, stage: int, expected: tuple[int, Task] | None) -> None:
    """p=2, v=2 hand cases of the upstream rule."""
    assert upstream(task, stage, 2, 2) == expected


@pytest.mark.parametrize(
    ("task", "stage", "expected"),
    [
        (Task(F, 1, 1), 1, None),  # last virtual stage: loss feeds its own backward
        (Task(F, 1, 0), 1, (0, Task(F, 1, 1))),
        (Task(F, 1, 0), 0, (1, Task(F, 1, 0))),
        (Task(B, 1, 0), 0, None),  # first virtual stage: end of the chain
        (Task(B, 1, 1), 0, (1, Task(B, 1, 0))),
        (Task(B, 1, 0), 1, (0, Task(B, 1, 0))),
    ],
)
def test_downstream_p2_v2(task: Task, stage: int, expected: tuple[int, Task] | None) -> None:
    """p=2, v=2 hand cases of where a task's output goes."""
    assert downstream(task, stage, 2, 2) == expected


def test_single_stage_chunks_chain_on_itself() -> None:
    """p=1: chunk c's forward waits for chunk c − 1 on the same rank."""
    assert upstream(Task(F, 0, 2), 0, 1, 3) == (0, Task(F, 0, 1))
    assert upstream(Task(B, 0, 0), 0, 1, 3) == (0, Task(B, 0, 1))


def test_virtual_stage_layer_order() -> None:
    """vs = chunk·p + stage: L=8, p=2, v=2 puts rank 1 chunk 0 (layers 2-3) at vs 1."""
    assert [virtual_stage(r, c, 2) for c in range(2) for r in range(2)] == [0, 1, 2, 3]


@given(st.integers(1, 5), st.integers(1, 4), st.data())
def test_downstream_inverts_upstream(p: int, v: int, data: st.DataObject) -> None:
    """If A sends to B then B's upstream is A, for every task on the chain."""
    stage = data.draw(st.integers(0, p - 1))
    task = Task(data.draw(st.sampled_from(Phase)), 0, data.draw(st.integers(0, v - 1)))
    target = downstream(task, stage, p, v)
    if target is not None:
        assert upstream(target[1], target[0], p, v) == (stage, task)
