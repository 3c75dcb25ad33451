"""What kind of GPU work an op is, for reporting where the time goes (`costs.breakdown`,
`run`'s time split) and for splitting a prediction's error by kind.

The workload's `ops.OpKind` says how an op is priced (GEMM roofline, bandwidth, attention
rate, collective); this says what a reader asks about: GEMMs, attention, memory-bound
kernels, FP8 quantization (Transformer Engine's casts and, under current scaling, the amax
and scale kernels of `workload.fp8.current_scaling_ops`), and communication. Attention is
the attention core: the fused (flash) kernel, or the paper's unfused core (QKᵀ and ×V
batched GEMMs, scale-mask-softmax, attention dropout, the context copy) with its backward;
the QKV and output projections are GEMMs. A context-parallel ring (`Op.ring`) is
attention: its exposed transfers are split off as context-parallel communication by
`costs.breakdown`, from the ring's own price.
"""

from __future__ import annotations

import enum

from simcluster.workload import ops

Module = ops.Module
FP8_QUANTIZATION = frozenset({Module.FP8_AMAX, Module.FP8_SCALE})  # `workload.fp8.current_scaling_ops`
ATTENTION_CORE = frozenset(
    {Module.FLASH, Module.QK, Module.SOFTMAX, Module.ATTENTION_DROPOUT, Module.AV, Module.CONTEXT_COPY}
)
"""The attention core's modules (`workload.layer`: the flash kernel, or the unfused core's
QKᵀ, softmax, dropout, ×V and context copy, each way); QKV and proj are the linears."""


class OpKind(str, enum.Enum):
    GEMM = "gemm"
    ATTENTION = "attention"
    MEMORY_BOUND = "memory_bound"
    FP8_CAST = "fp8_cast"
    COMMUNICATION = "communication"


def op_kind(op: ops.Op) -> OpKind:
    """The kind of one op. A TE linear's FP8 GEMM is a GEMM here; its input cast is priced
    beside it (`costs.chunk.fp8_cast_s`) and reported as FP8_CAST by `costs.breakdown`."""
    if op.ring is not None or op.kind is ops.OpKind.ATTENTION or op.module in ATTENTION_CORE:
        return OpKind.ATTENTION
    if op.kind is ops.OpKind.COLLECTIVE:
        return OpKind.COMMUNICATION
    if op.kind is ops.OpKind.GEMM:
        return OpKind.GEMM
    if op.module in FP8_QUANTIZATION:
        return OpKind.FP8_CAST
    return OpKind.MEMORY_BOUND
