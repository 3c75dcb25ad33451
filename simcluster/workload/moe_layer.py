"""The op graph of a mixture-of-experts layer on one rank: the dense layer's attention
block, then Megatron-core's MoE MLP with the alltoall token dispatcher in place of the MLP.

Megatron-core `MoELayer.forward` (megatron/core/transformer/moe/moe_layer.py, Megatron-LM
@d98e8a64ddf34856e74b24714e3bedb2f5a39553), forward, per rank and microbatch:

    router GEMM [T, h] x [h, E]   (router.py `TopKRouter.gating`, weight replicated)
    top-k + score function        (moe_utils.py `topk_routing_with_score_function`)
    tokens-per-expert all-gather  (etp·ep group, token_dispatcher.py `preprocess`)
    permute                       (memory-bound; moe_utils.py `permute`)
    dispatch all-to-all           (ep group: tokens, then probs)
    [etp > 1: all-gather of tokens and probs over etp]
    sort by local expert          (when a rank holds several experts)
    expert fc1, weighted SwiGLU, fc2   (experts.py `TEGroupedMLP`)
    sort back, [etp > 1: reduce-scatter over etp], combine all-to-all (ep)
    unpermute                     (scatter-add into [T, h])
    shared experts (if any)       (shared_experts.py, tensor-parallel like the dense MLP)

With `--moe-router-fusion` the top-k op is Transformer Engine's fused kernel, and with
`--moe-permute-fusion` (alltoall) the permute, chunk sorts and unpermute are TE's fused
permutation kernels: their bytes and saved bytes from `moe_fusion` (Megatron-LM @d7288711,
TE @71bbefbf); the op list is the same.

Every number comes from the building blocks, not re-derived here: rows from
`moe.routed_rows` (the busiest expert rank sets the pace: `load_imbalance`), GEMM shapes from
`moe.expert_gemms`, messages from `moe.dispatch_messages`, permute bytes from
`moe.permute_bytes`, saved bytes from `moe_memory` (router, permute, experts, shared).

The routed experts' GEMMs are ops of the per-expert shape with `batch` = E/ep local
experts (`moe.expert_gemms`), not one GEMM of the summed rows: Transformer Engine's
`GroupedLinear` (`--moe-grouped-gemm`) runs one GEMM per local expert of that expert's
rows (a cuBLAS grouped GEMM or one stream each), so its efficiency is that of the small
per-expert shape, which the profile's GEMM model prices by shape; the summed-rows GEMM
would price a shape no kernel runs. Without `--moe-grouped-gemm` (`SequentialMLP`) the
same GEMMs are separate ops, one kernel launch each.

Backward: the mirror, each GEMM's input-gradient and weight-gradient GEMMs, each
collective's mirror (all-to-all <-> all-to-all with the same bytes, all-gather <->
reduce-scatter), the memory-bound kernels with their forward bytes (the permute's backward
is the unpermute's gather and vice versa: same rows). The router's top-k backward reads
and writes [T, E] (3·T·E·e bytes, an estimate: not measured).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from simcluster.config.choices import Recompute
from simcluster.config.moe_choices import FlexBackend, RecomputeModule, TokenDispatcher
from simcluster.workload.fp8 import amax_pass_ops, moe_fp8_saved_forward
from simcluster.workload.gptoss_experts import (
    expert_bias_backward_ops,
    expert_bias_forward_ops,
    glu_clamp_backward_ops,
    glu_clamp_forward_ops,
)
from simcluster.workload.layer import LayerOps
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.moe import (
    INDEX_BYTES,
    MessageKind,
    PermuteBytes,
    RoutedRows,
    dispatch_messages,
    expert_gemms,
    permute_bytes,
    routed_rows,
    shared_expert_shape,
)
from simcluster.workload.moe_aux_loss import LOSS_MODULES, loss_ops
from simcluster.workload.moe_config import ExpertLayout, MoEConfig
from simcluster.workload.moe_flex import (
    deepep_messages,
    flex_permute,
    hybridep_handle_bytes,
    hybridep_messages,
)
from simcluster.workload.moe_fp8_padding import experts_padded, padding_backward_ops, padding_forward_ops
from simcluster.workload.moe_fusion import fused_permute_bytes, fused_router_saved_bytes, fused_topk_bytes
from simcluster.workload.moe_memory import moe_saved_bytes
from simcluster.workload.ops import (
    CollectiveKind,
    CommGroup,
    DeepEPMessage,
    GemmShape,
    Module,
    Op,
    Pass,
    collective,
    elementwise,
    gemm,
)

DENSE_MLP_MODULES = frozenset({Module.FC1, Module.FC2, Module.SWIGLU, Module.BIAS_GELU, Module.SQUARED_RELU})
"""The dense MLP's modules (its linears, their TP collectives, the activation): the run of
ops a MoE layer replaces."""

_QUANTIZATION_MODULES = frozenset({Module.FP8_AMAX, Module.FP8_SCALE})

_GROUPS = {"ep": CommGroup.EP, "etp": CommGroup.ETP, "etp_ep": CommGroup.ETP_EP}
_KINDS = {
    MessageKind.ALL_TO_ALL: CollectiveKind.ALL_TO_ALL,
    MessageKind.ALL_GATHER: CollectiveKind.ALL_GATHER,
    MessageKind.REDUCE_SCATTER: CollectiveKind.REDUCE_SCATTER,
}
_MIRROR = {
    CollectiveKind.ALL_TO_ALL: CollectiveKind.ALL_TO_ALL,
    CollectiveKind.ALL_GATHER: CollectiveKind.REDUCE_SCATTER,
    CollectiveKind.REDUCE_SCATTER: CollectiveKind.ALL_GATHER,
}


@dataclass(frozen=True, slots=True)
class MoELayerSpec:
    """What makes a MoE layer's ops differ from its dense layer's: the experts, their layout
    over the ranks, the dispatcher and whether the experts run as grouped GEMMs."""

    moe: MoEConfig
    layout: ExpertLayout
    dispatcher: TokenDispatcher = TokenDispatcher.ALLTOALL
    grouped_gemm: bool = True
    flex_backend: FlexBackend = FlexBackend.DEEPEP  # the flex dispatcher's kernels
    router_fusion: bool = False  # `--moe-router-fusion` (`workload.moe_fusion`)
    permute_fusion: bool = False  # `--moe-permute-fusion` (alltoall; hybridep permutes in its own kernel)

    def __post_init__(self) -> None:
        hybridep = self.dispatcher is TokenDispatcher.FLEX and self.flex_backend is FlexBackend.HYBRIDEP
        if self.permute_fusion and not (self.dispatcher is TokenDispatcher.ALLTOALL or hybridep):
            raise ValueError(
                f"MoELayerSpec.permute_fusion=True is not priced with the {self.dispatcher.value} dispatcher "
                f"({self.flex_backend.value} backend); allowed: alltoall, or flex with hybridep"
            )


def layer_rows(cfg: LayerConfig, spec: MoELayerSpec) -> RoutedRows:
    """`moe.routed_rows` for the rank's layer (`cfg.seq_length` is already s/cp)."""
    return routed_rows(cfg.seq_length * spec.layout.cp, cfg.micro_batch_size, spec.moe, spec.layout)


