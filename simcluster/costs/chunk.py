"""Price a chunk's ops: seconds of compute, recompute and exposed tensor-parallel comm for
its forward and backward, per microbatch.

FP8 (`training.dtype: fp8`, Transformer Engine `module/linear.py`): the fprop, dgrad and wgrad
GEMMs of the TE linears (QKV, proj, fc1, fc2) run at the FP8 peak × the profile's FP8
ceiling (`compute.fp8_gemm_time_s`); attention BMMs and the LM head stay BF16. Each fprop
input and each dgrad grad-output is quantized first by TE's cast (reads bf16, writes the
FP8 copies its GEMMs read: `fp8_cast_bytes_per_element`), on the local shard where an
all-gather follows, and an all-gather that feeds a TE linear carries
FP8 (TE gathers the quantized tensor). Weights are cast once per step
(`is_first_microbatch`), not per microbatch: not priced. The amax reduction is priced per
chunk (`fp8_amax_reduction_s`).

TP comm overlap (`tp_comm_overlap`, TE userbuffers), with TE's defaults
(`transformer_engine/pytorch/module/base.py::initialize_ub`, `get_default_config`):
* an all-gather feeding a TE GEMM (qkv/fc1 fprop, proj/fc2 dgrad) is a ring exchange in t
  chunks: the local chunk's GEMM starts at once, chunk i's GEMM waits for step i, so
  t_pair = max(G, C + G/t) with G the GEMM and C the all-gather (1 SM for the exchange, no
  SM margin for the GEMM: `set_sm_margin` is off for ring_exchange);
* a reduce-scatter after a TE GEMM (proj/fc2 fprop) is pipelined in 4 splits: chunk i's
  reduce-scatter runs beside chunk i+1's GEMM, t_pair = max(G', C) + min(G', C)/4, with C
  the time of four reduce-scatters of a quarter of the buffer and G' the GEMM slowed to
  the SMs the 16 communication SMs leave (`num_sm` 16, `set_sm_margin`);
* the bulk overlaps of the backward (qkv/fc1 ln_out all-gather beside dgrad, dgrad
  reduce-scatter beside wgrad) run the whole collective beside the whole GEMM: max(G', C),
  again with 16 SMs taken from the GEMM.
The LM head and embedding (not TE modules) keep the plain NCCL pricing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from simcluster.config.choices import Dtype, Fp8Recipe
from simcluster.config.hardware import HardwareProfile
from simcluster.costs.compute import (
    attention_time_s,
    elementwise_kind,
    elementwise_time_s,
    gemm_time_s,
    quantized_gemm_time_s,
)
from simcluster.costs.context_parallel import ring_attention_cost_s
from simcluster.costs.grouped_gemm import grouped_expert_gemm_time_s, quantized_expert_gemm_time_s
from simcluster.costs.hybridep import flex_kernel_time_s
from simcluster.costs.network import GroupPlacement, collective_time_s, small_allreduce_s
from simcluster.costs.placement import ExpertGroups
from simcluster.workload.fp8 import (
    fp8_copies,
    grouped_split_quantize_extra_kernels,
    is_te_linear_gemm,
    quantized_bytes_per_element,
    quantized_input_elements,
)
from simcluster.workload.layer import LayerOps
from simcluster.workload.ops import CollectiveKind, CommGroup, Module, Op, OpKind, Pass

BF16_READ_BYTES = 2
RING_EXCHANGE_SPLITS_PER_RANK = 1  # ring_exchange: num_splits = tp_size
PIPELINE_SPLITS = 4  # pipeline: num_splits = 4
PIPELINE_COMM_SMS = 16  # pipeline and bulk: num_sm = 16 with set_sm_margin
BULK_COMM_SMS = 16

NO_CONTEXT_PARALLEL = GroupPlacement(num_ranks=1, ranks_per_node=1)
"""The context-parallel group when c = 1 (no ring op is built then)."""


@dataclass(frozen=True, slots=True)
class OpsCost:
    """Seconds a sequence of ops keeps a rank busy, split into kernels, exposed
    tensor-parallel (and context-parallel) comm, and a MoE layer's token-dispatcher
    collectives (`ep_comm_s`: every collective over an expert group, `Op.group` other than
    TP: the dispatch / combine all-to-alls, the allgather dispatcher's gathers, DeepEP's
    kernels; 0 for a dense layer, so a dense price is unchanged, `==`)."""

    compute_s: float = 0.0
    comm_s: float = 0.0
    ep_comm_s: float = 0.0

    @property
    def total_s(self) -> float:
        if not self.ep_comm_s:  # a dense price: the sum it always was, bit for bit
            return self.compute_s + self.comm_s
        return self.compute_s + self.comm_s + self.ep_comm_s

    def __add__(self, other: OpsCost) -> OpsCost:
        return OpsCost(
            self.compute_s + other.compute_s, self.comm_s + other.comm_s, self.ep_comm_s + other.ep_comm_s
        )

    def scaled(self, factor: float) -> OpsCost:
        return OpsCost(self.compute_s * factor, self.comm_s * factor, self.ep_comm_s * factor)


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


def op_group(op: Op, tp: GroupPlacement, experts: ExpertGroups | None = None) -> GroupPlacement:
    """The placement of the communicator `op` runs over: the TP group, or one of the MoE
    layer's expert groups (`Op.group`)."""
    if op.group is CommGroup.TP:
        return tp
    if experts is None:
        raise ValueError(
            f"op {op.name!r} runs over the {op.group.value} group, but the layout has no experts"
        )
    placement = {
        CommGroup.EP: experts.ep, CommGroup.ETP: experts.etp, CommGroup.ETP_EP: experts.etp_ep,
        CommGroup.TP_CP: experts.tp_cp, CommGroup.TP_DP_CP: experts.tp_dp_cp,
    }[op.group]  # fmt: skip
    if placement is None:
        raise ValueError(f"op {op.name!r} runs over the {op.group.value} group, which the layout lacks")
    return placement


