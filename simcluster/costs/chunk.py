"""Price a chunk's ops: seconds of compute, recompute and exposed tensor-parallel comm for
its forward and backward, per microbatch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from simcluster.config.choices import Dtype
from simcluster.config.hardware import HardwareProfile
from simcluster.costs.compute import attention_time_s, elementwise_kind, elementwise_time_s, gemm_time_s
from simcluster.costs.context_parallel import ring_attention_cost_s
from simcluster.costs.network import GroupPlacement, collective_time_s
from simcluster.workload.layer import LayerOps
from simcluster.workload.model import ChunkWork
from simcluster.workload.ops import Op, OpKind

NO_CONTEXT_PARALLEL = GroupPlacement(num_ranks=1, ranks_per_node=1)
"""The context-parallel group when c = 1 (no ring op is built then)."""


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
    if op.kind is OpKind.ATTENTION:
        assert op.attention is not None
        return attention_time_s(op.attention, hw)
    assert op.collective is not None
    return collective_time_s(op.collective, op.message_bytes, tp, hw)


def price_ops(
    ops: tuple[Op, ...],
    hw: HardwareProfile,
    tp: GroupPlacement,
    dtype: Dtype,
    cp: GroupPlacement = NO_CONTEXT_PARALLEL,
) -> OpsCost:
    """Sum op times in order. An op marked `overlaps_next` runs beside the next op: a share
    `tp_overlap_fraction` of the shorter of the two is hidden (1 = the pair costs the
    longer of the two; below 1 the GPU's SMs and HBM are shared and overlap is partial).
    A context-parallel ring (`Op.ring`) adds its attention to compute and the transfers it
    does not hide to comm, over the ring's placement `cp` (`costs.context_parallel`)."""
    overlap = hw.network.tp_overlap_fraction
    compute_s = comm_s = 0.0
    pending_comm_s = 0.0
    for op in ops:
        if op.ring is not None:
            ring_compute_s, ring_comm_s = ring_attention_cost_s(op.ring, hw, cp)
            compute_s += ring_compute_s
            comm_s += ring_comm_s
            seconds = ring_compute_s + ring_comm_s
            comm_s += pending_comm_s - overlap * min(pending_comm_s, seconds)
            pending_comm_s = 0.0
            continue
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


def price_layer_ops(
    ops: LayerOps,
    hw: HardwareProfile,
    tp: GroupPlacement,
    dtype: Dtype,
    cp: GroupPlacement = NO_CONTEXT_PARALLEL,
) -> ChunkCost:
    """One layer's (or the embedding's, or the output layer's) forward, backward and
    recompute, per microbatch."""
    return ChunkCost(
        forward=price_ops(ops.forward, hw, tp, dtype, cp),
        backward=price_ops(ops.backward, hw, tp, dtype, cp),
        recompute=price_ops(ops.recompute, hw, tp, dtype, cp),
    )


def compose_chunk(num_layers: int, layer: ChunkCost, extras: Sequence[ChunkCost]) -> ChunkCost:
    """`num_layers` copies of a priced layer, then the forward and backward of the extras
    (embedding, output layer) in order; recompute is the layers' only."""
    forward, backward = layer.forward.scaled(num_layers), layer.backward.scaled(num_layers)
    for extra in extras:
        forward, backward = forward + extra.forward, backward + extra.backward
    return ChunkCost(forward=forward, backward=backward, recompute=layer.recompute.scaled(num_layers))


def price_chunk(
    chunk: ChunkWork,
    hw: HardwareProfile,
    tp: GroupPlacement,
    dtype: Dtype,
    cp: GroupPlacement = NO_CONTEXT_PARALLEL,
) -> ChunkCost:
    """A chunk's layers, plus the embedding on the first virtual stage and the output layer
    on the last."""
    extras = [price_layer_ops(extra, hw, tp, dtype) for extra in (chunk.embedding, chunk.output) if extra]
    return compose_chunk(chunk.num_layers, price_layer_ops(chunk.layer, hw, tp, dtype, cp), extras)