def _int_rows(value: float) -> int:
    return max(round(value), 1)


def _expert_gemm_ops(
    name: str, shape: GemmShape, grouped: bool, module: Module, pass_: Pass, saved: float = 0.0
) -> tuple[Op, ...]:
    """One grouped op (`batch` local experts) or, without grouped GEMM, one op per expert;
    the saved bytes on the first."""
    if grouped:
        return (gemm(name, shape, saved, module=module, pass_=pass_),)
    one = replace(shape, batch=1)
    return tuple(
        gemm(f"{name}.{i}", one, saved if i == 0 else 0.0, module=module, pass_=pass_)
        for i in range(shape.batch)
    )


def _messages(
    cfg: LayerConfig, spec: MoELayerSpec, rows: RoutedRows
) -> dict[str, tuple[CollectiveKind, CommGroup, float]]:
    """The dispatcher's forward collectives by name: kind, group, the busiest rank's bytes."""
    e = cfg.element_bytes
    out = {}
    for message in dispatch_messages(rows, cfg.hidden_size, spec.moe, spec.layout, spec.dispatcher, e, e):
        out[message.name] = (_KINDS[message.kind], _GROUPS[message.group.value], message.busiest_bytes)
    return out


def _collective_ops(
    names: tuple[str, ...], messages: dict[str, tuple[CollectiveKind, CommGroup, float]], module: Module,
    backward: bool,
) -> tuple[Op, ...]:  # fmt: skip
    ops = []
    for name in names:
        if name not in messages:
            continue
        kind, group, size = messages[name]
        if backward:
            kind = _MIRROR[kind]
        label = f"{name}.bwd" if backward else name
        pass_ = Pass.INPUT_GRAD if backward else Pass.FORWARD
        ops.append(collective(label, kind, size, module=module, pass_=pass_, group=group))
    return tuple(ops)