def op_time_s(
    op: Op, hw: HardwareProfile, tp: GroupPlacement, dtype: Dtype, recipe: Fp8Recipe = Fp8Recipe.DELAYED,
    experts: ExpertGroups | None = None,
) -> float:  # fmt: skip
    if op.kind is OpKind.GEMM:
        assert op.gemm is not None
        if dtype.quantized and is_te_linear_gemm(op):
            carried = quantized_expert_gemm_time_s(op, hw, dtype, recipe)  # None: not declared
            return quantized_gemm_time_s(op.gemm, hw, dtype, recipe) if carried is None else carried
        grouped = grouped_expert_gemm_time_s(op, hw, dtype)  # None: no measured grouped GEMMs
        return gemm_time_s(op.gemm, hw, dtype) if grouped is None else grouped
    if op.kind is OpKind.ELEMENTWISE:
        return elementwise_time_s(op.bytes_moved, hw, elementwise_kind(op))
    if op.kind is OpKind.ATTENTION:
        assert op.attention is not None
        return attention_time_s(op.attention, hw)
    assert op.collective is not None
    if op.deepep is not None:  # the flex dispatcher: DeepEP's or Hybrid-EP's kernels, not NCCL's
        return flex_kernel_time_s(op.deepep, op_group(op, tp, experts), hw)
    if op.module is Module.ROUTER_AUX_LOSS:  # the loss's token counts: a few KB, latency only
        return small_allreduce_s(op_group(op, tp, experts), hw)
    return collective_time_s(op.collective, op.message_bytes, op_group(op, tp, experts), hw)


