"""Per-rank parameters of MLA attention and of multi-token-prediction layers, as the
pipeline stages hold them (`workload.model`'s static memory).

Megatron-core `MLASelfAttention` (multi_latent_attention.py @d98e8a64ddf34856e74b24714e3bedb2f5a39553):
the down projections are "duplicated" TE linears (the whole weight on every tp rank), the up
projections and linear_proj split over tp, the latent norms replicated; only linear_proj has
a bias (`add_bias_linear`, replicated, as the dense layer counts it; none with
`--disable-bias-linear`); the others are built with bias=False. `MultiTokenPredictionLayer`:
enorm, hnorm, final norm (replicated), eh_proj 2h -> h column-parallel without bias, one
transformer layer.
"""

from __future__ import annotations

from simcluster.workload.mla import MLAShape
from simcluster.workload.moe_config import MLAConfig


def standard_attention_params_per_rank(
    h: int, tp: int, query_width: int, kv_width: int, bias: bool = True
) -> float:
    """The attention part of `model.layer_params_per_rank`: QKV weight and bias and the
    projection weight over tp, the projection's bias replicated (no biases without `bias`,
    Megatron's `add_bias_linear`)."""
    qkv = query_width + 2 * kv_width
    sharded = h * qkv + query_width * h + (qkv if bias else 0)
    return sharded / tp + (h if bias else 0)


def mla_attention_params_per_rank(
    h: int, num_heads: int, mla: MLAConfig, tp: int, bias: bool = True
) -> float:
    """Down projections and latent norms whole, up projections and proj over tp, proj's bias
    (`bias`: Megatron's `add_bias_linear`)."""
    shape = MLAShape(h, num_heads, mla)
    down = h * (mla.q_lora_rank or 0) + h * (mla.kv_lora_rank + mla.qk_pos_emb_head_dim)
    if not mla.q_lora_rank:
        down = h * (mla.kv_lora_rank + mla.qk_pos_emb_head_dim)  # linear_q_proj is column-parallel
    split = shape.linear_weights - down
    return down + split / tp + shape.norm_weights + (h if bias else 0)


def mla_param_delta_per_rank(
    h: int, num_heads: int, mla: MLAConfig, tp: int, query_width: int, kv_width: int, bias: bool = True
) -> float:
    """One layer's MLA attention less the standard attention the dense count holds."""
    return mla_attention_params_per_rank(h, num_heads, mla, tp, bias) - standard_attention_params_per_rank(
        h, tp, query_width, kv_width, bias
    )


def mtp_params_per_rank(h: int, tp: int, norm_params: int, layer_params: float) -> float:
    """One MTP layer beyond the shared embedding and output layer: three norms, eh_proj
    (2h·h over tp) and its transformer layer (`layer_params`, per rank)."""
    return 3 * norm_params + 2 * h * h / tp + layer_params