def _shared_ops(cfg: LayerConfig, spec: MoELayerSpec) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """The shared experts (forward, backward): a dense SwiGLU MLP of width f_s,
    tensor-parallel over tp on the s·b/cp tokens (SP gathers them, as the dense MLP's
    `_tp_enter` / `_tp_exit`); saved: fc1 output and fc2 input (moe_memory `shared`)."""
    if not spec.moe.shared_expert_ffn_hidden_size:
        return (), ()
    e, tokens, h, t = cfg.element_bytes, cfg.tokens, cfg.hidden_size, cfg.tp
    shape = shared_expert_shape(h, spec.moe, gated=True)
    fc1, f = shape.fc1_width // t, shape.ffn_hidden_size // t
    full = e * tokens * h
    F, B, W = Pass.FORWARD, Pass.INPUT_GRAD, Pass.WEIGHT_GRAD
    S1, S2, ACT = Module.SHARED_FC1, Module.SHARED_FC2, Module.SWIGLU
    sp = cfg.sequence_parallel
    reduce = CollectiveKind.REDUCE_SCATTER if sp else CollectiveKind.ALL_REDUCE
    forward: list[Op] = []
    if sp:
        forward.append(
            collective("moe.shared.fc1.allgather", CollectiveKind.ALL_GATHER, full, module=S1, pass_=F)
        )
    forward += [
        gemm("moe.shared.fc1", GemmShape(m=tokens, n=fc1, k=h), module=S1, pass_=F),
        elementwise("moe.shared.swiglu", 3 * e * tokens * f, e * tokens * fc1, module=ACT, pass_=F),
        gemm("moe.shared.fc2", GemmShape(m=tokens, n=h, k=f), e * tokens * f, module=S2, pass_=F),
    ]
    if t > 1:
        forward.append(collective(f"moe.shared.fc2.{reduce.value}", reduce, full, module=S2, pass_=F))
    backward: list[Op] = []
    if sp:
        backward.append(
            collective("moe.shared.fc2.allgather.bwd", CollectiveKind.ALL_GATHER, full, module=S2, pass_=B)
        )
    backward += [
        gemm("moe.shared.fc2.dgrad", GemmShape(m=tokens, n=f, k=h), module=S2, pass_=B),
        gemm("moe.shared.fc2.wgrad", GemmShape(m=f, n=h, k=tokens, accumulate_fp32=True), module=S2, pass_=W),
        elementwise("moe.shared.swiglu.bwd", 5 * e * tokens * f, module=ACT, pass_=B),
    ]
    if sp:
        backward.append(
            collective(
                "moe.shared.fc1.input_allgather.bwd",
                CollectiveKind.ALL_GATHER,
                full,
                True,
                module=S1,
                pass_=W,
            )
        )
    backward.append(gemm("moe.shared.fc1.dgrad", GemmShape(m=tokens, n=h, k=fc1), module=S1, pass_=B))
    if t > 1:
        backward.append(
            collective(f"moe.shared.fc1.{reduce.value}.bwd", reduce, full, True, module=S1, pass_=B)
        )
    backward.append(
        gemm(
            "moe.shared.fc1.wgrad", GemmShape(m=h, n=fc1, k=tokens, accumulate_fp32=True), module=S1, pass_=W
        )
    )
    return tuple(forward), tuple(backward)


@dataclass(frozen=True, slots=True)
class _DispatchOps:
    """A token dispatcher's ops around the experts, per pass: forward `before` the experts
    (after the router's top-k) and `after` them (before the shared experts); backward
    `before` the experts' backward (the combine's mirror) and `after` it (the dispatch's)."""

    forward_before: tuple[Op, ...]
    forward_after: tuple[Op, ...]
    backward_before: tuple[Op, ...]
    backward_after: tuple[Op, ...]


def _alltoall_dispatch_ops(
    cfg: LayerConfig, spec: MoELayerSpec, rows: RoutedRows, saved_permute: float
) -> _DispatchOps:
    """`MoEAlltoAllTokenDispatcher`: tokens-per-expert all-gather, permute, dispatch
    all-to-alls (tokens, probs) over EP, [etp all-gathers], sort by local expert; then sort
    back, [etp reduce-scatter], combine all-to-all, unpermute (module docstring)."""
    e, F, B = cfg.element_bytes, Pass.FORWARD, Pass.INPUT_GRAD
    moved = permute_bytes(rows, cfg.hidden_size, spec.moe, spec.layout, e, e)
    permute_backward = moved.permute
    if spec.permute_fusion:  # TE's fused permutation kernels (`workload.moe_fusion`)
        fused = fused_permute_bytes(rows, cfg.hidden_size, spec.moe, spec.layout, e, e)
        moved = PermuteBytes(fused.permute, fused.sort_chunks, fused.unpermute)
        permute_backward = fused.permute_backward
    messages = _messages(cfg, spec, rows)
    sort: tuple[Op, ...] = ()
    if moved.sort_chunks:
        sort = (elementwise("moe.sort_chunks", moved.sort_chunks, module=Module.MOE_SORT_CHUNKS, pass_=F),)
    dispatch = ("moe.dispatch", "moe.dispatch_probs", "moe.dispatch_etp", "moe.dispatch_probs_etp")
    return _DispatchOps(
        forward_before=(
            *_collective_ops(("moe.tokens_per_expert",), messages, Module.MOE_PERMUTE, False),
            elementwise("moe.permute", moved.permute, saved_permute, module=Module.MOE_PERMUTE, pass_=F),
            *_collective_ops(dispatch, messages, Module.MOE_PERMUTE, False),
            *sort,
        ),
        forward_after=(
            *sort,
            *_collective_ops(("moe.combine_etp", "moe.combine"), messages, Module.MOE_UNPERMUTE, False),
            elementwise("moe.unpermute", moved.unpermute, module=Module.MOE_UNPERMUTE, pass_=F),
        ),
        backward_before=(
            elementwise("moe.unpermute.bwd", moved.unpermute, module=Module.MOE_UNPERMUTE, pass_=B),
            *_collective_ops(("moe.combine", "moe.combine_etp"), messages, Module.MOE_UNPERMUTE, True),
            *(replace(op, name=f"{op.name}.bwd", pass_=B) for op in sort),
        ),
        backward_after=(
            *(replace(op, name=f"{op.name}.bwd", pass_=B) for op in sort),
            *_collective_ops(tuple(reversed(dispatch)), messages, Module.MOE_PERMUTE, True),
            elementwise("moe.permute.bwd", permute_backward, module=Module.MOE_PERMUTE, pass_=B),
        ),
    )


