"""Memory of a MoE MLP block on one rank: activations saved for backward, what each
Megatron-core `--recompute-modules` entry frees, and the expert weights, gradients and
optimizer state sharded over ep·etp and the expert-data-parallel group.

Saved activations (docs/moe.md, "Saved activations") follow the tensors autograd keeps in
Megatron-core's MoE layer on its unfused path (Megatron-LM
@d98e8a64ddf34856e74b24714e3bedb2f5a39553; `--moe-permute-fusion` off, the fused weighted
SwiGLU on as `--bias-swiglu-fusion` is by default), with T the rank's tokens, k the top-k,
E the experts, R the rows it sends, Re the rows its experts compute, e the activation
bytes, p the probs' bytes, 8 an int64 index:

    router, softmax   T·k·(8 + 4)              topk indices; fp32 softmax of the k logits
    router, sigmoid   T·E·4 + T·k·(8 + 4) + T·4 (k > 1; T·E·4 + T·k·8 at k = 1)
    aux loss          T·E·4 + E·8 + 4          fp32 scores over all experts, token counts,
                                               the loss (+ T·4 sigmoid's normaliser)
    capacity mask     T·E                      bool mask the kept probs are multiplied by
    group-limited     T·G·(k/gk)·8 + T·E       per-group top indices, the masked_fill mask
    permute           T·E·8 + R·8              the probs gather's index, a slice of the argsort
                      (fused: T·(2E+1)·4 + 2·Re·4, TE's int32 row-id maps;
                      allgather: Re·8 + (E/ep)·T·etp·ep·(p + 1))
                                               of the [E, T] map (its whole storage stays), and
                                               index_select's row indices (2·R·8 when padded)
    experts, gated    Re·e·(h + 2f/etp + f/etp) + Re·p    fc1 input, fc1 output, fc2 input, probs
    experts, plain    Re·e·(h + 3f/etp) + Re·p  (+ the activation's output, kept by the probs mul)
    shared experts    T·e·(fc1_s + f_s)         fc1 output and fc2 input, tensor-parallel over tp

The block's input (the pre-MLP norm's output, saved by the router GEMM and the shared
experts' fc1) is not counted here: the dense layer's formula already counts the MLP input
(docs/memory.md, "regions"). The dispatcher's collectives save nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcluster.config.moe_choices import RecomputeModule, RouterScore, TokenDispatcher
from simcluster.workload.memory import StaticMemory, static_memory
from simcluster.workload.moe import INDEX_BYTES, RoutedRows, expert_shape, shared_expert_shape
from simcluster.workload.moe_config import ExpertLayout, MoEConfig

FP32_BYTES = 4
MASK_BYTES = 1


@dataclass(frozen=True, slots=True)
class MoESavedBytes:
    """Bytes the block keeps for backward on one rank, per microbatch, by part."""

    router: float
    permute: float
    experts: float
    shared: float

    @property
    def total(self) -> float:
        return self.router + self.permute + self.experts + self.shared


def router_saved_bytes(tokens: float, moe: MoEConfig, aux_loss: bool = False) -> float:
    """router.py `TopKRouter.routing` -> moe_utils.py `topk_routing_with_score_function`
    (no pre-softmax, unfused): softmax keeps the topk indices (int64) and its fp32 output
    [T, k]; sigmoid keeps its fp32 output [T, E], the gather's indices, and the division's
    fp32 numerator [T, k] and denominator [T, 1] (no division at k = 1). The aux loss
    (`compute_routing_scores_for_aux_loss`, `switch_load_balancing_loss_func`,
    `MoEAuxLossAutoScaler`) keeps the fp32 scores [T, E] (softmax; or sigmoid and its [T, 1]
    normaliser), the int64 tokens per expert [E] and the 0-d loss; with a capacity
    factor `apply_router_token_dropping` multiplies the probs by a bool mask [T, E] (padded
    or not), which the product keeps. Group-limited routing (`group_limited_topk`) keeps the
    indices of each group's top k/group_topk scores [T, G, k/group_topk] (int64) and the bool
    mask of the experts outside the chosen groups [T, E] (`masked_fill`), except under
    sigmoid with the expert bias, where the top-k of scores + bias gives only indices and
    `torch.gather` takes the scores (same bytes as the plain sigmoid path)."""
    t, k, E = tokens, moe.router_topk, moe.num_experts
    if moe.router_score is RouterScore.SOFTMAX:
        scores = t * k * (INDEX_BYTES + FP32_BYTES)
    elif k > 1:
        scores = t * E * FP32_BYTES + t * k * (INDEX_BYTES + FP32_BYTES) + t * FP32_BYTES
    else:
        scores = t * E * FP32_BYTES + t * k * INDEX_BYTES
    aux = 0.0
    if aux_loss:  # the scores, the token counts (int64) the loss multiplies, the loss itself
        aux = t * E * FP32_BYTES + E * INDEX_BYTES + FP32_BYTES
        if moe.router_score is RouterScore.SIGMOID:
            aux += t * FP32_BYTES  # the normalising denominator
    mask = t * E * MASK_BYTES if moe.capacity_factor is not None else 0.0
    groups = 0.0
    # with the expert bias, the (group-limited) top-k runs on scores + bias and only its
    # indices are used, so what it saved dies with it
    biased = moe.router_expert_bias and moe.router_score is RouterScore.SIGMOID
    if moe.router_num_groups and moe.router_group_topk and not biased:  # group_limited_topk
        per_group = moe.router_topk // moe.router_group_topk
        groups = t * moe.router_num_groups * per_group * INDEX_BYTES + t * E * MASK_BYTES
    return scores + aux + mask + groups


def moe_saved_bytes(
    rows: RoutedRows,
    hidden_size: int,
    moe: MoEConfig,
    layout: ExpertLayout,
    gated: bool,
    element_bytes: int = 2,
    probs_bytes: int = 2,
    aux_loss: bool = False,
    recompute: tuple[RecomputeModule, ...] = (),
    busiest: bool = True,
    permute_fusion: bool = False,
    dispatcher: TokenDispatcher = TokenDispatcher.ALLTOALL,
) -> MoESavedBytes:
    """The table in the module docstring, then the recompute modules: `moe` keeps only the
    block input (already counted elsewhere), so 0 (moe_layer.py `MoELayer.forward`
    checkpoints the whole block); `moe_act` drops the activation's output, fc2's input,
    re-running the activation from the fc1 output and probs it keeps (experts.py
    `TEGroupedMLP.forward`, `CheckpointWithoutOutput`); `shared_experts` checkpoints the
    shared MLP on its input (moe_layer.py `shared_experts_compute`). `permute_fusion`:
    the permutation's int32 maps instead (`permute_saved_bytes`)."""
    if RecomputeModule.MOE in recompute:
        return MoESavedBytes(0.0, 0.0, 0.0, 0.0)
    e, h, etp = element_bytes, hidden_size, layout.expert_tp
    re = rows.busiest_expert if busiest else rows.expert
    shape = expert_shape(h, moe, gated)
    f = shape.ffn_hidden_size / etp
    fc1, act_out = shape.fc1_width / etp, 0 if gated else f  # plain: the probs mul keeps act(x)
    fc2_in = 0.0 if RecomputeModule.MOE_ACT in recompute else f
    if RecomputeModule.MOE_ACT in recompute:
        act_out = 0
    # gpt-oss's clamped GLU saves the clamps' cat, [re, fc1], for the fused GLU's backward
    # (`workload.gptoss_experts`), inside moe_act's checkpoint
    clamped = fc1 if moe.activation_func_clamp_value is not None and not fc2_in == 0.0 else 0.0
    experts = re * e * (h + fc1 + act_out + fc2_in + clamped) + re * probs_bytes
    shared = 0.0
    if moe.shared_expert_ffn_hidden_size and RecomputeModule.SHARED_EXPERTS not in recompute:
        s_shape = shared_expert_shape(h, moe, gated)
        shared = rows.tokens * e * (s_shape.fc1_width + s_shape.ffn_hidden_size)
    permute = permute_saved_bytes(rows, moe, layout, permute_fusion, busiest, dispatcher, probs_bytes)
    return MoESavedBytes(router_saved_bytes(rows.tokens, moe, aux_loss), permute, experts, shared)


