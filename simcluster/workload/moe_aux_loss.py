"""The router's load-balancing loss and z-loss (`model.moe.aux_loss_coeff`,
`load_balancing_type`, `z_loss_coeff`): the ops they add to a MoE layer, their HBM bytes,
saved bytes and the all-reduce of the token counts.

Source: Megatron-LM @d7288711ba278d160d2a5a22c099915c9fe1395c,
megatron/core/transformer/moe/router.py `TopKRouter.routing` and moe_utils.py, with
Transformer Engine @71bbefbf153418f943640df0f7373625dc93fa46 pytorch/router.py and
pytorch/csrc/extensions/router.cpp under `--moe-router-fusion`. Per microbatch and MoE layer,
in training with gradients on (`self.training and torch.is_grad_enabled()`: a checkpointed
forward under no_grad skips both losses, its recompute runs them):

    z-loss      `apply_z_loss` (before the top-k): `z_loss_func` = mean(logsumexp(logits)²)·c,
                attached to the logits by `MoEAuxLossAutoScaler`; unfused either way.
    scores      `compute_routing_scores_for_aux_loss`: fp32 scores of every expert (softmax,
                or sigmoid normalised per token) and their own top-k routing map (bool [T, E]);
                fused: TE's `fused_score_for_moe_aux_loss_fwd`, one kernel.
    counts      `get_tokens_per_expert_and_token_count`: routing_map.sum(0) (int64 [E]),
                all-reduced by `reduce_from_tensor_model_parallel_region` over the tp·cp group
                (aux_loss, seq_aux_loss: [b·E] per sequence) or tp·cp·dp (global_aux_loss);
                no collective on a group of one rank (`_reduce`). NCCL on the compute stream,
                before the loss that reads the counts: on the critical path of every MoE
                layer's forward, every microbatch.
    loss        `switch_load_balancing_loss_func` (probs.sum(0), × counts, sum, × constant;
                fused: TE's `fused_moe_aux_loss_fwd`), `save_to_aux_losses_tracker`, and
                `MoEAuxLossAutoScaler` on the probs.

Backward: the autoscaler's ones × scale, the loss's gradient spread over [T, E], the score
function's backward, and its add into the logits' gradient (the logits feed the top-k too).
The counts carry no gradient: no collective in the backward.

Bytes count every [T, E] pass of those kernels (T tokens of the rank, E experts, e the
logits' bytes, fp32 scores); the [E]-sized tails are counted as written, though tiny.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcluster.config.moe_choices import LoadBalancingType, RouterScore
from simcluster.config.moe_config import ExpertLayout, MoEConfig
from simcluster.workload.moe_memory import router_saved_bytes
from simcluster.workload.ops import CollectiveKind, CommGroup, Module, Op, Pass, collective, elementwise

FP32 = 4
INT64 = 8
BOOL = 1


@dataclass(frozen=True, slots=True)
class AuxLossBytes:
    """HBM bytes of the loss's two forward ops and its backward, and what it keeps for
    backward."""

    scores: float  # the scores, their top-k map and the map's count (forward, before the all-reduce)
    loss: float  # the loss from the scores and the counts (forward, after it)
    backward: float
    saved: float


def _tail(num_experts: int) -> float:
    """The [E] tensors of the loss: probs.sum(0) written, × counts (fp32 and int64 in, fp32
    out), sum read, and the tracker's add."""
    return num_experts * (FP32 + (FP32 + INT64 + FP32) + FP32) + 4 * FP32


def unfused_aux_loss_bytes(tokens: float, moe: MoEConfig, element_bytes: int) -> AuxLossBytes:
    """moe_utils.py unfused: softmax(float32) reads e and writes 4 per cell; sigmoid casts to
    fp32 (e in, 4 out), sigmoid (4, 4), row sum (4), divide (4 in, 4 out); topk reads the
    scores and writes [T, k] fp32 + int64; the map is zeros_like (e), .int() (e in, 4 out),
    scatter ([T, k]), .bool() (4 in, 1 out); the count reads the map (1). The loss reads the
    scores once (probs.sum(0)). Backward: the [E] gradient expanded to [T, E] and made
    contiguous (4), softmax's backward (4 + 4 in, e out) or sigmoid's (divide's two
    gradients and the sum's expand-add, 5 passes of 4; sigmoid 3 × 4; the cast 4 + e), and
    the add into the logits' gradient (3e). Saved: `moe_memory.router_saved_bytes`'s
    aux-loss share (the fp32 scores, the counts, the loss)."""
    t, E, k, e = tokens, moe.num_experts, moe.router_topk, element_bytes
    cells = t * E
    if moe.router_score is RouterScore.SIGMOID:
        score = cells * (e + FP32 + 2 * FP32 + FP32 + 2 * FP32) + t * 3 * FP32
        score_backward = cells * (5 * FP32 + 3 * FP32 + FP32 + e)
    else:
        score = cells * (e + FP32)
        score_backward = cells * (FP32 + 2 * FP32 + e)
    topk = cells * FP32 + t * k * (FP32 + INT64)
    routing_map = cells * (e + e + FP32 + FP32 + BOOL) + t * k * (FP32 + INT64)
    count = cells * BOOL + E * INT64
    saved = router_saved_bytes(t, moe, aux_loss=True) - router_saved_bytes(t, moe)
    return AuxLossBytes(
        scores=score + topk + routing_map + count,
        loss=cells * FP32 + _tail(E),
        backward=score_backward + 3 * cells * e + _tail(E),
        saved=saved,
    )