def _allgather_dispatch_ops(
    cfg: LayerConfig, spec: MoELayerSpec, rows: RoutedRows, saved_permute: float
) -> _DispatchOps:
    """`MoEAllGatherTokenDispatcher` (token_dispatcher.py, Megatron-LM
    @d98e8a64ddf34856e74b24714e3bedb2f5a39553): `token_permutation` all-gathers the
    routing map (under no_grad: no backward), the probs and the tokens over the etp·ep
    group (`gather_from_sequence_parallel_region`, whose backward is a reduce-scatter),
    then permutes the local experts' rows out of the gathered [T·etp·ep, h] and takes their
    probs by `masked_select` (no chunk sort); `token_unpermutation` scatters the expert
    output back to [T·etp·ep, h] and reduce-scatters it over etp·ep
    (`reduce_scatter_to_sequence_parallel_region`, backward an all-gather). Bytes:
    `moe.dispatch_messages` and `moe.permute_bytes` (dispatcher allgather); every rank
    moves the same message bytes, the busiest expert rank's GEMM rows set the pace."""
    e, F, B = cfg.element_bytes, Pass.FORWARD, Pass.INPUT_GRAD
    moved = permute_bytes(
        rows, cfg.hidden_size, spec.moe, spec.layout, e, e, dispatcher=TokenDispatcher.ALLGATHER
    )
    messages = _messages(cfg, spec, rows)
    gathers = ("moe.routing_map_allgather", "moe.probs_allgather", "moe.dispatch_allgather")
    with_grad = ("moe.dispatch_allgather", "moe.probs_allgather")  # the routing map has none
    combine = ("moe.combine_reduce_scatter",)
    return _DispatchOps(
        forward_before=(
            *_collective_ops(gathers, messages, Module.MOE_PERMUTE, False),
            elementwise("moe.permute", moved.permute, saved_permute, module=Module.MOE_PERMUTE, pass_=F),
        ),
        forward_after=(
            elementwise("moe.unpermute", moved.unpermute, module=Module.MOE_UNPERMUTE, pass_=F),
            *_collective_ops(combine, messages, Module.MOE_UNPERMUTE, False),
        ),
        backward_before=(
            *_collective_ops(combine, messages, Module.MOE_UNPERMUTE, True),
            elementwise("moe.unpermute.bwd", moved.unpermute, module=Module.MOE_UNPERMUTE, pass_=B),
        ),
        backward_after=(
            elementwise("moe.permute.bwd", moved.permute, module=Module.MOE_PERMUTE, pass_=B),
            *_collective_ops(with_grad, messages, Module.MOE_PERMUTE, True),
        ),
    )


def _fused_permute(spec: MoELayerSpec) -> bool:
    """Whether the permutation runs TE's fused kernels: `--moe-permute-fusion` under the alltoall
    dispatcher (`MoELayerSpec` refuses it with allgather and DeepEP; HybridEP permutes in its
    own kernel, `_HybridEPManager` never reads the flag)."""
    return spec.permute_fusion and spec.dispatcher is TokenDispatcher.ALLTOALL


def _saved_as(dispatcher: TokenDispatcher) -> TokenDispatcher:
    """The dispatcher whose permute `moe_memory.moe_saved_bytes` counts: flex permutes the
    received tokens with the alltoall path's `permute` (its own bytes replace them,
    `_flex_dispatch_ops`)."""
    return TokenDispatcher.ALLTOALL if dispatcher is TokenDispatcher.FLEX else dispatcher