def _feeds_te_gemm(ops: tuple[Op, ...], index: int) -> bool:
    """A TP collective just before a TE GEMM (TE gathers its quantized input); a MoE
    dispatcher's collectives carry BF16 tokens (Megatron-core quantizes inside the experts'
    `GroupedLinear`, after the dispatch)."""
    return index + 1 < len(ops) and is_te_linear_gemm(ops[index + 1]) and ops[index].group is CommGroup.TP


def fp8_cast_bytes_per_element(
    hw: HardwareProfile, recipe: Fp8Recipe = Fp8Recipe.DELAYED, dtype: Dtype = Dtype.FP8
) -> float:
    """HBM bytes per element of TE's quantization of an activation or gradient: read bf16,
    write the row-wise FP8 copy and, where one is needed, the column-wise (transposed) copy
    the wgrad GEMM reads. Per-tensor recipes write it only on GPUs whose FP8 GEMMs take the
    TN layout alone (TE pytorch/csrc/quantizer.cpp: create_transpose = columnwise_usage &&
    !non_tn_fp8_gemm_supported(); the profile's `fp8_weight_transpose_copy`): 4 bytes on
    Hopper, 3 on Blackwell. MXFP8 always writes both, since its scales run along the
    reduction axis of each GEMM, plus one scale byte per 32 elements per copy; block scaling
    likewise, with 4 bytes per 128. NVFP4 (`dtype` fp4) writes both copies too, 1/2 + 1/16
    byte per element each: the row-wise one for fprop / dgrad and the column-wise one, through
    the random Hadamard transform (inputs and grad-outputs) and stochastic rounding
    (grad-outputs), for wgrad. TE fuses the 16×16 transform into the cast where the shape
    allows (`row_cast_col_hadamard_transform_cast_fusion.cu`), so it adds no HBM traffic here;
    its 32 FLOP per element on the tensor cores are not priced."""
    copies = fp8_copies(recipe, hw.fp8_weight_copies, dtype)
    return BF16_READ_BYTES + copies * quantized_bytes_per_element(dtype, recipe)


def fp8_cast_s(
    ops: tuple[Op, ...], index: int, hw: HardwareProfile, tp: GroupPlacement,
    recipe: Fp8Recipe = Fp8Recipe.DELAYED, dtype: Dtype = Dtype.FP8,
) -> float:  # fmt: skip
    """The cast of a TE fprop input or dgrad grad-output before the FP8 GEMM at `index` (0
    for a wgrad, which reuses both casts): the GEMM's A operand [m, k], on the local shard
    where it was all-gathered (TE gathers the FP8 tensor)."""
    op = ops[index]
    assert op.gemm is not None
    if op.pass_ is Pass.WEIGHT_GRAD:
        return 0.0
    elements = quantized_input_elements(ops, index, tp.num_ranks)
    return elementwise_time_s(fp8_cast_bytes_per_element(hw, recipe, dtype) * elements, hw)


def _op_seconds(
    ops: tuple[Op, ...], index: int, hw: HardwareProfile, tp: GroupPlacement, dtype: Dtype,
    recipe: Fp8Recipe = Fp8Recipe.DELAYED, experts: ExpertGroups | None = None,
) -> float:  # fmt: skip
    """`op_time_s` with FP8's changes: an all-gather feeding a TE GEMM moves 1-byte
    elements, and a TE fprop / dgrad GEMM includes its input's cast; a grouped expert GEMM
    also the launches of TE's per-expert split quantization the graph does not hold
    (`workload.fp8.grouped_split_quantize_extra_kernels`), at the profile's kernel launch each
    (the splits' bytes are the whole tensor's, already in the cast and amax ops)."""
    op = ops[index]
    if not dtype.quantized:
        return op_time_s(op, hw, tp, dtype, experts=experts)
    if op.collective is CollectiveKind.ALL_GATHER and _feeds_te_gemm(ops, index):
        elements = op.message_bytes / dtype.num_bytes
        group = op_group(op, tp, experts)
        return collective_time_s(op.collective, elements * gathered_bytes_per_element(dtype), group, hw)
    seconds = op_time_s(op, hw, tp, dtype, recipe, experts)
    if is_te_linear_gemm(op):
        seconds += fp8_cast_s(ops, index, hw, tp, recipe, dtype)
        seconds += grouped_split_quantize_extra_kernels(op, dtype, recipe) * hw.kernel_launch_s
    return seconds


