"""Price a chunk's ops: seconds of compute, recompute and exposed tensor-parallel comm for
its forward and backward, per microbatch."""

from __future__ import annotations

from dataclasses import dataclass

from simcluster.config.choices import Dtype
from simcluster.config.hardware import HardwareProfile
from simcluster.costs.compute import elementwise_kind, elementwise_time_s, gemm_time_s
from simcluster.costs.network import GroupPlacement, collective_time_s
from simcluster.workload.model import ChunkWork
from simcluster.workload.ops import Op, OpKind


@dataclass(frozen=True, slots=True)
class OpsCost:
    """Seconds a sequence of ops keeps a rank busy, split into kernels and exposed comm."""

    compute_s: float = 0.0
    comm_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s

    def __add__(self, other: OpsCost) -> OpsCost:
        return OpsCost(self.compute_s + other.compute_s, self.comm_s + other.comm_s)

    def scaled(self, factor: float) -> OpsCost:
        return OpsCost(self.compute_s * factor, self.comm_s * factor)


@dataclass(frozen=True, slots=True)
class ChunkCost:
    """Per-microbatch seconds of one (stage, chunk). Backward includes its recompute."""

    forward: OpsCost
    backward: OpsCost
    recompute: OpsCost

    @property
    def forward_s(self) -> float:
        return self.forward.total_s

    @property
    def backward_s(self) -> float:
        return self.backward.total_s + self.recompute.total_s


def op_time_s(op: Op, hw: HardwareProfile, tp: GroupPlacement, dtype: Dtype) -> float:
    if op.kind is OpKind.GEMM:
        assert op.gemm is not None
        return gemm_time_s(op.gemm, hw, dtype)
    if op.kind is OpKind.ELEMENTWISE:
        return elementwise_time_s(op.bytes_moved, hw, elementwise_kind(op.name))
    assert op.collective is not None
    return collective_time_s(op.collective, op.message_bytes, tp, hw)


def price_ops(ops: tuple[Op, ...], hw: HardwareProfile, tp: GroupPlacement, dtype: Dtype) -> OpsCost:
    """Sum op times in order. An op marked `overlaps_next` runs beside the next op: a share
    `tp_overlap_fraction` of the shorter of the two is hidden (1 = the pair costs the
    longer of the two; below 1 the GPU's SMs and HBM are shared and overlap is partial)."""
    overlap = hw.network.tp_overlap_fraction
    compute_s = comm_s = 0.0
    pending_comm_s = 0.0
    for op in ops:
        seconds = op_time_s(op, hw, tp, dtype)
        if op.kind is OpKind.COLLECTIVE and op.overlaps_next:
            pending_comm_s += seconds
            continue
        if op.kind is OpKind.COLLECTIVE:
            comm_s += seconds
        else:
            compute_s += seconds
        comm_s += pending_comm_s - overlap * min(pending_comm_s, seconds)
        pending_comm_s = 0.0
    return OpsCost(compute_s, comm_s + pending_comm_s)


def price_chunk(chunk: ChunkWork, hw: HardwareProfile, tp: GroupPlacement, dtype: Dtype) -> ChunkCost:
    layer_fwd = price_ops(chunk.layer.forward, hw, tp, dtype).scaled(chunk.num_layers)
    layer_bwd = price_ops(chunk.layer.backward, hw, tp, dtype).scaled(chunk.num_layers)
    recompute = price_ops(chunk.layer.recompute, hw, tp, dtype).scaled(chunk.num_layers)
    for extra in (chunk.embedding, chunk.output):
        if extra is not None:
            layer_fwd = layer_fwd + price_ops(extra.forward, hw, tp, dtype)
            layer_bwd = layer_bwd + price_ops(extra.backward, hw, tp, dtype)
    return ChunkCost(forward=layer_fwd, backward=layer_bwd, recompute=recompute)
