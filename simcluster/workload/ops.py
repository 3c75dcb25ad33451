"""The op vocabulary of the workload model: GEMMs, memory-bound kernels and collectives.

Each op carries what the cost model needs (FLOPs, bytes moved through HBM, message bytes)
and what the memory model needs (bytes it keeps for backward). Nothing here knows about
hardware or time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from simcluster.config.choices import AttentionKernel


class OpKind(enum.Enum):
    GEMM = "gemm"
    ELEMENTWISE = "elementwise"
    COLLECTIVE = "collective"
    ATTENTION = "attention"  # one fused flash-attention kernel (priced from its achieved TFLOP/s)


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


FLASH_BACKWARD_FLOP_RATIO = 2.5
"""Flash-attention backward FLOPs over forward FLOPs: five GEMMs (QKᵀ recomputed, dV, dP,
dQ, dK) against two (flash-attention `benchmarks/benchmark_flash_attention.py::flops`;
docs/cost_model.md). The profile's backward TFLOP/s are measured under this convention."""


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """One fused (flash) attention kernel call on one rank, one direction.

    `batch` sequences × `heads` query heads of `head_dim`, each query head reading one of
    `kv_heads` key/value heads (GQA), `seq_q` queries against `seq_k` keys. Context
    parallelism calls it with seq_q = s/c (or a 1/(2c) chunk) and seq_k = the keys one ring
    step brings; without it seq_q = seq_k = s. A causal mask is bottom-right aligned (query i
    of seq_q sees keys up to seq_k - seq_q + i, flash-attention ≥ 2.1), so a rank-local
    causal chunk with seq_q = seq_k does half the work (flash-attention `hopper/benchmark_attn.py::flops`).
    """

    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    causal: bool
    backward: bool = False
    kernel: AttentionKernel = AttentionKernel.AUTO  # which library's kernels: prices differ, bytes do not

    @property
    def visible_fraction(self) -> float:
        """Share of the seq_q × seq_k score matrix a causal mask leaves: 1 - seq_q/(2·seq_k)
        (1/2 at seq_q = seq_k: flash-attention `hopper/benchmark_attn.py` counts s/2), 1 if
        not causal."""
        return 1.0 - self.seq_q / (2.0 * self.seq_k) if self.causal else 1.0

    @property
    def forward_flops(self) -> float:
        """QKᵀ and P·V over the visible scores: 4·b·heads·s_q·s_k·d·visible (docs/cost_model.md)."""
        dense = 4.0 * self.batch * self.heads * self.seq_q * self.seq_k * self.head_dim
        return dense * self.visible_fraction

    @property
    def flops(self) -> float:
        """This direction's FLOPs under the flash-attention convention: forward, or
        2.5 × forward for the backward (`FLASH_BACKWARD_FLOP_RATIO`)."""
        return self.forward_flops * (FLASH_BACKWARD_FLOP_RATIO if self.backward else 1.0)


@dataclass(frozen=True, slots=True)
class RingAttention:
    """Context-parallel attention, Megatron-core's default `--cp-comm-type p2p` (TE
    `AttnFuncWithCPAndKVP2P`), one direction on one rank of a ring of
    `cp_size`. The local K/V chunk circulates in `cp_size` steps; the transfer bringing step
    i + 1's K/V runs beside step i's attention. With the 2·c-chunk causal load balance
    every step does ½(s/c)² of attention: step 0 is the causal `diagonal` (local Q × local
    K/V); on later steps some ranks compute the `lower` tile (all local Q × the first half of
    the received K/V) and the others the `upper` tile (the second half of Q × all of it), so
    the ring waits for the slower of the two. `message_bytes` is what each step sends: K and
    V forward; K, V and the partial dK, dV backward (the first backward step has no dK/dV
    yet: `first_message_bytes`). `final_message_bytes` is the dK/dV sent home after the last
    backward step (0 forward). `first_merge_bytes` and `merge_bytes` are the HBM bytes of the
    element-wise kernels that fold step 0's and each later step's partial result into the
    rank's output (forward: the softmax-LSE output correction; backward: the dQ and dK/dV
    accumulation), 0 where not counted."""

    cp_size: int
    diagonal: AttentionShape
    lower: AttentionShape
    upper: AttentionShape
    message_bytes: float
    first_message_bytes: float
    final_message_bytes: float = 0.0
    first_merge_bytes: float = 0.0
    merge_bytes: float = 0.0

    @property
    def flops(self) -> float:
        """1/c of the causal attention of the whole sequence, per direction."""
        return self.diagonal.flops + (self.cp_size - 1) * self.lower.flops


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
    attention: AttentionShape | None = None
    ring: RingAttention | None = None

    @property
    def flops(self) -> float:
        if self.ring is not None:
            return self.ring.flops
        if self.attention is not None:
            return self.attention.flops
        return self.gemm.flops if self.gemm is not None else 0.0


def gemm(name: str, shape: GemmShape, saved_bytes: float = 0.0) -> Op:
    return Op(name=name, kind=OpKind.GEMM, gemm=shape, saved_bytes=saved_bytes)


def elementwise(name: str, bytes_moved: float, saved_bytes: float = 0.0) -> Op:
    return Op(name=name, kind=OpKind.ELEMENTWISE, bytes_moved=bytes_moved, saved_bytes=saved_bytes)


def flash_attention(name: str, shape: AttentionShape, saved_bytes: float = 0.0) -> Op:
    return Op(name=name, kind=OpKind.ATTENTION, attention=shape, saved_bytes=saved_bytes)


def collective(name: str, kind: CollectiveKind, message_bytes: float, overlaps_next: bool = False) -> Op:
    """`message_bytes` is the full buffer: all-reduce buffer, all-gather output, reduce-scatter input."""
    return Op(
        name=name,
        kind=OpKind.COLLECTIVE,
        collective=kind,
        message_bytes=message_bytes,
        overlaps_next=overlaps_next,
    )
