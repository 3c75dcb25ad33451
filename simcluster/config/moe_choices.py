"""The closed sets of choices of a mixture-of-experts model (Megatron-core's MoE flags).

Kept beside `choices.py` so a scenario model can name them without importing the workload.
Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553.
"""

from __future__ import annotations

import enum


class RouterScore(str, enum.Enum):
    """`--moe-router-score-function`: the router's score of a token for an expert
    (megatron/core/transformer/moe/moe_utils.py::topk_routing_with_score_function).
    softmax (Megatron's default: top-k of the logits, then a softmax over the k chosen)
    or sigmoid (DeepSeek-V3: a sigmoid of every logit, top-k, then the k scores
    normalised to sum 1)."""

    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


class TokenDispatcher(str, enum.Enum):
    """`--moe-token-dispatcher-type` (megatron/core/transformer/moe/token_dispatcher.py):
    alltoall (`MoEAlltoAllTokenDispatcher`: tokens sent to the ranks of their experts over
    the expert-parallel group), allgather (`MoEAllGatherTokenDispatcher`: every token
    gathered over the expert-tensor x expert-parallel group, results reduce-scattered
    back) or flex (`MoEFlexTokenDispatcher`, DeepEP / HybridEP kernels)."""

    ALLTOALL = "alltoall"
    ALLGATHER = "allgather"
    FLEX = "flex"


class FlexBackend(str, enum.Enum):
    """`--moe-flex-dispatcher-backend` (transformer_config.py `moe_flex_dispatcher_backend`,
    token_dispatcher.py `MoEFlexTokenDispatcher`): the kernels behind the flex dispatcher.
    deepep (Megatron's default, `_DeepepManager`: DeepEP's normal kernels,
    github.com/deepseek-ai/DeepEP) or hybridep (`_HybridEPManager`: NVIDIA's Hybrid-EP, the
    hybrid-ep branch of DeepEP; the only backend Megatron-core supports across a multi-node
    NVLink domain). Megatron's third backend, ncclep (TE's NCCL EP), is not modelled."""

    DEEPEP = "deepep"
    HYBRIDEP = "hybridep"


class LoadBalancingType(str, enum.Enum):
    """`--moe-router-load-balancing-type` (transformer_config.py
    `moe_router_load_balancing_type`, default aux_loss; router.py `TopKRouter`, Megatron-LM
    @d7288711ba278d160d2a5a22c099915c9fe1395c): which load-balancing loss the router adds
    when `--moe-aux-loss-coeff` > 0 (`TopKRouter.get_aux_loss_coeff`). aux_loss: the Switch
    loss over the tp·cp group's tokens of one microbatch (`_apply_aux_loss`); seq_aux_loss:
    the same per sequence (`_apply_seq_aux_loss`, DeepSeek-V3); global_aux_loss: the token
    counts all-reduced over tp·cp·dp and averaged over the step's microbatches
    (`_apply_global_aux_loss`); none: no loss. Megatron's sinkhorn routing and lists of
    several types are not modelled."""

    AUX_LOSS = "aux_loss"
    SEQ_AUX_LOSS = "seq_aux_loss"
    GLOBAL_AUX_LOSS = "global_aux_loss"
    NONE = "none"


class RecomputeModule(str, enum.Enum):
    """Megatron-core `--recompute-modules` (transformer_config.py `recompute_modules`, the
    `allowed_modules` of `__post_init__`), under `--recompute-granularity selective`. The
    MoE block and MLA read moe_act, moe, shared_experts and mla_up_proj; the others act on
    the dense layer. Megatron also allows gdn_norm_out, gdp_in_proj, gdp_qkv and mhc, for
    linear-attention and hyper-connection layers simcluster does not model: refused."""

    CORE_ATTN = "core_attn"
    MOE_ACT = "moe_act"
    MOE = "moe"
    SHARED_EXPERTS = "shared_experts"
    LAYERNORM = "layernorm"
    MLA_UP_PROJ = "mla_up_proj"
    MLP = "mlp"


def parse_recompute_modules(names: tuple[str, ...] | list[str]) -> tuple[RecomputeModule, ...]:
    """The modules named, in order; an unknown name is a clear error."""
    allowed = ", ".join(m.value for m in RecomputeModule)
    out = []
    for name in names:
        try:
            out.append(RecomputeModule(name))
        except ValueError:
            raise ValueError(
                f"training.recompute_modules: {name!r} is not a Megatron-core recompute module "
                f"(allowed: {allowed})"
            ) from None
    return tuple(out)
