"""Model and hardware FLOPs of a model with MLA attention or multi-token prediction, for
MFU / HFU: Megatron's count (megatron/training/training.py `num_floating_point_operations`,
Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553), in the repository's convention.

Per layer forward: the attention's linears 2·B·s·weights (MLA: its five linears,
`mla.MLAShape.linear_weights`; standard: QKV and proj) plus the core, and the MLP (dense, or
the active experts without the router, `workload.moe_mfu`); the logits 2·B·s·h·V; each MTP
layer its decoder layer (the model's last layer's kind) plus eh_proj and its own logits
(`moe_params.mtp_extra_forward_flops`); model FLOPs 3 × the forward. The core is counted
unhalved, 2·B·s²·n·(qk + rope + v) for MLA (4·B·s²·q for standard attention: at qk = v the
same), as `workload.flops` counts every model (Megatron-core's current count halves it for
the causal mask; subtract B·s²·n·(qk + rope + v) per layer forward to convert). Megatron also
counts one FLOP per element of MLA's latent norms and MTP's three norms; the repository
counts no norm (less than 0.01 % of DeepSeek-V3's FLOPs).

Hardware FLOPs add what recompute re-runs: `core_attn` the core's forward, `mla_up_proj`
the up projections (2·B·s·(q_lora·n·(qk + rope) + kv_lora·n·(qk + v))), full recompute
every layer's forward.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simcluster.config.choices import Recompute
from simcluster.workload.flops import LayerWidths, layer_forward_flops
from simcluster.workload.mla import MLAShape
from simcluster.workload.mla_layer import MLALayerSpec
from simcluster.workload.moe import moe_forward_flops
from simcluster.workload.moe_config import MoEConfig
from simcluster.workload.moe_params import mtp_extra_forward_flops


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the count needs beyond `LayerWidths`: heads (for MLA), the experts, MLA, MTP."""

    widths: LayerWidths
    num_attention_heads: int
    moe: MoEConfig | None = None
    mla: MLALayerSpec | None = None
    mtp_num_layers: int = 0


def attention_forward_flops(B: int, s: int, shape: ModelShape) -> tuple[float, float]:
    """(linears + core, core alone) of one layer's attention forward over B·s tokens."""
    if shape.mla is None:
        widths = replace(shape.widths, ffn_hidden_size=0)
        core = 4.0 * B * s * s * widths.attention_width
        return float(layer_forward_flops(B, s, widths)), core
    m = shape.mla.mla
    mla = MLAShape(shape.widths.hidden_size, shape.num_attention_heads, m)
    core = 2.0 * B * s * s * shape.num_attention_heads * (m.q_head_dim + m.v_head_dim)
    return 2.0 * B * s * mla.linear_weights + core, core


def mlp_forward_flops(B: int, s: int, shape: ModelShape, moe_layer: bool) -> float:
    """A dense MLP's 2·B·s·glu·h·f, or a MoE block's active experts (router not counted)."""
    h, tokens = shape.widths.hidden_size, B * s
    if moe_layer and shape.moe is not None:
        router = 2.0 * tokens * h * shape.moe.num_experts
        return moe_forward_flops(tokens, h, shape.moe, shape.widths.gated) - router
    glu = 3 if shape.widths.gated else 2
    return 2.0 * tokens * glu * h * shape.widths.ffn_hidden_size


def up_proj_forward_flops(B: int, s: int, shape: ModelShape) -> float:
    """The MLA up projections' forward (what `mla_up_proj` re-runs); 0 without MLA."""
    if shape.mla is None:
        return 0.0
    m, n = shape.mla.mla, shape.num_attention_heads
    q_up = (m.q_lora_rank or 0) * n * m.q_head_dim
    return 2.0 * B * s * (q_up + m.kv_lora_rank * n * (m.qk_head_dim + m.v_head_dim))


def variant_model_flops(
    B: int, s: int, L: int, v: int, shape: ModelShape, recompute: Recompute
) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of one iteration (module docstring)."""
    h = shape.widths.hidden_size
    k = min(shape.moe.first_k_dense_layers, L) if shape.moe is not None else L
    attention, core = attention_forward_flops(B, s, shape)
    dense_mlp = mlp_forward_flops(B, s, shape, moe_layer=False)
    moe_mlp = mlp_forward_flops(B, s, shape, moe_layer=True)
    layers = L * attention + k * dense_mlp + (L - k) * moe_mlp
    last_mlp = moe_mlp if shape.moe is not None and k < L else dense_mlp
    mtp = shape.mtp_num_layers
    mtp_layers = mtp * (attention + last_mlp)
    mtp_extra = mtp * mtp_extra_forward_flops(B * s, h, v)
    model = 3.0 * (layers + mtp_layers + mtp_extra + 2.0 * B * s * h * v)
    per_layer_rerun = 0.0
    if recompute is Recompute.SELECTIVE:
        core_attn = shape.mla.recompute_core_attn if shape.mla is not None else True
        up_proj = shape.mla is not None and shape.mla.recompute_up_proj
        per_layer_rerun = (core if core_attn else 0.0) + (
            up_proj_forward_flops(B, s, shape) if up_proj else 0.0
        )
        return model, model + (L + mtp) * per_layer_rerun
    if recompute is Recompute.FULL:
        return model, model + layers + mtp_layers
    return model, model