def gathered_bytes_per_element(dtype: Dtype) -> float:
    """Bytes per element of the quantized shard TE all-gathers before a TE GEMM: 1 under FP8
    (scales not counted), the packed E2M1 element and its E4M3 scale under NVFP4."""
    return quantized_bytes_per_element(dtype, Fp8Recipe.DELAYED) if dtype is Dtype.FP4 else 1.0


def price_ops(
    ops: tuple[Op, ...],
    hw: HardwareProfile,
    tp: GroupPlacement,
    dtype: Dtype,
    cp: GroupPlacement = NO_CONTEXT_PARALLEL,
    tp_comm_overlap: bool = False,
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED,
    experts: ExpertGroups | None = None,
) -> OpsCost:
    """Sum op times in order. An op marked `overlaps_next` runs beside the next op: a share
    `tp_overlap_fraction` of the shorter of the two is hidden (1 = the pair costs the
    longer of the two; below 1 the GPU's SMs and HBM are shared and overlap is partial).
    A context-parallel ring (`Op.ring`) adds its attention to compute and the transfers it
    does not hide to comm, over the ring's placement `cp` (`costs.context_parallel`).
    With `tp_comm_overlap` the TE linears' collectives are priced as TE userbuffers
    pipeline them (module docstring); the ring is priced the same way there. `fp8_recipe`
    sets what the FP8 casts write (`fp8_cast_bytes_per_element`). `experts` places a MoE
    layer's expert-group collectives (`op_group`)."""
    if tp_comm_overlap:
        return _price_ops_userbuffers(ops, hw, tp, dtype, cp, fp8_recipe, experts)
    overlap = hw.network.tp_overlap_fraction
    compute_s = comm_s = ep_comm_s = 0.0
    pending_comm_s = 0.0
    for index, op in enumerate(ops):
        if op.ring is not None:
            ring_compute_s, ring_comm_s = ring_attention_cost_s(op.ring, hw, cp)
            compute_s += ring_compute_s
            comm_s += ring_comm_s
            seconds = ring_compute_s + ring_comm_s
            comm_s += pending_comm_s - overlap * min(pending_comm_s, seconds)
            pending_comm_s = 0.0
            continue
        seconds = _op_seconds(ops, index, hw, tp, dtype, fp8_recipe, experts)
        if is_expert_collective(op):  # the dispatcher's: blocking, its own category
            ep_comm_s += seconds
            continue
        if op.kind is OpKind.COLLECTIVE and op.overlaps_next:
            pending_comm_s += seconds
            continue
        if op.kind is OpKind.COLLECTIVE:
            comm_s += seconds
        else:
            compute_s += seconds
        comm_s += pending_comm_s - overlap * min(pending_comm_s, seconds)
        pending_comm_s = 0.0
    return OpsCost(compute_s, comm_s + pending_comm_s, ep_comm_s)


def op_seconds(
    ops: tuple[Op, ...], hw: HardwareProfile, tp: GroupPlacement, dtype: Dtype,
    cp: GroupPlacement = NO_CONTEXT_PARALLEL, fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED,
    experts: ExpertGroups | None = None,
) -> tuple[float, ...]:  # fmt: skip
    """Each op's own seconds as `price_ops` prices it among its neighbours (a ring's attention
    and transfers together), before any overlap between ops: the weights `costs.host`
    spreads a pass's price over its ops with."""
    out = []
    for index, op in enumerate(ops):
        if op.ring is not None:
            out.append(sum(ring_attention_cost_s(op.ring, hw, cp)))
        else:
            out.append(_op_seconds(ops, index, hw, tp, dtype, fp8_recipe, experts))
    return tuple(out)