def fused_aux_loss_bytes(tokens: float, moe: MoEConfig, element_bytes: int) -> AuxLossBytes:
    """`--moe-router-fusion` (TE router.cpp): `fused_score_for_moe_aux_loss_fwd` reads the
    logits (e) and writes the fp32 scores, the bool map and the fp32 intermediate it saves
    (4 + 1 + 4); the count reads the map (1); `fused_moe_aux_loss_fwd` reads the scores (4)
    and the counts. Backward: `fused_moe_aux_loss_bwd` writes the scores' gradient (4),
    `fused_score_for_moe_aux_loss_bwd` reads it and the intermediate (4 + 4) and writes the
    logits' gradient (e), added into the top-k's (3e). Saved: the intermediate [T, E] fp32,
    `FusedAuxLoss`'s Const_buf and counts, the autoscaler's loss."""
    t, E, e = tokens, moe.num_experts, element_bytes
    cells = t * E
    return AuxLossBytes(
        scores=cells * (e + FP32 + BOOL + FP32) + cells * BOOL + E * INT64,
        loss=cells * FP32 + E * INT64 + 2 * FP32,
        backward=cells * (FP32 + 2 * FP32 + e) + 3 * cells * e,
        saved=cells * FP32 + FP32 + E * INT64 + FP32,
    )


def z_loss_bytes(tokens: float, num_experts: int, element_bytes: int) -> tuple[float, float, float]:
    """(forward, backward, saved) of `z_loss_func` on the e-byte logits: torch's logsumexp
    is amax (read), self − max (read, write), exp_ (read, write), sum (read): 6 passes of e
    per cell; square, mean and × c act on [T]. Backward: logsumexp's (self − result) (2),
    exp (2), × the [T] gradient (2), the add into the logits' gradient (3): 9 passes. Saved:
    logsumexp keeps its input (the logits, kept by nothing else) and result, square its
    input ([T] each), the autoscaler the loss."""
    cells, e = tokens * num_experts, element_bytes
    rows = tokens * e
    return 6 * cells * e + 4 * rows, 9 * cells * e + 4 * rows, cells * e + 2 * rows + FP32


def counts_group(moe: MoEConfig, layout: ExpertLayout) -> tuple[CommGroup, int]:
    """The group the token counts are all-reduced over and its size (router.py: `tp_cp_group`
    for aux_loss / seq_aux_loss, `tp_dp_cp_group` for global_aux_loss)."""
    if moe.load_balancing_type is LoadBalancingType.GLOBAL_AUX_LOSS:
        return CommGroup.TP_DP_CP, layout.tp * layout.cp * layout.dp
    return CommGroup.TP_CP, layout.tp * layout.cp


@dataclass(frozen=True, slots=True)
class LossOps:
    """The losses' ops: the z-loss's forward (before the top-k), the load-balancing loss's
    forward (after it), and their backward (the aux loss's before the top-k's backward,
    the z-loss's after)."""

    z_forward: tuple[Op, ...] = ()
    aux_forward: tuple[Op, ...] = ()
    aux_backward: tuple[Op, ...] = ()
    z_backward: tuple[Op, ...] = ()


def loss_ops(
    tokens: float,
    micro_batch_size: int,
    moe: MoEConfig,
    layout: ExpertLayout,
    element_bytes: int,
    fused: bool,
) -> LossOps:
    """The ops of the router's losses on one rank (module docstring); empty at Megatron's
    defaults (coefficient 0, no z-loss)."""
    F, B, e = Pass.FORWARD, Pass.INPUT_GRAD, element_bytes
    z_forward: tuple[Op, ...] = ()
    z_backward: tuple[Op, ...] = ()
    if moe.z_loss_coeff is not None:  # router.py: `is not None`, so 0.0 still runs the kernels
        forward, backward, saved = z_loss_bytes(tokens, moe.num_experts, e)
        z_forward = (elementwise("moe.z_loss", forward, saved, module=Module.ROUTER_Z_LOSS, pass_=F),)
        z_backward = (elementwise("moe.z_loss.bwd", backward, module=Module.ROUTER_Z_LOSS, pass_=B),)
    if not moe.aux_loss_enabled:
        return LossOps(z_forward, (), (), z_backward)
    moved = (fused_aux_loss_bytes if fused else unfused_aux_loss_bytes)(tokens, moe, e)
    group, size = counts_group(moe, layout)
    counts = INT64 * moe.num_experts
    if moe.load_balancing_type is LoadBalancingType.SEQ_AUX_LOSS:
        counts *= micro_batch_size  # routing_map reshaped to [s, b·E]: a count per sequence
    A = Module.ROUTER_AUX_LOSS
    reduce: tuple[Op, ...] = ()
    if size > 1:
        reduce = (
            collective(
                "moe.aux_loss.tokens_per_expert",
                CollectiveKind.ALL_REDUCE,
                counts,
                module=A,
                pass_=F,
                group=group,
            ),
        )
    aux_forward = (
        elementwise("moe.router_scores.aux_loss", moved.scores, moved.saved, module=A, pass_=F),
        *reduce,
        elementwise("moe.aux_loss", moved.loss, module=A, pass_=F),
    )
    aux_backward = (elementwise("moe.aux_loss.bwd", moved.backward, module=A, pass_=B),)
    return LossOps(z_forward, aux_forward, aux_backward, z_backward)


LOSS_MODULES = frozenset({Module.ROUTER_AUX_LOSS, Module.ROUTER_Z_LOSS})
"""The losses' modules: a forward under no_grad (a checkpointed MoE block's or layer's first
run) skips them."""
