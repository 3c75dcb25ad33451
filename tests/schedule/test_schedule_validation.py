"""Bad sizes fail with a ValueError that names the value."""

from __future__ import annotations

import pytest

from simcluster.config.choices import ScheduleKind
from simcluster.schedule import (
    Phase,
    Task,
    build_schedule,
    gpipe,
    ideal_makespan,
    interleaved_one_f_one_b,
    one_f_one_b,
    upstream,
    warmup_microbatches,
)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: one_f_one_b(0, 4), "num_stages must be a positive integer, got 0"),
        (lambda: one_f_one_b(2, -1), "num_microbatches must be a positive integer, got -1"),
        (lambda: one_f_one_b(2, 2.0), "num_microbatches .* got 2.0"),  # type: ignore[arg-type]
        (lambda: gpipe(2, 4, 0), "num_chunks must be a positive integer, got 0"),
        (lambda: interleaved_one_f_one_b(2, 4, 0), "num_chunks .* got 0"),
        (lambda: build_schedule(ScheduleKind.ONE_F_ONE_B, 2, 4, 0), "num_chunks .* got 0"),
        (lambda: ideal_makespan((), 1.0, 2.0, 1), r"len\(schedule\) .* got 0"),
    ],
)
def test_non_positive_sizes_raise(call: object, match: str) -> None:
    """Non-positive (or non-integer) sizes raise ValueError naming the argument."""
    with pytest.raises(ValueError, match=match):
        call()  # type: ignore[operator]


def test_interleaved_needs_microbatches_divisible_by_stages() -> None:
    """Megatron's interleaved schedule requires m % p == 0 (Megatron-core schedules.py, to core_v0.8.0)."""
    with pytest.raises(ValueError, match="num_microbatches=6 .* num_stages=4"):
        interleaved_one_f_one_b(4, 6, 2)
    with pytest.raises(ValueError, match="num_microbatches=6"):
        build_schedule(ScheduleKind.ONE_F_ONE_B, 4, 6, 2)


def test_stage_out_of_range_raises() -> None:
    """A rank outside [0, p) is rejected by name."""
    with pytest.raises(ValueError, match=r"stage must be in \[0, 4\), got 4"):
        warmup_microbatches(ScheduleKind.ONE_F_ONE_B, 4, 4, 8, 1)
    with pytest.raises(ValueError, match=r"stage must be in \[0, 2\), got -1"):
        upstream(Task(Phase.FORWARD, 0, 0), -1, 2, 1)


def test_chunk_out_of_range_raises() -> None:
    """A task whose chunk is not in [0, v) is rejected by name."""
    with pytest.raises(ValueError, match=r"chunk must be in \[0, 2\), got 2"):
        upstream(Task(Phase.FORWARD, 0, 2), 0, 2, 2)