def is_expert_collective(op: Op) -> bool:
    """A MoE token dispatcher's collective: one over an expert group (EP, ETP, ETP·EP),
    reported as `ep_comm` rather than TP comm."""
    return op.kind is OpKind.COLLECTIVE and op.group in _EXPERT_GROUPS


_EXPERT_GROUPS = frozenset({CommGroup.EP, CommGroup.ETP, CommGroup.ETP_EP})
"""The dispatcher's groups; the router's loss all-reduces its token counts over tp·cp or
tp·cp·dp (`CommGroup.TP_CP`, `TP_DP_CP`): a plain blocking collective, priced as TP comm."""


def _sm_margin(seconds: float, hw: HardwareProfile, comm_sms: int) -> float:
    """A GEMM's time on the SMs `comm_sms` communication SMs leave (launch unchanged)."""
    sms = hw.gpu.num_sms
    if comm_sms >= sms:
        raise ValueError(f"hardware {hw.name!r}: {comm_sms} communication SMs leave no SM of {sms}")
    work_s = max(0.0, seconds - hw.kernel_launch_s)
    return hw.kernel_launch_s + work_s * sms / (sms - comm_sms)


def ring_exchange_s(gemm_s: float, gather_s: float, splits: int) -> float:
    """All-gather as a ring exchange beside the GEMM in `splits` chunks: max(G, C + G/n)."""
    return max(gemm_s, gather_s + gemm_s / splits)


def pipelined_s(gemm_s: float, comm_s: float, splits: int) -> float:
    """Two-stage pipeline of `splits` equal chunks: max(G, C) + min(G, C)/n (the first GEMM
    chunk and the last collective chunk are not overlapped)."""
    return max(gemm_s, comm_s) + min(gemm_s, comm_s) / splits


def _price_ops_userbuffers(
    ops: tuple[Op, ...],
    hw: HardwareProfile,
    tp: GroupPlacement,
    dtype: Dtype,
    cp: GroupPlacement = NO_CONTEXT_PARALLEL,
    recipe: Fp8Recipe = Fp8Recipe.DELAYED,
    experts: ExpertGroups | None = None,
) -> OpsCost:
    """`price_ops` with TE userbuffers (module docstring). The overlapped pair's time beyond
    its GEMM is exposed communication; ops outside the pairs are priced as usual, the
    context-parallel ring (`Op.ring`, on its own P2P streams, not userbuffers) included.
    A MoE dispatcher's collectives (`is_expert_collective`) are not userbuffers
    collectives (TE overlaps only its linears' TP all-gathers and reduce-scatters): they
    are priced plainly, blocking, as `ep_comm_s`."""
    compute_s = comm_s = ep_comm_s = 0.0
    n = len(ops)
    index = 0
    while index < n:
        op = ops[index]
        if op.ring is not None:
            ring_compute_s, ring_comm_s = ring_attention_cost_s(op.ring, hw, cp)
            compute_s += ring_compute_s
            comm_s += ring_comm_s
            index += 1
            continue
        after = ops[index + 1] if index + 1 < n else None
        if is_expert_collective(op):
            ep_comm_s += _op_seconds(ops, index, hw, tp, dtype, recipe, experts)
            index += 1
            continue
        if op.kind is OpKind.COLLECTIVE and after is not None and is_te_linear_gemm(after):
            gather_or_comm_s = _op_seconds(ops, index, hw, tp, dtype, recipe)
            gemm_s = _op_seconds(ops, index + 1, hw, tp, dtype, recipe)
            if op.overlaps_next:  # bulk: the whole collective beside the whole GEMM
                gemm_s = _sm_margin(gemm_s, hw, BULK_COMM_SMS)
                pair_s = max(gemm_s, gather_or_comm_s)
            else:  # ring exchange, t splits, no SM margin
                splits = RING_EXCHANGE_SPLITS_PER_RANK * tp.num_ranks
                pair_s = ring_exchange_s(gemm_s, gather_or_comm_s, splits)
            compute_s += gemm_s
            comm_s += pair_s - gemm_s
            index += 2
            continue
        if (
            is_te_linear_gemm(op)
            and after is not None
            and after.collective is CollectiveKind.REDUCE_SCATTER
            and not after.overlaps_next
            and not is_expert_collective(after)  # the experts' etp reduce-scatter is the dispatcher's
        ):
            gemm_s = _sm_margin(_op_seconds(ops, index, hw, tp, dtype, recipe), hw, PIPELINE_COMM_SMS)
            scatter_s = PIPELINE_SPLITS * collective_time_s(
                CollectiveKind.REDUCE_SCATTER, after.message_bytes / PIPELINE_SPLITS, tp, hw
            )
            compute_s += gemm_s
            comm_s += pipelined_s(gemm_s, scatter_s, PIPELINE_SPLITS) - gemm_s
            index += 2
            continue
        seconds = _op_seconds(ops, index, hw, tp, dtype, recipe, experts)
        if op.kind is OpKind.COLLECTIVE:
            comm_s += seconds
        else:
            compute_s += seconds
        index += 1
    return OpsCost(compute_s, comm_s, ep_comm_s)


