"""Hypothesis strategies for valid (kind, p, m, v) schedule shapes, kept small."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from simcluster.config.choices import ScheduleKind
from simcluster.schedule import Schedule, build_schedule


@dataclass(frozen=True)
class Shape:
    """One schedule request: kind, pipeline stages p, microbatches m, chunks v."""

    kind: ScheduleKind
    num_stages: int
    num_microbatches: int
    num_chunks: int

    def build(self) -> Schedule:
        """The schedule this shape asks for."""
        return build_schedule(self.kind, self.num_stages, self.num_microbatches, self.num_chunks)


def _one_f_one_b(p: int, m: int) -> Shape:
    return Shape(ScheduleKind.ONE_F_ONE_B, p, m, 1)


def _interleaved(p: int, groups: int, v: int) -> Shape:
    return Shape(ScheduleKind.ONE_F_ONE_B, p, p * groups, v)


def _gpipe(p: int, m: int, v: int) -> Shape:
    return Shape(ScheduleKind.GPIPE, p, m, v)


stages = st.integers(1, 8)
one_f_one_b_shapes = st.builds(_one_f_one_b, stages, st.integers(1, 16))
interleaved_shapes = st.builds(_interleaved, st.integers(1, 5), st.integers(1, 4), st.integers(2, 4))
gpipe_shapes = st.builds(_gpipe, stages, st.integers(1, 10), st.integers(1, 3))
any_shape = st.one_of(one_f_one_b_shapes, interleaved_shapes, gpipe_shapes)