def _flex_dispatch_ops(
    cfg: LayerConfig, spec: MoELayerSpec, rows: RoutedRows, saved_permute: float
) -> _DispatchOps:
    """`MoEFlexTokenDispatcher` with DeepEP (`--moe-token-dispatcher-type flex
    --moe-enable-deepep`, token_dispatcher.py and fused_a2a.py, Megatron-LM
    @d98e8a64ddf34856e74b24714e3bedb2f5a39553): DeepEP's dispatch kernel sends each token
    once to each destination rank (`moe_flex.deepep_messages`), the received tokens are
    permuted into the local experts' rows (`moe_flex.flex_permute`); after the experts,
    unpermute and DeepEP's combine. Backward: combine's backward is a dispatch and
    dispatch's a combine (DeepEP README), priced with the same bytes. `saved_permute` (the
    alltoall path's) is replaced by the flex permute's own."""
    if spec.flex_backend is FlexBackend.HYBRIDEP:
        return _hybridep_dispatch_ops(cfg, spec, rows)
    e, F, B = cfg.element_bytes, Pass.FORWARD, Pass.INPUT_GRAD
    h = cfg.hidden_size
    dispatch, combine = deepep_messages(rows, h, spec.moe, spec.layout, e)
    moved = flex_permute(rows, h, spec.moe, spec.layout, e)
    A2A, EP = CollectiveKind.ALL_TO_ALL, CommGroup.EP

    def kernel(name: str, message: DeepEPMessage, module: Module, pass_: Pass) -> Op:
        op = collective(name, A2A, message.send_bytes, module=module, pass_=pass_, group=EP)
        return replace(op, deepep=message)

    return _DispatchOps(
        forward_before=(
            kernel("moe.deepep_dispatch", dispatch, Module.MOE_PERMUTE, F),
            elementwise("moe.permute", moved.permute, moved.saved, module=Module.MOE_PERMUTE, pass_=F),
        ),
        forward_after=(
            elementwise("moe.unpermute", moved.unpermute, module=Module.MOE_UNPERMUTE, pass_=F),
            kernel("moe.deepep_combine", combine, Module.MOE_UNPERMUTE, F),
        ),
        backward_before=(
            kernel("moe.deepep_combine.bwd", combine, Module.MOE_UNPERMUTE, B),
            elementwise("moe.unpermute.bwd", moved.unpermute, module=Module.MOE_UNPERMUTE, pass_=B),
        ),
        backward_after=(
            elementwise("moe.permute.bwd", moved.permute, module=Module.MOE_PERMUTE, pass_=B),
            kernel("moe.deepep_dispatch.bwd", dispatch, Module.MOE_PERMUTE, B),
        ),
    )


def _flex_kernel(name: str, message: DeepEPMessage, module: Module, pass_: Pass) -> Op:
    A2A, EP = CollectiveKind.ALL_TO_ALL, CommGroup.EP
    op = collective(name, A2A, message.send_bytes, module=module, pass_=pass_, group=EP)
    return replace(op, deepep=message)


def _hybridep_dispatch_ops(cfg: LayerConfig, spec: MoELayerSpec, rows: RoutedRows) -> _DispatchOps:
    """`MoEFlexTokenDispatcher` with `--moe-flex-dispatcher-backend hybridep`
    (`_HybridEPManager`, fused_a2a.py `hybrid_ep_dispatch` / `hybrid_ep_combine`, Megatron-LM
    @d98e8a64ddf34856e74b24714e3bedb2f5a39553, `moe_permute_fusion_into_hybridep` off):
    `dispatch_with_permute` all-gathers the [T, E] routing map over the group
    (`Executor::allgather_routing_map`: NCCL `all_gather_into_tensor`, no gradient), scans it
    into the handle, dispatches (`moe_flex.hybridep_messages`) and permutes the received tokens
    into the local experts' rows with its own kernel (bytes as `moe_flex.flex_permute`'s);
    `combine_with_unpermute` unpermutes and combines. The handle is what the permute keeps
    for backward (`moe_flex.hybridep_handle_bytes`); nothing of Megatron's own permute runs."""
    e, F, B = cfg.element_bytes, Pass.FORWARD, Pass.INPUT_GRAD
    h, moe, layout = cfg.hidden_size, spec.moe, spec.layout
    kernels = hybridep_messages(rows, h, moe, layout, e)
    moved = flex_permute(rows, h, moe, layout, e)
    handle = hybridep_handle_bytes(rows, moe, layout)
    routing_map = rows.tokens * layout.ep * moe.num_experts  # the gathered [T·ep, E] bools
    P, U, AG = Module.MOE_PERMUTE, Module.MOE_UNPERMUTE, CollectiveKind.ALL_GATHER
    return _DispatchOps(
        forward_before=(
            collective("moe.hybridep_map_allgather", AG, routing_map, module=P, pass_=F, group=CommGroup.EP),
            _flex_kernel("moe.hybridep_dispatch", kernels.dispatch, P, F),
            elementwise("moe.permute", moved.permute, handle, module=P, pass_=F),
        ),
        forward_after=(
            elementwise("moe.unpermute", moved.unpermute, module=U, pass_=F),
            _flex_kernel("moe.hybridep_combine", kernels.combine, U, F),
        ),
        backward_before=(
            _flex_kernel("moe.hybridep_combine.bwd", kernels.combine_backward, U, B),
            elementwise("moe.unpermute.bwd", moved.unpermute, module=U, pass_=B),
        ),
        backward_after=(
            elementwise("moe.permute.bwd", moved.permute, module=P, pass_=B),
            _flex_kernel("moe.hybridep_dispatch.bwd", kernels.dispatch_backward, P, B),
        ),
    )  # fmt: skip


def _dispatch_ops(
    cfg: LayerConfig, spec: MoELayerSpec, rows: RoutedRows, saved_permute: float
) -> _DispatchOps:
    """The ops of `spec.dispatcher` around the experts."""
    if spec.dispatcher is TokenDispatcher.ALLGATHER:
        return _allgather_dispatch_ops(cfg, spec, rows, saved_permute)
    if spec.dispatcher is TokenDispatcher.FLEX:
        return _flex_dispatch_ops(cfg, spec, rows, saved_permute)
    return _alltoall_dispatch_ops(cfg, spec, rows, saved_permute)


