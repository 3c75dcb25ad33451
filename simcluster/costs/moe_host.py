"""Host side of a MoE layer: the kernels Megatron-core issues for each op of the MoE block's
op graph, and where its token dispatcher makes the host wait for the GPU.

Source: Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/core/transformer/moe/
(router.py, moe_utils.py, token_dispatcher.py, experts.py, fused_a2a.py, moe_layer.py), and
TransformerEngine @d0067d0da6cb01811b8072a7d304f0e00344ce2b (pytorch/module/grouped_linear.py,
common/gemm/cublaslt_gemm.cu), at Megatron's defaults where the scenario has no key:
`moe_permute_fusion` and `moe_router_fusion` as the scenario sets them (default False; the
fused counts, `FUSED_*`, are read from Megatron-LM @d7288711 and TE @71bbefbf),
`bias_activation_fusion` False,
`moe_aux_loss_coeff`, `moe_router_load_balancing_type` and `moe_z_loss_coeff` as the scenario
sets them (`model.moe.aux_loss_coeff` default 0: no loss kernels, `TopKRouter.is_aux_loss_enabled`;
the loss's counts, `AUX_*` / `Z_LOSS*`, read from Megatron-LM @d7288711 and TE @71bbefbf),
`moe_router_dtype` None (the router runs in the input's dtype),
no `moe_router_topk_scaling_factor`, deterministic algorithms off.

A count is the number of device launches (CUDA kernels, NCCL collectives, device-to-host
copies) the host makes for one op of `workload.moe_layer`'s graph, read op by op from the
code (`FORWARD` / `BACKWARD` below list them); view ops (`view`, `reshape` of a contiguous
tensor, `split`, slicing) and dtype casts to the dtype a tensor already has launch nothing.
Transformer Engine's `GroupedLinear` with `m_splits` issues one cuBLAS GEMM per local expert
(`nvte_multi_tensor_gemm` -> `multi_stream_cublas_gemm`; the CUTLASS grouped GEMM only with
`NVTE_USE_CUTLASS_GROUPED_GEMM=1`, off by default): an expert GEMM op of `batch` local
experts is `batch` launches. Those launches come from one C++ loop, with less host work each
than an eager PyTorch op. A profile prices them at `compute.expert_gemm_host_us_per_launch` and
the block's other launches at `compute.moe_host_us_per_op` where it has those keys (the H100's:
measured on the torch MoE block, where each expert GEMM is an `F.linear` from Python, so an
upper bound for TE's loop; `weighted_moe_kernels`), at its per-kernel figure otherwise
(docs/moe_host.md, "The torch MoE block measured").

Syncs (`sync_points`): the forward of every dropless dispatcher needs token counts on the
host (all-to-all split sizes, `GroupedLinear`'s `m_splits`):

* alltoall (`MoEAlltoAllTokenDispatcher`): `preprocess` computes the counts on the GPU;
  `_maybe_dtoh_and_synchronize` copies them to the host on a side stream at
  `cuda_dtoh_point` ("before_permutation_1": the side stream waits for the GPU's work up
  to the preprocess) and the host blocks on that copy's event at `cuda_sync_point`
  ("before_ep_alltoall" when ep·tp > 1; "before_permutation_1" with a capacity factor;
  "before_permutation_2" / "before_finish" when ep·tp = 1; with `moe_permute_fusion` the
  chunk sort reads its split sizes on the GPU, so "before_permutation_2" is never chosen and
  ep·tp = 1 syncs "before_finish"), after issuing the permute;
  no sync with `moe_pad_expert_input_to_capacity` (`drop_and_pad`).
* allgather (`MoEAllGatherTokenDispatcher.dispatch_postprocess`): `local_map.sum(...).cpu()`
  after the all-gathers, before the permute.
* flex (DeepEP, `_DeepepManager`): `buffer.dispatch` waits on the host for the received
  counts (`num_recv_tokens_per_expert_list`) before it launches the dispatch kernel, and
  `_indices_to_multihot`'s boolean-mask indexing and `repeat_interleave` wait for the
  dispatch kernel's output: two syncs.
* flex with hybridep (`_HybridEPManager`): without `moe_expert_rank_capacity_factor`
  Megatron passes no `num_permuted_tokens`, so `dispatch_with_permute` runs blocking: after
  the routing-map scan it calls `cudaStreamSynchronize` to read the received counts from
  pinned memory (DeepEP hybrid-ep @94a9f8f6 executor.cu `metadata_preprocess_core`), before
  it launches the dispatch kernel: one sync. Its permute runs on the GPU.

The backward has none: the all-to-alls reuse the forward's split sizes, DeepEP its cached
handle. A recompute re-runs the forward, syncs included.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcluster.config.moe_choices import FlexBackend, LoadBalancingType, RouterScore, TokenDispatcher
from simcluster.workload.moe_layer import MoELayerSpec
from simcluster.workload.ops import CollectiveKind, CommGroup, Module, Op, OpKind, Pass

# --- router (router.py `TopKRouter.forward`, moe_utils.py) ---------------------------------
ROUTER_GEMM = 1  # `RouterGatingLinearFunction.forward`: one te_general_gemm (bias fused)
ROUTER_DGRAD = 1  # backward: te_general_gemm for grad_input
ROUTER_WGRAD = 2  # te_general_gemm for grad_weight, and DDP's main_grad.add_ (a plain Parameter)
ROUTER_BIAS_GRAD = 1  # grad_output.sum(dim=0) when the router has a bias
ROUTING_MAP = 6  # zeros_like + scatter (routing_probs); zeros_like, .int(), scatter, .bool() (map)
SOFTMAX_TOPK = 3 + ROUTING_MAP  # topk of the logits, softmax(float32), type_as
SIGMOID_TOPK = 7 + ROUTING_MAP  # .float(), sigmoid, topk, sum, + 1e-20, divide, type_as
EXPERT_BIAS_TOPK = 2  # sigmoid with expert bias: scores + bias, gather of the chosen scores
EXPERT_BIAS_UPDATE = 2  # `_apply_expert_bias`: routing_map.sum(0), local_tokens_per_expert +=
GROUP_TOPK = 6  # `group_limited_topk`: topk, sum, topk, zeros_like, scatter_, masked_fill
SOFTMAX_TOPK_BACKWARD = 5  # scatter's (gather), type_as's, softmax's, topk's (zeros + scatter)
SIGMOID_TOPK_BACKWARD = 9  # gather; type_as; divide (2 + sum's expand-add 1); topk (2); sigmoid; float

# --- fused router (`--moe-router-fusion`): moe_utils.py @d7288711ba278d160d2a5a22c099915c9fe1395c
# `topk_routing_with_score_function(fused=True)` -> TE @71bbefbf153418f943640df0f7373625dc93fa46
# pytorch/router.py `FusedTopkScoreFunction` (outputs `at::empty`: no fill kernels); the score
# function, group-limited top-k and expert bias run inside; `_apply_expert_bias` stays unfused
FUSED_TOPK = 1  # `fused_topk_with_score_function_fwd`: probs, routing map, fp32 scores
FUSED_TOPK_BACKWARD = 1  # `fused_topk_with_score_function_bwd` (grad_probs already contiguous)

# --- the router's losses (`workload.moe_aux_loss`): router.py `TopKRouter.routing` and
# moe_utils.py @d7288711ba278d160d2a5a22c099915c9fe1395c; torch ops one launch each, as above
AUX_SCORES_SOFTMAX = 1 + 1 + 4  # softmax(float32), topk, routing map (zeros_like, .int(), scatter, .bool())
AUX_SCORES_SIGMOID = 5 + 1 + 4  # .to(float32), sigmoid, sum, + 1e-20, divide; topk; routing map
AUX_SCORES_FUSED = 1  # TE `fused_score_for_moe_aux_loss_fwd` (outputs `at::empty`)
AUX_COUNTS = 1  # `get_tokens_per_expert_and_token_count`: routing_map.sum(0) (its all-reduce: COLLECTIVE)
AUX_SWITCH_LOSS = 4  # `switch_load_balancing_loss_func`: probs.sum(0), × counts, sum, × constant
AUX_SWITCH_LOSS_FUSED = 1  # TE `fused_moe_aux_loss_fwd` (one cluster launch)
AUX_SEQ = 1  # seq_aux_loss: the loss / bsz (backward: its gradient, 1)
AUX_GLOBAL = 3  # global_aux_loss: global_tokens_per_expert +=, ga_steps += 1, the average's divide
AUX_TRACKER = 2  # `save_to_aux_losses_tracker`: loss / coeff, values[layer] +=
AUX_SCALER_BACKWARD = 2  # `MoEAuxLossAutoScaler.backward`: ones_like, × main_loss_backward_scale
AUX_LOSS_BACKWARD = 2  # × constant's gradient, × counts' gradient (sum's and sum(0)'s are expands)
AUX_SOFTMAX_BACKWARD = 3  # the expanded gradient made contiguous, softmax's backward, the add into
#                           the logits' gradient
AUX_SIGMOID_BACKWARD = 6  # divide (2 + sum's expand-add 1), sigmoid, the cast, the add into the
#                           logits' gradient
AUX_FUSED_BACKWARD = 3  # `fused_moe_aux_loss_bwd`, `fused_score_for_moe_aux_loss_bwd`, the add
#                         into the logits' gradient
Z_LOSS = 9 + 3 + AUX_TRACKER  # logsumexp (amax, abs, == inf, masked_fill_, sub, exp_, sum, log_,
#                               add_), square, mean, × coeff; the tracker
Z_LOSS_BACKWARD = AUX_SCALER_BACKWARD + 8  # × coeff's, mean's (expand / n), square's (2x · g: 2),
#                                            logsumexp's (self − result, exp, × g), the add into the
#                                            logits' gradient

# --- alltoall dispatcher (token_dispatcher.py `MoEAlltoAllTokenDispatcher`) ---------------
A2A_PREPROCESS = 8  # routing_map.sum, .long(), input_splits sum, the all-gather, local slice
#                     .contiguous(), per-rank sum, output_splits_tp sum, per-local-expert sum
A2A_PREPROCESS_LOCAL = 2  # ep·tp = 1: routing_map.sum, .long()
DTOH_COPIES = 4  # tokens_per_expert, input_splits, output_splits, output_splits_tp
DTOH_PER_EXPERT_COPY = 1  # num_global_tokens_per_local_expert (several local experts, unfused)
PERMUTE = 6  # `permute`: map.T.contiguous, argsort, % num_tokens, probs.T.contiguous, probs
#              index, tokens index_select
PERMUTE_BACKWARD = 5  # index_select's (zeros + index_add_), probs index's (zeros +
#                       index_put_), probs.T.contiguous's copy
SORT_CHUNKS_DISPATCH = 2  # `sort_chunks_by_idxs`: torch.cat of the tokens' and the probs' chunks
SORT_CHUNKS_COMBINE = 1  # the tokens' only
UNPERMUTE = 2  # `unpermute` without probs: torch.zeros, scatter_add_
UNPERMUTE_BACKWARD = 1  # scatter_add_'s: a gather
COLLECTIVE = 1  # an all-to-all / all-gather / reduce-scatter: one NCCL launch
INPUT_GRAD_ADD = 1  # autograd's add of the block input's gradients (moe_layer.py:558-561 @d7288711)

# --- fused permutation (`--moe-permute-fusion`, alltoall): moe_utils.py `permute` /
# `unpermute` / `sort_chunks_by_idxs(fused=True)` -> TE pytorch/permutation.py, Triton kernels
# in common/triton/permutation.py (outputs `torch.empty`); the split sizes and chunk indices
# stay on the GPU (`permute_idx_device` cuda), so the per-local-expert count copy goes
FUSED_PERMUTE = 3 + 1  # make_row_id_map's three passes, _permute_kernel (tokens and probs)
FUSED_PERMUTE_BACKWARD = 1  # _unpermute_kernel with the probs' gradient
FUSED_UNPERMUTE = 1  # _unpermute_kernel (no merging probs)
FUSED_UNPERMUTE_BACKWARD = 1  # _permute_kernel
FUSED_SORT_CHUNKS = 2  # make_chunk_sort_map, sort_chunks_by_map (probs in the same kernel)
FUSED_SORT_CHUNKS_BACKWARD = 1  # sort_chunks_by_map with the saved map
FP8_PADDING = 1  # TE Fp8Padding / Fp8Unpadding: one fused_multi_row_(un)padding kernel a call,
#                  each way (`workload.moe_fp8_padding`)

# --- experts (experts.py `TEGroupedMLP.forward`, unfused weighted GLU) --------------------
WEIGHTED_GLU = 4  # `bias_act_func` gated: silu, x_linear + glu_linear_offset, product, × probs
WEIGHTED_GLU_BACKWARD = 7  # × probs (2 + probs' sum 1), product (2), silu (1), chunk's cat (1)
QUANTIZED_INPUT_CAST = 1  # FP8 / FP4: GroupedLinear's split-quantize of its input (fprop, dgrad)

# --- allgather dispatcher ---------------------------------------------------------------
AG_POSTPROCESS = 5  # local_map / local_probs slice .contiguous() (2), sum, .long(), .cpu() copy
AG_PERMUTE = 4  # `permute` without probs: map.T.contiguous, argsort, %, index_select
AG_PROBS_SELECT = 3  # local_probs.T.contiguous, local_map.T.contiguous, masked_select
AG_PERMUTE_BACKWARD = 2 + 3  # index_select's (2); masked_select's (zeros + masked_scatter),
#                              the probs slice's copy back

# --- flex dispatcher (DeepEP, `_DeepepManager`, fused_a2a.py) ---------------------------
FLEX_METADATA = 2  # `setup_metadata`: torch.topk(probs), probs .float() for DeepEP
FLEX_DISPATCH = 3  # get_dispatch_layout, notify (host waits for the counts), dispatch
FLEX_MULTIHOT = 11  # `_indices_to_multihot`: 2 zeros, != -1, indices[mask] (nonzero), arange,
#                     mask.sum, repeat_interleave, 2 index_put_, probs[mask], .bool()
FLEX_COMBINE = 1
FLEX_DISPATCH_BACKWARD = 2  # combine's backward is a cached dispatch: notify + dispatch
FLEX_COMBINE_BACKWARD = 1 + 1  # dispatch's backward is a combine, after probs .float()
FLEX_MULTIHOT_BACKWARD = 2  # probs index_put_'s (gather) and probs[mask]'s (zeros + put: 1)
FLEX_METADATA_BACKWARD = 3  # topk's (zeros + scatter), .float()'s cast

# --- flex dispatcher, hybridep backend (`_HybridEPManager`, fused_a2a.py; DeepEP hybrid-ep
# @94a9f8f6b146c07d97ec58f67cd6d303296d6098 executor.cu): `setup_metadata` only reshapes
# (no top-k: Hybrid-EP takes the routing map), so the router adds nothing
HYBRIDEP_MAP_GATHER = 1 + 1  # probs .float() (`dispatch`), the routing map's all_gather_into_tensor
HYBRIDEP_DISPATCH = 2 + 1  # metadata scan, pad_tokens_per_expert (host waits), dispatch kernel
HYBRIDEP_PERMUTE = 1  # Hybrid-EP's permute kernel (unpermute the same, each way)
HYBRIDEP_COMBINE = 1
HYBRIDEP_COMBINE_BACKWARD = 1  # a dispatch with the cached handle: no scan, no wait
HYBRIDEP_DISPATCH_BACKWARD = 1 + 1  # a combine, after the probs' .float() backward cast


@dataclass(frozen=True, slots=True)
class SyncPoint:
    """A point in a pass's ops where the host blocks on the GPU: it has issued the kernels of
    `ops[:host_index]` and waits until the GPU has finished `ops[:gpu_index]` (the device-to-host
    copy was recorded there, `gpu_index` ≤ `host_index`). After it the host has no lead."""

    gpu_index: int
    host_index: int


def _expert_gemm(op: Op, quantized: bool) -> int:
    assert op.gemm is not None
    cast = QUANTIZED_INPUT_CAST if quantized and op.pass_ is not Pass.WEIGHT_GRAD else 0
    return op.gemm.batch + cast


def _router_topk(spec: MoELayerSpec, backward: bool) -> int:
    moe = spec.moe
    if spec.router_fusion:
        count = FUSED_TOPK_BACKWARD if backward else FUSED_TOPK
        if moe.router_expert_bias and moe.router_score is RouterScore.SIGMOID and not backward:
            count += EXPERT_BIAS_UPDATE
    elif moe.router_score is RouterScore.SIGMOID:
        count = SIGMOID_TOPK_BACKWARD if backward else SIGMOID_TOPK
        if moe.router_expert_bias and not backward:
            count += EXPERT_BIAS_TOPK + EXPERT_BIAS_UPDATE
    else:
        count = SOFTMAX_TOPK_BACKWARD if backward else SOFTMAX_TOPK
    if moe.router_group_topk and not backward and not spec.router_fusion:
        count += GROUP_TOPK - 1  # replaces the plain topk
    if spec.dispatcher is TokenDispatcher.FLEX and not _hybridep(spec):
        count += FLEX_METADATA_BACKWARD if backward else FLEX_METADATA
    return count


def _hybridep(spec: MoELayerSpec) -> bool:
    return spec.dispatcher is TokenDispatcher.FLEX and spec.flex_backend is FlexBackend.HYBRIDEP


def _has_counts_gather(spec: MoELayerSpec) -> bool:
    """Whether the alltoall dispatcher all-gathers the counts (ep·etp > 1: `preprocess`)."""
    return spec.layout.ep * spec.layout.expert_tp > 1


def _local_experts(spec: MoELayerSpec) -> int:
    return spec.moe.num_experts // spec.layout.ep


def _permute(spec: MoELayerSpec, backward: bool) -> int:
    """The permute op's launches, with the dispatcher's bookkeeping issued beside it."""
    if spec.dispatcher is TokenDispatcher.ALLGATHER:
        return AG_PERMUTE_BACKWARD if backward else AG_POSTPROCESS + AG_PERMUTE + AG_PROBS_SELECT
    if _hybridep(spec):
        return HYBRIDEP_PERMUTE
    if spec.dispatcher is TokenDispatcher.FLEX:
        return (FLEX_MULTIHOT_BACKWARD + PERMUTE_BACKWARD) if backward else FLEX_MULTIHOT + PERMUTE
    fused = spec.permute_fusion
    if backward:
        return FUSED_PERMUTE_BACKWARD if fused else PERMUTE_BACKWARD
    count = FUSED_PERMUTE if fused else PERMUTE
    if not spec.moe.pad_to_capacity:
        per_expert = _local_experts(spec) > 1 and not fused
        count += DTOH_COPIES + (DTOH_PER_EXPERT_COPY if per_expert else 0)
    if not _has_counts_gather(spec):
        count += A2A_PREPROCESS_LOCAL
    return count


def _unpermute(spec: MoELayerSpec, backward: bool) -> int:
    if _hybridep(spec):
        return HYBRIDEP_PERMUTE
    if spec.permute_fusion:
        return FUSED_UNPERMUTE_BACKWARD if backward else FUSED_UNPERMUTE
    return UNPERMUTE_BACKWARD if backward else UNPERMUTE


def _sort_chunks(spec: MoELayerSpec, dispatch_side: bool, backward: bool) -> int:
    """A chunk sort by local expert; the probs travel on the dispatch side. Padded to
    capacity the chunks move by view and transpose, fused or not (`dispatch_postprocess`)."""
    if spec.permute_fusion and not spec.moe.pad_to_capacity:
        return FUSED_SORT_CHUNKS_BACKWARD if backward else FUSED_SORT_CHUNKS
    return SORT_CHUNKS_DISPATCH if dispatch_side else SORT_CHUNKS_COMBINE


def _collective(op: Op, spec: MoELayerSpec, backward: bool) -> int:
    if _hybridep(spec) and (op.deepep is not None or op.collective is CollectiveKind.ALL_GATHER):
        return _hybridep_collective(op, backward)
    if op.deepep is not None:
        dispatch = op.module is Module.MOE_PERMUTE
        if backward:
            return FLEX_COMBINE_BACKWARD if dispatch else FLEX_DISPATCH_BACKWARD
        return FLEX_DISPATCH if dispatch else FLEX_COMBINE
    counts_gather = (
        spec.dispatcher is TokenDispatcher.ALLTOALL
        and op.collective is CollectiveKind.ALL_GATHER
        and op.group is CommGroup.ETP_EP
        and not backward
    )
    return A2A_PREPROCESS if counts_gather else COLLECTIVE


def _hybridep_collective(op: Op, backward: bool) -> int:
    if op.deepep is None:  # the routing map's all-gather (forward only)
        return HYBRIDEP_MAP_GATHER
    dispatch = op.module is Module.MOE_PERMUTE
    if backward:
        return HYBRIDEP_DISPATCH_BACKWARD if dispatch else HYBRIDEP_COMBINE_BACKWARD
    return HYBRIDEP_DISPATCH if dispatch else HYBRIDEP_COMBINE


def _aux_loss(op: Op, spec: MoELayerSpec, scores: bool) -> int:
    """The load-balancing loss's launches: its scores, map and count (`scores`: the first of
    its forward ops, before the all-reduce); the loss and its logging after; the whole
    backward in one op (`workload.moe_aux_loss`)."""
    moe, fused = spec.moe, spec.router_fusion
    seq = moe.load_balancing_type is LoadBalancingType.SEQ_AUX_LOSS
    if op.kind is OpKind.COLLECTIVE:
        return COLLECTIVE
    if op.pass_ is not Pass.FORWARD:
        if fused:
            score = AUX_FUSED_BACKWARD
        else:
            sigmoid = moe.router_score is RouterScore.SIGMOID
            score = AUX_LOSS_BACKWARD + (AUX_SIGMOID_BACKWARD if sigmoid else AUX_SOFTMAX_BACKWARD)
        return AUX_SCALER_BACKWARD + score + (AUX_SEQ if seq else 0)
    if scores:
        if fused:
            return AUX_SCORES_FUSED + AUX_COUNTS
        sigmoid = moe.router_score is RouterScore.SIGMOID
        return (AUX_SCORES_SIGMOID if sigmoid else AUX_SCORES_SOFTMAX) + AUX_COUNTS
    count = (AUX_SWITCH_LOSS_FUSED if fused else AUX_SWITCH_LOSS) + AUX_TRACKER + (AUX_SEQ if seq else 0)
    if moe.load_balancing_type is LoadBalancingType.GLOBAL_AUX_LOSS:
        count += AUX_GLOBAL
    return count


_BEFORE_EXPERT_GLU = (Module.EXPERT_FC1, Module.EXPERT_FC2, Module.GLU_CLAMP)  # gpt-oss's clamp sits between


def moe_op_kernels(ops: tuple[Op, ...], spec: MoELayerSpec, quantized: bool) -> tuple[int | None, ...]:
    """Launches per op of one pass of a MoE layer (module docstring), in order; None for an
    op outside the MoE block (the attention's, the shared experts', quantization's), which
    `costs.host.kernels_issued` counts as for a dense layer. The routed experts' GLU is the
    SWIGLU op right after an expert fc1 (forward) or fc2 (backward); a chunk sort carries
    the probs on the dispatch side (before the experts in the forward, after in the backward)."""
    counts: list[int | None] = []
    experts_seen = False
    for index, op in enumerate(ops):
        backward = op.pass_ is not Pass.FORWARD
        previous = ops[index - 1].module if index else None
        count: int | None = None
        if op.module is Module.ROUTER:
            count = {Pass.FORWARD: ROUTER_GEMM, Pass.INPUT_GRAD: ROUTER_DGRAD}.get(op.pass_, ROUTER_WGRAD)
            if spec.moe.router_bias and op.pass_ is Pass.WEIGHT_GRAD:
                count += ROUTER_BIAS_GRAD
        elif op.module is Module.ROUTER_TOPK:
            count = _router_topk(spec, backward)
        elif op.module is Module.ROUTER_AUX_LOSS:
            count = _aux_loss(op, spec, scores=previous is Module.ROUTER_TOPK)
        elif op.module is Module.ROUTER_Z_LOSS:
            count = Z_LOSS_BACKWARD if backward else Z_LOSS
        elif op.module in (Module.EXPERT_FC1, Module.EXPERT_FC2):
            experts_seen = True
            count = _expert_gemm(op, quantized) if op.kind is OpKind.GEMM else None
        elif op.module is Module.SWIGLU and previous in _BEFORE_EXPERT_GLU:
            count = WEIGHTED_GLU_BACKWARD if backward else WEIGHTED_GLU
        elif op.module is Module.EXPERT_FP8_PADDING:
            count = FP8_PADDING
        elif op.module is Module.MOE_SORT_CHUNKS:
            count = _sort_chunks(spec, dispatch_side=experts_seen == backward, backward=backward)
        elif op.module in (Module.MOE_PERMUTE, Module.MOE_UNPERMUTE) and op.kind is OpKind.COLLECTIVE:
            count = _collective(op, spec, backward)
        elif op.module is Module.MOE_PERMUTE:
            count = _permute(spec, backward)
        elif op.module is Module.MOE_UNPERMUTE:
            count = _unpermute(spec, backward)
        elif op.module is Module.MOE_INPUT_GRAD_ADD:
            count = INPUT_GRAD_ADD
        counts.append(count)
    return tuple(counts)


def is_expert_gemm(op: Op) -> bool:
    """A routed expert GEMM (fc1 / fc2, any pass): `batch` launches, one per local expert."""
    return op.kind is OpKind.GEMM and op.module in (Module.EXPERT_FC1, Module.EXPERT_FC2)


def weighted_moe_kernels(
    ops: tuple[Op, ...], counts: tuple[int, ...], spec: MoELayerSpec, quantized: bool,
    weights: tuple[float, float],
) -> tuple[float, ...]:  # fmt: skip
    """`counts` (launches per op) in units of the profile's per-kernel host cost: a MoE-block
    launch × weights[0], an expert GEMM's per-expert launches × weights[1] (its input's cast,
    one call of `GroupedLinear`, as a MoE-block launch), the rest × 1. The weights are the
    profile's `moe_host_us_per_op` and `expert_gemm_host_us_per_launch` over its
    `host_issue_us_per_op` (docs/moe_host.md, "The torch MoE block measured")."""
    other, expert = weights
    out: list[float] = []
    for op, n, moe_n in zip(ops, counts, moe_op_kernels(ops, spec, quantized)):
        if moe_n is None:
            out.append(n)
        elif is_expert_gemm(op):
            assert op.gemm is not None
            launches = op.gemm.batch
            out.append(launches * expert + (n - launches) * other)
        else:
            out.append(n * other)
    return tuple(out)


def _first(ops: tuple[Op, ...], start: int, match: object) -> int | None:
    return next((i for i in range(start, len(ops)) if match(ops[i])), None)  # type: ignore[operator]


def sync_points(
    ops: tuple[Op, ...], spec: MoELayerSpec, dtoh_at_dispatch: bool = False
) -> tuple[SyncPoint, ...]:
    """Where the host waits for the GPU in `ops` (a forward, or a recompute that re-runs the
    MoE block's forward; module docstring). None in a backward. `dtoh_at_dispatch`: the
    alltoall dispatcher copies the counts at "before_ep_alltoall" (a per-layer CUDA graph
    that captures the preprocess, or whole layers)."""
    permute = _first(
        ops, 0, lambda op: op.module is Module.MOE_PERMUTE and op.kind is OpKind.ELEMENTWISE
        and op.pass_ is Pass.FORWARD
    )  # fmt: skip
    if permute is None:
        return ()
    if spec.dispatcher is TokenDispatcher.ALLGATHER:
        return (SyncPoint(permute, permute),)
    if spec.dispatcher is TokenDispatcher.FLEX:
        dispatch = _first(ops, 0, lambda op: op.deepep is not None and op.pass_ is Pass.FORWARD)
        assert dispatch is not None and dispatch < permute
        if _hybridep(spec):  # `cudaStreamSynchronize` after the scan, before the dispatch kernel
            return (SyncPoint(dispatch, dispatch),)
        return SyncPoint(dispatch, dispatch), SyncPoint(dispatch + 1, permute)
    if spec.moe.pad_to_capacity:
        return ()
    if spec.moe.capacity_factor is not None:  # "before_permutation_1"
        return (SyncPoint(permute, permute),)
    after = permute + 1
    if _has_counts_gather(spec):  # "before_ep_alltoall"
        host = _first(ops, after, lambda op: op.collective is CollectiveKind.ALL_TO_ALL)
        if dtoh_at_dispatch and host is not None:
            return (SyncPoint(host, host),)
    elif _local_experts(spec) > 1 and not spec.permute_fusion:  # "before_permutation_2"
        host = _first(ops, after, lambda op: op.module is Module.MOE_SORT_CHUNKS)
    else:  # "before_finish"
        host = _first(ops, after, lambda op: op.module is Module.EXPERT_FC1)
    return (SyncPoint(permute, after if host is None else host),)
