"""Exact Megatron orders, warm-up counts and peak in-flight (Megatron-core
`pipeline_parallel/schedules.py`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from schedule_cases import Shape, any_shape

from simcluster.config.choices import ScheduleKind
from simcluster.schedule import (
    Phase,
    Task,
    build_schedule,
    gpipe,
    interleaved_one_f_one_b,
    one_f_one_b,
    peak_in_flight,
    warmup_microbatches,
)

ONE_F_ONE_B = ScheduleKind.ONE_F_ONE_B


def _order(stage_tasks: tuple[Task, ...]) -> str:
    return " ".join(str(task) for task in stage_tasks)


def test_one_f_one_b_order_p2_m4() -> None:
    """p=2, m=4: rank 0 warms up with one forward, then pairs, then one backward."""
    schedule = one_f_one_b(2, 4)
    assert _order(schedule[0]) == "F0.0 F1.0 B0.0 F2.0 B1.0 F3.0 B2.0 B3.0"
    assert _order(schedule[1]) == "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0"


def test_one_f_one_b_order_more_stages_than_microbatches() -> None:
    """p=4, m=2: rank 0 has W = min(3, 2) = 2, so it is all warm-up then cooldown."""
    assert _order(one_f_one_b(4, 2)[0]) == "F0.0 F1.0 B0.0 B1.0"


def test_interleaved_order_p2_v2_m4() -> None:
    """p=2, v=2, m=4 derived by hand: k -> chunk (k mod 4) div 2, mb (k div 4)·2 + k mod 2;
    rank 0 W = 1·2 + 1·2 = 4, rank 1 W = 0 + 2 = 2."""
    schedule = interleaved_one_f_one_b(2, 4, 2)
    assert _order(schedule[0]) == (
        "F0.0 F1.0 F0.1 F1.1 "  # warm-up k = 0..3
        "F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 "  # steady: F(k+4), B(k)
        "B2.1 B3.1 B2.0 B3.0"  # cooldown k = 4..7
    )
    assert _order(schedule[1]) == (
        "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0"
    )


def test_gpipe_order_chunk_by_chunk_then_reverse() -> None:
    """GPipe v=2, m=2: chunk 0 forwards, chunk 1 forwards, then the exact reverse."""
    assert _order(gpipe(3, 2, 2)[1]) == "F0.0 F1.0 F0.1 F1.1 B1.1 B0.1 B1.0 B0.0"


def test_build_schedule_dispatches_on_kind_and_chunks() -> None:
    """1F1B with v > 1 is interleaved; GPIPE is GPipe."""
    assert build_schedule(ONE_F_ONE_B, 2, 4, 1) == one_f_one_b(2, 4)
    assert build_schedule(ONE_F_ONE_B, 2, 4, 2) == interleaved_one_f_one_b(2, 4, 2)
    assert build_schedule(ScheduleKind.GPIPE, 2, 4, 2) == gpipe(2, 4, 2)


@pytest.mark.parametrize(
    ("p", "m", "expected"),
    [(4, 8, [3, 2, 1, 0]), (4, 2, [2, 2, 1, 0]), (1, 3, [0]), (8, 1, [1] * 7 + [0])],
)
def test_one_f_one_b_warmup_counts(p: int, m: int, expected: list[int]) -> None:
    """1F1B warm-up on rank r is min(p − r − 1, m) (Megatron's schedules.py)."""
    assert [warmup_microbatches(ONE_F_ONE_B, p, r, m, 1) for r in range(p)] == expected


@pytest.mark.parametrize(
    ("p", "m", "v", "expected"),
    [
        (4, 8, 2, [10, 8, 6, 4]),  # (p − r − 1)·2 + (v − 1)·p
        (2, 4, 3, [6, 4]),
        (4, 8, 3, [14, 12, 10, 8]),
        (4, 4, 2, [8, 8, 8, 8]),  # m == p: all M = m·v forwards are warm-up
        (1, 3, 2, [1]),
    ],
)
def test_interleaved_warmup_counts(p: int, m: int, v: int, expected: list[int]) -> None:
    """Interleaved warm-up is min((p − r − 1)·2 + (v − 1)·p, m·v) (Megatron's schedules.py)."""
    assert [warmup_microbatches(ONE_F_ONE_B, p, r, m, v) for r in range(p)] == expected


def test_gpipe_warmup_is_every_forward() -> None:
    """GPipe runs all m·v chunk-forwards before any backward."""
    assert warmup_microbatches(ScheduleKind.GPIPE, 4, 0, 6, 2) == 12


@given(any_shape)
def test_forwards_before_first_backward_match_warmup(shape: Shape) -> None:
    """Each rank runs its W warm-up forwards plus the first steady forward (if any)
    before its first backward: min(W + 1, m·v) forwards."""
    num_total = shape.num_microbatches * shape.num_chunks
    for r, stage_tasks in enumerate(shape.build()):
        first_backward = next(i for i, t in enumerate(stage_tasks) if t.phase is Phase.BACKWARD)
        warmup = warmup_microbatches(
            shape.kind, shape.num_stages, r, shape.num_microbatches, shape.num_chunks
        )
        assert first_backward == min(warmup + 1, num_total)


@given(st.integers(1, 8), st.integers(1, 16))
def test_one_f_one_b_peak_in_flight(p: int, m: int) -> None:
    """1F1B stashes min(p − r, m) microbatches on rank r (Megatron's schedules.py)."""
    schedule = one_f_one_b(p, m)
    assert [peak_in_flight(s) for s in schedule] == [min(p - r, m) for r in range(p)]


@given(st.integers(1, 6), st.integers(2, 5), st.integers(2, 4))
def test_interleaved_peak_in_flight_rank0(p: int, groups: int, v: int) -> None:
    """Rank 0 stashes W + 1 = v·p + p − 1 chunks once m ≥ 2p: the memory factor
    1 + (p − 1)/(p·v) of Korthikanti §4.2.3 (Megatron's schedules.py)."""
    schedule = interleaved_one_f_one_b(p, p * groups, v)
    assert peak_in_flight(schedule[0]) == v * p + p - 1


def test_gpipe_peak_in_flight_is_everything() -> None:
    """GPipe stashes every chunk-forward: m·v."""
    assert peak_in_flight(gpipe(4, 6, 2)[3]) == 12