def fp8_amax_reduction_s(group: GroupPlacement, hw: HardwareProfile) -> float:
    """One synchronous MAX all-reduce of the concatenated amaxes over TP×DP×CP, once per
    forward and once per backward of the FP8 autocast region (TE
    `quantization.py::reduce_and_update_fp8_tensors`; Megatron's delayed scaling wraps the
    whole block in one autocast, `transformer_block.py`). A few hundred bytes, so latency
    only (`costs.network.small_allreduce_s`)."""
    return small_allreduce_s(group, hw)


def price_layer_ops(
    ops: LayerOps,
    hw: HardwareProfile,
    tp: GroupPlacement,
    dtype: Dtype,
    cp: GroupPlacement = NO_CONTEXT_PARALLEL,
    tp_comm_overlap: bool = False,
    experts: ExpertGroups | None = None,
) -> ChunkCost:
    """One layer's (or the embedding's, or the output layer's) forward, backward and
    recompute, per microbatch."""
    return ChunkCost(
        forward=price_ops(ops.forward, hw, tp, dtype, cp, tp_comm_overlap, ops.fp8_recipe, experts),
        backward=price_ops(ops.backward, hw, tp, dtype, cp, tp_comm_overlap, ops.fp8_recipe, experts),
        recompute=price_ops(ops.recompute, hw, tp, dtype, cp, tp_comm_overlap, ops.fp8_recipe, experts),
    )


def compose_chunk(
    layers: Sequence[tuple[int, ChunkCost]], extras: Sequence[ChunkCost], per_pass_comm_s: float = 0.0
) -> ChunkCost:
    """Each (count, priced layer) of a chunk's layer segments, `count` copies, in order;
    then the forward and backward of the extras (embedding, output layer) in order;
    recompute is the layers' only. `per_pass_comm_s` (FP8's amax reduction) is added once
    to the forward and once to the backward."""
    forward = backward = recompute = OpsCost()
    for num_layers, layer in layers:
        forward, backward = (
            forward + layer.forward.scaled(num_layers),
            backward + layer.backward.scaled(num_layers),
        )
        recompute = recompute + layer.recompute.scaled(num_layers)
    for extra in extras:
        forward, backward = forward + extra.forward, backward + extra.backward
    if per_pass_comm_s:
        amax = OpsCost(comm_s=per_pass_comm_s)
        forward, backward = forward + amax, backward + amax
    return ChunkCost(forward=forward, backward=backward, recompute=recompute)
