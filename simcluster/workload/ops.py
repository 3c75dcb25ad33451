"""The op vocabulary of the workload model: GEMMs, memory-bound kernels and collectives.

Each op carries what the cost model needs (FLOPs, bytes moved through HBM, message bytes)
and what the memory model needs (bytes it keeps for backward). Nothing here knows about
hardware or time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class OpKind(enum.Enum):
    GEMM = "gemm"
    ELEMENTWISE = "elementwise"
    COLLECTIVE = "collective"


class CollectiveKind(enum.Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"


@dataclass(frozen=True, slots=True)
class GemmShape:
    """C[m, n] (+)= A[m, k] · B[k, n], `batch` times. `accumulate_fp32` marks a weight-grad
    GEMM that accumulates into Megatron's fp32 main_grad (reads and writes C in fp32)."""

    m: int
    n: int
    k: int
    batch: int = 1
    accumulate_fp32: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    def bytes_moved(self, element_bytes: int) -> float:
        """Fewest HBM bytes: read A and B once, write C once (read+write in fp32 if accumulating)."""
        inputs = element_bytes * (self.m * self.k + self.k * self.n)
        output = (8 if self.accumulate_fp32 else element_bytes) * self.m * self.n
        return float(self.batch * (inputs + output))


@dataclass(frozen=True, slots=True)
class Op:
    """One kernel (or collective) on one tensor-parallel rank.

    `saved_bytes` is what the op keeps for backward (forward ops only; Korthikanti Table 2
    bookkeeping). `overlaps_next` marks an asynchronous collective that runs while the next
    op computes (Megatron overlaps the input-grad all-reduce / reduce-scatter of a
    column-parallel linear with its weight-grad GEMM).
    """

    name: str
    kind: OpKind
    gemm: GemmShape | None = None
    bytes_moved: float = 0.0
    collective: CollectiveKind | None = None
    message_bytes: float = 0.0
    saved_bytes: float = 0.0
    overlaps_next: bool = False

    @property
    def flops(self) -> float:
        return self.gemm.flops if self.gemm is not None else 0.0


def gemm(name: str, shape: GemmShape, saved_bytes: float = 0.0) -> Op:
    return Op(name=name, kind=OpKind.GEMM, gemm=shape, saved_bytes=saved_bytes)


def elementwise(name: str, bytes_moved: float, saved_bytes: float = 0.0) -> Op:
    return Op(name=name, kind=OpKind.ELEMENTWISE, bytes_moved=bytes_moved, saved_bytes=saved_bytes)


def collective(name: str, kind: CollectiveKind, message_bytes: float, overlaps_next: bool = False) -> Op:
    """`message_bytes` is the full buffer: all-reduce buffer, all-gather output, reduce-scatter input."""
    return Op(
        name=name,
        kind=OpKind.COLLECTIVE,
        collective=kind,
        message_bytes=message_bytes,
        overlaps_next=overlaps_next,
    )