@functools.lru_cache(maxsize=256)
def moe_mlp_ops(cfg: LayerConfig, spec: MoELayerSpec) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """The MoE MLP's (forward, backward) ops on the busiest expert rank (module docstring).
    Forward saved bytes: the block input on the router GEMM (the dense fc1 kept it: the
    MLP input of docs/memory.md's regions) plus `moe_memory.moe_saved_bytes`, part by part."""
    moe, layout = spec.moe, spec.layout
    e, h, E, k = cfg.element_bytes, cfg.hidden_size, moe.num_experts, moe.router_topk
    rows = layer_rows(cfg, spec)
    T = _int_rows(rows.tokens)
    saved = moe_saved_bytes(
        rows,
        h,
        moe,
        layout,
        gated=True,
        element_bytes=e,
        probs_bytes=e,
        permute_fusion=_fused_permute(spec),
        dispatcher=_saved_as(spec.dispatcher),
    )
    if spec.router_fusion:  # TE's fused top-k keeps its map and fp32 scores (`workload.moe_fusion`)
        saved = replace(saved, router=fused_router_saved_bytes(rows.tokens, moe))
    fc1, fc2 = expert_gemms(rows, h, moe, layout, gated=True)
    re = rows.busiest_expert
    f = fc2.k  # f/etp
    F, B, W = Pass.FORWARD, Pass.INPUT_GRAD, Pass.WEIGHT_GRAD
    region_in = e * cfg.region_tokens * h
    grouped = spec.grouped_gemm
    dispatch = _dispatch_ops(cfg, spec, rows, saved.permute)
    # logits in; probs, indices, map out
    topk_bytes: float = T * E * e + T * k * (e + INDEX_BYTES) + T * E * (e + 1)
    topk_backward_bytes: float = 3 * T * E * e
    if spec.router_fusion:
        topk_bytes, topk_backward_bytes = fused_topk_bytes(T, E, e)
    shared_forward, shared_backward = _shared_ops(cfg, spec)
    # the router's z-loss and load-balancing loss (`workload.moe_aux_loss`); none by default
    losses = loss_ops(rows.tokens, cfg.micro_batch_size, moe, layout, e, spec.router_fusion)
    clamp = moe.activation_func_clamp_value is not None  # gpt-oss (`workload.gptoss_experts`)
    m_local = fc1.batch
    capacity_rows = fc1.m if moe.capacity_factor is not None and moe.pad_to_capacity else None
    padded = experts_padded(cfg, spec.dispatcher, spec.flex_backend, capacity_rows)
    pad_before, pad_after = padding_forward_ops(e, re, h) if padded else ((), ())
    unpad_before, unpad_after = padding_backward_ops(e, re, h) if padded else ((), ())
    forward = (
        gemm("moe.router", GemmShape(m=T, n=E, k=h), region_in, module=Module.ROUTER, pass_=F),
        *losses.z_forward,
        elementwise("moe.router_topk", topk_bytes, saved.router, module=Module.ROUTER_TOPK, pass_=F),
        *losses.aux_forward,
        *dispatch.forward_before,
        *pad_before,
        *_expert_gemm_ops("moe.experts.fc1", fc1, grouped, Module.EXPERT_FC1, F, re * e * h),
        *(glu_clamp_forward_ops(e, re, f) if clamp else ()),
        elementwise(
            "moe.experts.swiglu",
            3 * e * re * f + re * e,
            re * e * fc1.n + re * e,
            module=Module.SWIGLU,
            pass_=F,
        ),  # fmt: skip
        *_expert_gemm_ops("moe.experts.fc2", fc2, grouped, Module.EXPERT_FC2, F, re * e * f),
        *(expert_bias_forward_ops(e, re, h, fc1.batch) if moe.expert_bias else ()),
        *pad_after,
        *dispatch.forward_after,
        *shared_forward,
    )
    m, local = fc1.m, fc1.batch
    backward = (
        *shared_backward,
        *dispatch.backward_before,
        *(expert_bias_backward_ops(e, re, h, m_local) if moe.expert_bias else ()),
        *unpad_before,
        *_expert_gemm_ops(
            "moe.experts.fc2.dgrad", GemmShape(m=m, n=f, k=h, batch=local), grouped, Module.EXPERT_FC2, B
        ),
        *_expert_gemm_ops(
            "moe.experts.fc2.wgrad",
            GemmShape(m=f, n=h, k=m, batch=local, accumulate_fp32=True),
            grouped,
            Module.EXPERT_FC2,
            W,
        ),  # fmt: skip
        elementwise("moe.experts.swiglu.bwd", 5 * e * re * f + 2 * re * e, module=Module.SWIGLU, pass_=B),
        *(glu_clamp_backward_ops(e, re, f) if clamp else ()),
        *_expert_gemm_ops(
            "moe.experts.fc1.dgrad", GemmShape(m=m, n=h, k=fc1.n, batch=local), grouped, Module.EXPERT_FC1, B
        ),
        *_expert_gemm_ops(
            "moe.experts.fc1.wgrad",
            GemmShape(m=h, n=fc1.n, k=m, batch=local, accumulate_fp32=True),
            grouped,
            Module.EXPERT_FC1,
            W,
        ),  # fmt: skip
        *unpad_after,
        *dispatch.backward_after,
        *losses.aux_backward,
        elementwise("moe.router_topk.bwd", topk_backward_bytes, module=Module.ROUTER_TOPK, pass_=B),
        *losses.z_backward,
        gemm("moe.router.dgrad", GemmShape(m=T, n=h, k=E), module=Module.ROUTER, pass_=B),
        *_input_grad_adds(e, T, h, shared=bool(shared_backward)),
        gemm(
            "moe.router.wgrad", GemmShape(m=h, n=E, k=T, accumulate_fp32=True), module=Module.ROUTER, pass_=W
        ),
    )
    return forward, backward


