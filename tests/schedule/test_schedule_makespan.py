"""Ideal makespan and textbook bubble fractions (Narayanan et al. SC'21 §2.2)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from schedule_cases import Shape, any_shape, interleaved_shapes, one_f_one_b_shapes

from simcluster.schedule import (
    Phase,
    ScheduleDeadlockError,
    Task,
    gpipe,
    ideal_makespan,
    interleaved_one_f_one_b,
    one_f_one_b,
)

FORWARD_S, BACKWARD_S = 1.0, 2.0


def _bubble_fraction(shape: Shape) -> float:
    ideal_s = shape.num_microbatches * (FORWARD_S + BACKWARD_S)
    makespan_s = ideal_makespan(shape.build(), FORWARD_S, BACKWARD_S, shape.num_chunks)
    return (makespan_s - ideal_s) / ideal_s


def test_one_f_one_b_p2_m4_by_hand() -> None:
    """p=2, m=4, f=1, b=2: (m + p − 1)·(f + b) = 15."""
    assert ideal_makespan(one_f_one_b(2, 4), 1.0, 2.0, 1) == 15.0


@given(st.one_of(one_f_one_b_shapes, interleaved_shapes))
def test_one_f_one_b_bubble_fraction(shape: Shape) -> None:
    """1F1B and interleaved (m multiple of p) have bubble (p − 1)/(m·v) exactly."""
    expected = Fraction(shape.num_stages - 1, shape.num_microbatches * shape.num_chunks)
    assert _bubble_fraction(shape) == pytest.approx(float(expected), abs=1e-12)


@given(st.integers(1, 8), st.integers(1, 16))
def test_gpipe_bubble_fraction(p: int, m: int) -> None:
    """GPipe with one chunk has bubble (p − 1)/m."""
    makespan_s = ideal_makespan(gpipe(p, m), FORWARD_S, BACKWARD_S, 1)
    assert makespan_s == (m + p - 1) * (FORWARD_S + BACKWARD_S)


@given(any_shape)
def test_every_schedule_runs_to_completion(shape: Shape) -> None:
    """No schedule deadlocks, and none beats the bubble-free time m·(f + b)."""
    makespan_s = ideal_makespan(shape.build(), FORWARD_S, BACKWARD_S, shape.num_chunks)
    assert makespan_s >= shape.num_microbatches * (FORWARD_S + BACKWARD_S) - 1e-9


def test_cyclic_wait_is_a_deadlock() -> None:
    """Rank 0 running B0 before F0 waits on rank 1, which waits on rank 0's F0."""
    f0, b0 = Task(Phase.FORWARD, 0, 0), Task(Phase.BACKWARD, 0, 0)
    with pytest.raises(ScheduleDeadlockError, match="stage 0 at B0.0"):
        ideal_makespan(((b0, f0), (f0, b0)), 1.0, 2.0, 1)


def test_missing_upstream_task_is_a_deadlock() -> None:
    """Rank 1 cannot run F0 when rank 0 never does."""
    f0, b0 = Task(Phase.FORWARD, 0, 0), Task(Phase.BACKWARD, 0, 0)
    with pytest.raises(ScheduleDeadlockError, match="stage 1 at F0.0"):
        ideal_makespan(((), (f0, b0)), 1.0, 2.0, 1)


def test_large_interleaved_schedule_by_formula() -> None:
    """p=35, m=280, v=3 (58,800 tasks): m·(f + b) + (p − 1)·(f + b)/v = 840 + 34."""
    schedule = interleaved_one_f_one_b(35, 280, 3)
    assert ideal_makespan(schedule, FORWARD_S, BACKWARD_S, 3) == pytest.approx(874.0)
