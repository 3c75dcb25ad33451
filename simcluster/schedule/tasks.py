"""The vocabulary of pipeline schedules: what one stage does, in order."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Phase(enum.Enum):
    """F runs a chunk forward; B runs its backward (input grad and weight grad together,
    as Megatron does, plus any recomputation the recompute mode asks for)."""

    FORWARD = "F"
    BACKWARD = "B"


@dataclass(frozen=True, slots=True)
class Task:
    """One chunk-sized unit of work on one stage: forward or backward of `microbatch`
    through model chunk `chunk` (0 ≤ chunk < vpp) of that stage."""

    phase: Phase
    microbatch: int
    chunk: int

    def __str__(self) -> str:
        return f"{self.phase.value}{self.microbatch}.{self.chunk}"
