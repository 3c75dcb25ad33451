"""Whole-model parameter counts of a MoE transformer (total, and active per token), from its
published config, as Megatron-core builds the model.

A decoder layer is an attention block (standard: QKV h·(q + 2k) + projection q·h, q = a·d_h,
k = g·d_h, optional biases, QK-norm and per-head sinks; or MLA, `workload.mla`) and an MLP
that is dense for the first `first_k_dense_layers` layers and MoE after (`workload.moe`),
with two norms (input and pre-MLP, one weight vector each: RMSNorm). The model adds the
input embedding V·h, the output layer V·h unless tied, and a final norm. Each
multi-token-prediction layer (megatron/core/transformer/multi_token_prediction.py
`MultiTokenPredictionLayer`: enorm, hnorm, eh_proj 2h -> h, one decoder layer, final norm)
shares the embedding and output layer with the main model.

"Active" parameters are what one token's forward multiplies by: everything but the routed
experts it does not pick (k of E). Publishers differ on the embedding: Mixtral and Qwen3
count both embedding matrices; gpt-oss counts neither the input embedding
(`active_without_embedding`); see docs/moe.md. MFU counts the FLOPs of the active
parameters (training.py `num_floating_point_operations`: k experts + shared experts).
"""

from __future__ import annotations

from dataclasses import dataclass

from simcluster.workload.mla import MLAShape
from simcluster.workload.moe import moe_params
from simcluster.workload.moe_config import MLAConfig, MoEConfig


@dataclass(frozen=True, slots=True)
class MoEModelShape:
    """What the parameter count needs from a model config (HF config.json names in the
    docstrings of tests/workload/test_moe_public_models.py)."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    ffn_hidden_size: int  # the dense layers' MLP width
    moe: MoEConfig | None
    gated: bool = True
    num_query_groups: int = 0  # 0 = a
    kv_channels: int = 0  # 0 = h / a
    mla: MLAConfig | None = None
    qk_layernorm: bool = False
    attention_bias: bool = False  # QKV and projection biases (gpt-oss)
    attention_sinks: bool = False  # one learned sink logit per head (gpt-oss)
    expert_bias: bool = False  # expert fc1/fc2 biases (gpt-oss)
    tie_embeddings: bool = False
    mtp_num_layers: int = 0


@dataclass(frozen=True, slots=True)
class ParamCounts:
    embedding: int
    output: int
    attention: int  # all layers
    dense_mlp: int  # the first_k_dense_layers' MLPs
    moe_total: int  # all MoE blocks: routed experts, shared experts, routers
    moe_active: int  # the same with k of E routed experts
    norms: int
    mtp: int  # the MTP layers (embedding and output shared with the main model)

    @property
    def total(self) -> int:
        return (
            self.embedding
            + self.output
            + self.attention
            + self.dense_mlp
            + self.moe_total
            + self.norms
            + self.mtp
        )

    @property
    def active(self) -> int:
        """Per token, with both embedding matrices (Mixtral, Qwen3 convention)."""
        return self.total - (self.moe_total - self.moe_active)

    @property
    def active_without_embedding(self) -> int:
        """Per token, without the input embedding (a lookup, no FLOPs; gpt-oss convention)."""
        return self.active - self.embedding


def attention_params(m: MoEModelShape) -> int:
    """One layer's attention parameters (its input norm not included)."""
    if m.mla is not None:
        return MLAShape(m.hidden_size, m.num_attention_heads, m.mla).params
    h, a = m.hidden_size, m.num_attention_heads
    d = m.kv_channels or h // a
    q, k = a * d, (m.num_query_groups or a) * d
    weights = h * (q + 2 * k) + q * h
    biases = (q + 2 * k + h) if m.attention_bias else 0
    qk_norm = 2 * d if m.qk_layernorm else 0
    sinks = a if m.attention_sinks else 0
    return weights + biases + qk_norm + sinks


def dense_mlp_params(m: MoEModelShape) -> int:
    glu = 3 if m.gated else 2
    return glu * m.hidden_size * m.ffn_hidden_size


def _layer_mlps(m: MoEModelShape, num_layers: int, moe_layers: int) -> tuple[int, int, int]:
    """(dense MLP, MoE total, MoE active) parameters over `num_layers` layers, `moe_layers` of them MoE."""
    if m.moe is None:
        return num_layers * dense_mlp_params(m), 0, 0
    block = moe_params(m.hidden_size, m.moe, m.gated, m.expert_bias)
    return (
        (num_layers - moe_layers) * dense_mlp_params(m),
        moe_layers * block.total,
        moe_layers * block.active,
    )


def param_counts(m: MoEModelShape) -> ParamCounts:
    moe_layers = m.moe.num_moe_layers(m.num_layers) if m.moe else 0
    dense, moe_total, moe_active = _layer_mlps(m, m.num_layers, moe_layers)
    h = m.hidden_size
    mtp = 0
    if m.mtp_num_layers:
        # multi_token_prediction.py: enorm, hnorm (h each), eh_proj (2h·h), the decoder layer
        # (MoE when the model's last layer is: training.py counts it so), final_layernorm (h)
        last_is_moe = m.moe is not None and m.moe.is_moe_layer(m.num_layers - 1)
        mlp_dense, mlp_total, _ = _layer_mlps(m, 1, 1 if last_is_moe else 0)
        layer = attention_params(m) + mlp_dense + mlp_total + 2 * h
        mtp = m.mtp_num_layers * (3 * h + 2 * h * h + layer)
        # an MTP layer's routed experts are idle for a token like the main layers'
        if last_is_moe and m.moe is not None:
            block = moe_params(h, m.moe, m.gated, m.expert_bias)
            moe_total += m.mtp_num_layers * block.total
            moe_active += m.mtp_num_layers * block.active
            mtp -= m.mtp_num_layers * block.total
    return ParamCounts(
        embedding=m.vocab_size * h,
        output=0 if m.tie_embeddings else m.vocab_size * h,
        attention=m.num_layers * attention_params(m),
        dense_mlp=dense,
        moe_total=moe_total,
        moe_active=moe_active,
        norms=m.num_layers * 2 * h + h,
        mtp=mtp,
    )


def mtp_extra_forward_flops(num_tokens: float, hidden_size: int, vocab_size: int) -> float:
    """Forward FLOPs of one multi-token-prediction layer beyond its decoder layer: eh_proj
    (2h -> h) and its own logits (h -> V), 2·T·2h·h + 2·T·h·V. Megatron's MFU count
    (training.py `num_floating_point_operations`: `mtp_num_layers * (3h + 2h²)` and the
    logits `(mtp_num_layers + 1)` times) has these plus one FLOP per element of its three
    norms; the decoder layer is counted with the others (a MoE layer when the model's last
    layer is one)."""
    return 2.0 * num_tokens * 2 * hidden_size * hidden_size + 2.0 * num_tokens * hidden_size * vocab_size