def _input_grad_adds(e: int, tokens: int, h: int, shared: bool) -> tuple[Op, ...]:
    """Autograd's sums of the MoE block input's gradient: the pre-MLP norm's output feeds
    the router (`self.route(hidden_states)`) and the dispatcher (`self.preprocess(
    hidden_states, ...)`), and the shared experts where the layer has them
    (`shared_experts_compute(hidden_states)`), megatron/core/transformer/moe/moe_layer.py:
    558-561 (Megatron-LM @d7288711ba278d160d2a5a22c099915c9fe1395c), so the engine adds the
    gradients reaching it, one add per consumer after the first, before the norm's backward:
    each reads two [T, h] gradients and writes their sum, 3·e·T·h, the residual-grad add's
    traffic (a one-way kind, `costs.compute.ONE_WAY_KINDS`). Placed after the router's dgrad,
    the last of them to arrive."""
    names = ("moe.input_grad_add", "moe.shared.input_grad_add") if shared else ("moe.input_grad_add",)
    moved = 3 * e * tokens * h
    add = Module.MOE_INPUT_GRAD_ADD
    return tuple(elementwise(name, moved, module=add, pass_=Pass.INPUT_GRAD) for name in names)


def _splice(ops: tuple[Op, ...], replacement: tuple[Op, ...]) -> tuple[Op, ...]:
    """`ops` with its run of dense-MLP ops replaced (the run is contiguous in every pass)."""
    where = [i for i, op in enumerate(ops) if op.module in DENSE_MLP_MODULES]
    if not where:
        return ops
    first, last = where[0], where[-1]
    # FP8 current scaling / NVFP4 put the MLP GEMMs' amax and scale ops just before them
    # (`workload.fp8.current_scaling_ops`): they belong to the run
    while first > 0 and ops[first - 1].module in _QUANTIZATION_MODULES:
        first -= 1
    where = [i for i in range(first, last + 1) if ops[i].module in DENSE_MLP_MODULES | _QUANTIZATION_MODULES]
    if last - first + 1 != len(where):
        raise ValueError("the dense MLP's ops are not one contiguous run; cannot place the MoE MLP")
    return ops[:first] + replacement + ops[last + 1 :]


def moe_layer_config(cfg: LayerConfig) -> LayerConfig:
    """`cfg` for a MoE layer: without `mlp` among the recompute modules, which Megatron-core
    reads only on a dense layer (transformer_layer.py: `recompute_mlp` is set `if not
    self.is_moe_layer`), so the dense ops a MoE layer starts from carry no MLP checkpoint."""
    modules = cfg.recompute_modules
    if modules is None or RecomputeModule.MLP not in modules:
        return cfg
    return replace(cfg, recompute_modules=modules - {RecomputeModule.MLP})


@functools.lru_cache(maxsize=256)
def moe_layer_ops(dense: LayerOps, cfg: LayerConfig, spec: MoELayerSpec) -> LayerOps:
    """The dense layer's ops (`dense`, context parallelism and recompute applied) with its
    MLP replaced by the MoE MLP. Full recompute keeps only the layer input and re-runs the
    whole forward, MoE block (dispatch included) too; selective recompute applies the MoE
    block's `--recompute-modules` (`moe_recompute_ops`) on top of the dense layer's (the
    attention core under Megatron's default `core_attn`)."""
    forward, backward = moe_mlp_ops(cfg, spec)
    if cfg.dtype.quantized:  # FP8 / NVFP4 experts (`workload.fp8`); the router stays BF16
        forward = amax_pass_ops(moe_fp8_saved_forward(forward, cfg), cfg)
        backward = amax_pass_ops(backward, cfg)
    if cfg.recompute is Recompute.FULL:
        forward = tuple(replace(op, saved_bytes=0.0) for op in forward)
        recompute = _splice(dense.recompute, forward)
        # the checkpointed first run is under no_grad: the router's losses run in the recompute only
        forward = _without_losses(forward)
    else:
        forward, rerun = moe_recompute_ops(cfg, forward, _pre_mlp_norm(dense.forward))
        recompute = rerun + dense.recompute
    return LayerOps(
        _splice(dense.forward, forward), _splice(dense.backward, backward), recompute, dense.fp8_recipe
    )