def permute_saved_bytes(
    rows: RoutedRows,
    moe: MoEConfig,
    layout: ExpertLayout,
    fused: bool = False,
    busiest: bool = True,
    dispatcher: TokenDispatcher = TokenDispatcher.ALLTOALL,
    probs_bytes: int = 2,
) -> float:
    """moe_utils.py `permute`, argsort path: `flat_sorted` is the first R entries of the
    argsort of the flattened [E, T] routing map, and `probs.T...[flat_sorted]` keeps that
    index, a view holding the whole E·T int64 storage; `tokens.index_select(0,
    sorted_indices)` keeps `sorted_indices = flat_sorted % T`, R int64 (the unpermute's
    scatter_add keeps a view of the same). Padded to capacity, both indices are new [E, C]
    tensors, R = C·E each.

    `fused` (`--moe-permute-fusion`, dropless or capacity not padded): Transformer Engine's
    mask-map permute keeps one int32 row_id_map [T, 2E + 1], which the unpermute keeps too,
    and each fused chunk sort by local expert (dispatch and combine, when a rank holds more
    than one expert) an int32 map of its Re rows (TE @d0067d0da6cb01811b8072a7d304f0e00344ce2b
    transformer_engine/pytorch/permutation.py, triton/permutation.py `make_row_id_map`,
    `make_chunk_sort_map`). Not checked against a run: it needs CUDA.

    allgather (`MoEAllGatherTokenDispatcher.dispatch_postprocess`, unfused): the permute of
    the gathered T·etp·ep tokens by the local experts' map keeps its Re row indices (no
    probs are gathered through the index), and the probs are taken by `masked_select`,
    which keeps its input (the transposed local probs) and its bool mask, both
    [E/ep, T·etp·ep]."""
    expert_rows = rows.busiest_expert if busiest else rows.expert
    if dispatcher is TokenDispatcher.ALLGATHER and not fused:
        gathered = rows.tokens * layout.expert_tp * layout.ep * (moe.num_experts // layout.ep)
        return expert_rows * INDEX_BYTES + gathered * (probs_bytes + MASK_BYTES)
    if fused:
        # padded to capacity, the chunks move by view and transpose (no sort map)
        several = moe.num_experts // layout.ep > 1 and not moe.pad_to_capacity
        sorts = 2 * expert_rows * 4 if several else 0.0
        return rows.tokens * (2 * moe.num_experts + 1) * 4 + sorts
    if moe.pad_to_capacity:
        return 2.0 * rows.sent * INDEX_BYTES
    return (rows.tokens * moe.num_experts + rows.sent) * INDEX_BYTES


@dataclass(frozen=True, slots=True)
class ExpertStaticMemory:
    """Per-rank bytes of the routed experts (sharded over ep·etp; optimizer state over the
    expert-data-parallel group with the distributed optimizer) and of the block's dense
    parameters (router and shared experts: the router replicated, shared experts over tp;
    optimizer over dp·cp like every dense parameter)."""

    experts: StaticMemory
    dense: StaticMemory
    expert_params_per_rank: float
    dense_params_per_rank: float

    @property
    def total_bytes(self) -> float:
        return self.experts.total_bytes + self.dense.total_bytes


def expert_static_memory(
    hidden_size: int,
    moe: MoEConfig,
    layout: ExpertLayout,
    gated: bool,
    distributed_optimizer: bool,
    expert_bias: bool = False,
    gradient_bytes_per_param: int = 4,
) -> ExpertStaticMemory:
    """Expert parameters per rank: (E/ep)·(h·fc1 + f·h)/etp (fc1 column-, fc2 row-parallel
    over etp; fc1's bias split, fc2's replicated). 18 bytes each, or 6 + 12/edp with the
    distributed optimizer (Megatron-core shards expert optimizer state over the
    expert-data-parallel group, `get_megatron_optimizer` `expt_dp_group`). Dense part:
    router E·h (+E) on every rank, shared experts / tp, optimizer over dp·cp."""
    shape = expert_shape(hidden_size, moe, gated, expert_bias)
    etp, local = layout.expert_tp, moe.num_experts // layout.ep
    per_expert = (shape.hidden_size * shape.fc1_width + shape.ffn_hidden_size * shape.hidden_size) / etp
    if expert_bias:
        per_expert += shape.fc1_width / etp + shape.hidden_size
    expert_params = local * per_expert
    shared = shared_expert_shape(hidden_size, moe, gated).weights if moe.shared_expert_ffn_hidden_size else 0
    router = moe.num_experts * hidden_size + (moe.num_experts if moe.router_bias else 0)
    dense_params = router + shared / layout.tp
    return ExpertStaticMemory(
        experts=static_memory(
            expert_params, layout.expert_dp, distributed_optimizer, gradient_bytes_per_param
        ),
        dense=static_memory(
            dense_params, layout.dp * layout.cp, distributed_optimizer, gradient_bytes_per_param
        ),
        expert_params_per_rank=expert_params,
        dense_params_per_rank=dense_params,
    )


def expert_gradient_reduce_bytes(
    hidden_size: int,
    moe: MoEConfig,
    layout: ExpertLayout,
    gated: bool,
    expert_bias: bool = False,
    gradient_bytes_per_param: int = 4,
) -> float:
    """The buffer each rank reduces over the expert-data-parallel group per step (all-reduce
    buffer, or the reduce-scatter input with the distributed optimizer): its expert
    gradients. Dense parameters reduce over dp·cp as in the dense model."""
    mem = expert_static_memory(hidden_size, moe, layout, gated, False, expert_bias, gradient_bytes_per_param)
    return mem.expert_params_per_rank * gradient_bytes_per_param
