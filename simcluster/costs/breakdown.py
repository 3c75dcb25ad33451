"""Where the time goes: one layer's and one step's seconds split by kind of work.

A layer's split (per microbatch, forward + backward + recompute) takes the totals its
price already has (`costs.chunk.price_ops`: compute seconds and exposed communication
seconds) and names their parts by re-pricing only the kinds that are not GEMMs with the
same functions price_ops calls:

    attention    = Σ attention-core ops (`costs.op_kind`) + each context-parallel ring's
                   attention and merges (`ring_attention_cost_s`)
    memory_bound = Σ element-wise ops that are not FP8 quantization
    fp8_cast     = Σ TE casts before FP8 GEMMs (`fp8_cast_s`) + current scaling's amax kernels
    gemm         = compute − attention − memory_bound − fp8_cast
    cp_comm      = Σ each ring's exposed transfers
    tp_comm      = exposed communication − cp_comm
    ep_comm      = a MoE layer's token-dispatcher collectives (`OpsCost.ep_comm_s`: the
                   all-to-alls, the allgather dispatcher's gathers, DeepEP's kernels)

so the parts sum to the layer's price by construction. GEMM is the remainder so that what
price_ops does only to GEMMs (TE userbuffers' SM margin while a collective runs beside one)
stays with the GEMMs. A step's split (`step_split`) then shares each stage's busy time in
the engine (compute, recompute, TP comm, EP comm, host wait) out over the kinds in
proportion to the per-microbatch split of that stage's chunks (every chunk runs every
microbatch once each way), adds the engine's PP / DP communication and optimizer seconds,
and calls the rest of the iteration pipeline idle: the step's parts sum to the iteration
time.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from simcluster.config.choices import Dtype, Fp8Recipe
from simcluster.config.hardware import HardwareProfile
from simcluster.costs.chunk import NO_CONTEXT_PARALLEL, ChunkCost, OpsCost, fp8_cast_s, op_time_s
from simcluster.costs.context_parallel import ring_attention_cost_s
from simcluster.costs.network import GroupPlacement
from simcluster.costs.op_kind import OpKind, op_kind
from simcluster.workload.fp8 import is_te_linear_gemm
from simcluster.workload.layer import LayerOps
from simcluster.workload.ops import Op


class TimeKind(str, enum.Enum):
    """The kinds of a split, in report order (the keys of `run --json`'s `time_by_kind_s`)."""

    GEMM = "gemm"
    ATTENTION = "attention"
    MEMORY_BOUND = "memory_bound"
    FP8_CAST = "fp8_cast"
    TP_COMM = "tp_comm"
    EP_COMM = "ep_comm"
    CP_COMM = "cp_comm"
    PP_COMM = "pp_comm"
    DP_COMM = "dp_comm"
    OPTIMIZER = "optimizer"
    EMBEDDING_AND_LOSS = "embedding_and_loss"
    HOST_WAIT = "host_wait"
    PIPELINE_IDLE = "pipeline_idle"


LAYER_KINDS = (
    TimeKind.GEMM, TimeKind.ATTENTION, TimeKind.MEMORY_BOUND, TimeKind.FP8_CAST,
    TimeKind.TP_COMM, TimeKind.EP_COMM, TimeKind.CP_COMM,
)  # fmt: skip
"""The kinds a layer's price splits into."""

Split = dict[TimeKind, float]


def ops_split(
    ops: tuple[Op, ...], cost: OpsCost, hw: HardwareProfile, tp: GroupPlacement, dtype: Dtype,
    cp: GroupPlacement = NO_CONTEXT_PARALLEL, recipe: Fp8Recipe = Fp8Recipe.DELAYED,
) -> Split:  # fmt: skip
    """`cost` (price_ops of `ops`) split by kind (module docstring)."""
    parts = dict.fromkeys(LAYER_KINDS, 0.0)
    for index, op in enumerate(ops):
        if op.ring is not None:
            ring_compute_s, ring_comm_s = ring_attention_cost_s(op.ring, hw, cp)
            parts[TimeKind.ATTENTION] += ring_compute_s
            parts[TimeKind.CP_COMM] += ring_comm_s
            continue
        kind = op_kind(op)
        if kind is OpKind.GEMM:
            if dtype.quantized and is_te_linear_gemm(op):
                parts[TimeKind.FP8_CAST] += fp8_cast_s(ops, index, hw, tp, recipe, dtype)
            continue
        if kind is not OpKind.COMMUNICATION:
            target = {OpKind.ATTENTION: TimeKind.ATTENTION, OpKind.FP8_CAST: TimeKind.FP8_CAST}
            parts[target.get(kind, TimeKind.MEMORY_BOUND)] += op_time_s(op, hw, tp, dtype)
    non_gemm = parts[TimeKind.ATTENTION] + parts[TimeKind.MEMORY_BOUND] + parts[TimeKind.FP8_CAST]
    parts[TimeKind.GEMM] = cost.compute_s - non_gemm
    parts[TimeKind.TP_COMM] = cost.comm_s - parts[TimeKind.CP_COMM]
    parts[TimeKind.EP_COMM] = cost.ep_comm_s
    return parts


def layer_split(
    ops: LayerOps, cost: ChunkCost, hw: HardwareProfile, tp: GroupPlacement, dtype: Dtype,
    cp: GroupPlacement = NO_CONTEXT_PARALLEL,
) -> Split:  # fmt: skip
    """One layer's forward + backward + recompute per microbatch, split by kind; sums to
    `cost.forward_s + cost.backward_s`."""
    total = dict.fromkeys(LAYER_KINDS, 0.0)
    for phase_ops, phase_cost in (
        (ops.forward, cost.forward), (ops.backward, cost.backward), (ops.recompute, cost.recompute),
    ):  # fmt: skip
        for kind, seconds in ops_split(phase_ops, phase_cost, hw, tp, dtype, cp, ops.fp8_recipe).items():
            total[kind] += seconds
    return total


def chunk_split(
    layers: Sequence[tuple[int, Split]], extras: Sequence[ChunkCost], amax_s: float, host_wait_s: float
) -> Split:
    """A chunk's microbatch (forward + backward) as `costs.chunk.compose_chunk` builds it:
    each (count, layer split) of its segments, the embedding / output layer (compute:
    embedding and loss; their collectives: TP comm), FP8's amax reductions (TP × DP × CP,
    once per pass: TP comm, as the engine counts them) and the host-bound wait of its two
    tasks."""
    split: Split = {}
    for num_layers, layer in layers:
        for kind, seconds in layer.items():
            split[kind] = split.get(kind, 0.0) + num_layers * seconds
    split[TimeKind.EMBEDDING_AND_LOSS] = sum(e.forward.compute_s + e.backward.compute_s for e in extras)
    split[TimeKind.TP_COMM] += sum(e.forward.comm_s + e.backward.comm_s for e in extras) + 2 * amax_s
    split[TimeKind.HOST_WAIT] = host_wait_s
    return split


def step_split(
    iteration_time_s: float,
    stage_busy_s: Sequence[Mapping[str, float]],
    stage_chunks: Sequence[Sequence[Split]],
) -> Split:
    """The mean stage's iteration split by kind. `stage_busy_s`: per stage the engine's busy
    seconds by `engine.plan.TimeCategory` value; `stage_chunks`: per stage the
    `chunk_split` of each of its chunks. Sums to `iteration_time_s`."""
    total = dict.fromkeys(TimeKind, 0.0)
    for busy, chunks in zip(stage_busy_s, stage_chunks, strict=True):
        task_s = sum(
            busy.get(name, 0.0) for name in ("compute", "recompute", "tp_comm", "ep_comm", "host_wait")
        )
        weights: Split = {}
        for chunk in chunks:
            for kind, seconds in chunk.items():
                weights[kind] = weights.get(kind, 0.0) + seconds
        scale = task_s / sum(weights.values()) if task_s > 0 else 0.0
        for kind, seconds in weights.items():
            total[kind] += seconds * scale
        total[TimeKind.PP_COMM] += busy.get("pp_comm", 0.0)
        total[TimeKind.DP_COMM] += busy.get("dp_comm", 0.0)
        total[TimeKind.OPTIMIZER] += busy.get("optimizer", 0.0)
    num_stages = len(stage_busy_s)
    split = {kind: seconds / num_stages for kind, seconds in total.items()}
    busy_s = sum(seconds for kind, seconds in split.items() if kind is not TimeKind.PIPELINE_IDLE)
    split[TimeKind.PIPELINE_IDLE] = max(0.0, iteration_time_s - busy_s)
    return split