def _without_losses(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """`ops` without the router's losses: router.py computes them only with gradients on
    (`self.training and torch.is_grad_enabled()`), so a checkpoint's no_grad first run skips
    them and its recompute runs them (`workload.moe_aux_loss`)."""
    return tuple(op for op in ops if op.module not in LOSS_MODULES)


def _pre_mlp_norm(dense_forward: tuple[Op, ...]) -> Op:
    """The dense layer's pre-MLP norm: the last norm before its MLP run."""
    first = next(i for i, op in enumerate(dense_forward) if op.module in DENSE_MLP_MODULES)
    return next(op for op in reversed(dense_forward[:first]) if op.module is Module.LAYERNORM)


_ACTIVATIONS = frozenset({Module.SWIGLU, Module.BIAS_GELU, Module.SQUARED_RELU, Module.GLU_CLAMP})


def _zero(op: Op) -> Op:
    return replace(op, saved_bytes=0.0)


def moe_recompute_ops(
    cfg: LayerConfig, forward: tuple[Op, ...], pre_mlp_norm: Op
) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """The MoE MLP's forward (`moe_mlp_ops`) with the selective `--recompute-modules` it
    reads applied, and the forward ops its backward re-runs, in the order it re-runs them.
    Megatron-core @d98e8a64ddf34856e74b24714e3bedb2f5a39553:

    - `layernorm`: the pre-MLP norm (a TENorm of its own in a MoE layer's TE spec, unlike
      the dense layer's, fused into fc1) runs under `CheckpointWithoutOutput`
      (transformer_layer.py `_forward_pre_mlp_layernorm`): its output, the block input the
      router GEMM (and the shared experts' fc1, the same storage) keep, e·T·h, is freed
      after the MLP and the norm re-runs before the MLP's backward.
    - `moe`: `MoELayer.forward` checkpoints the whole block on its input
      (`tensor_parallel.checkpoint(custom_forward, ...)`): it keeps only that input (the
      router's) and re-runs every forward op, dispatch and combine included.
    - `shared_experts`: `shared_experts_compute` checkpoints the shared MLP on the block
      input: its fc1 output and fc2 input are freed, its forward (with its TP collectives)
      re-runs.
    - `moe_act`: the experts' activation runs under `CheckpointWithoutOutput`
      (experts.py `TEGroupedMLP`): fc2's input is freed after fc2, the activation re-runs
      from the fc1 output and probs it keeps.

    The checkpoints nest as in Megatron: inside `moe`, a `shared_experts` or `moe_act`
    checkpoint runs again when the backward reaches it, so those ops re-run twice. The
    saved bytes equal `moe_memory.moe_saved_bytes(recompute=...)` plus the block input
    unless `layernorm` (tested)."""
    if cfg.recompute is not Recompute.SELECTIVE:
        return forward, ()
    fc1_last = max(i for i, op in enumerate(forward) if op.module is Module.EXPERT_FC1)
    fc2_first = next(i for i, op in enumerate(forward) if op.module is Module.EXPERT_FC2)
    activation = tuple(op for op in forward[fc1_last + 1 : fc2_first] if op.module in _ACTIVATIONS)
    shared = [i for i, op in enumerate(forward) if op.module in (Module.SHARED_FC1, Module.SHARED_FC2)]
    shared_ops = forward[shared[0] : shared[-1] + 1] if shared else ()
    rerun: list[Op] = []
    ops = list(forward)
    if cfg.recomputes(RecomputeModule.MOE_ACT):
        # the clamp runs inside the checkpointed bias_act_func: its saved cat goes too
        ops = [_zero(op) if op.module in (Module.EXPERT_FC2, Module.GLU_CLAMP) else op for op in ops]
    if cfg.recomputes(RecomputeModule.SHARED_EXPERTS) and shared:
        ops[shared[0] : shared[-1] + 1] = [_zero(op) for op in shared_ops]
    if cfg.recomputes(RecomputeModule.MOE):
        # the checkpoint keeps its input, the router GEMM's saved block input; its first run
        # is under no_grad, so the router's losses run in the recompute only
        ops = [op if op.module is Module.ROUTER else _zero(op) for op in _without_losses(tuple(ops))]
        rerun += [_zero(op) for op in forward]
    if cfg.recomputes(RecomputeModule.LAYERNORM):
        ops = [_zero(op) if op.module is Module.ROUTER else op for op in ops]
        rerun.insert(0, _zero(pre_mlp_norm))
    if cfg.recomputes(RecomputeModule.SHARED_EXPERTS):
        rerun += [_zero(op) for op in shared_ops]
    if cfg.recomputes(RecomputeModule.MOE_ACT):
        rerun += [_zero(op) for op in activation]
    return tuple(ops), tuple(rerun)
