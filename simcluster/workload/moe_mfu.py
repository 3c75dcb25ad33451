"""Model and hardware FLOPs of a MoE model for MFU / HFU: Megatron's convention.

Megatron-LM `megatron/training/training.py::num_floating_point_operations`
(@d98e8a64ddf34856e74b24714e3bedb2f5a39553) counts, per token, the GEMMs of the *active*
parameters (the top-k routed experts and the shared experts of each MoE layer; the router
is not counted), the attention core and the logits, times 3 for forward and backward.
The same here, layer by layer: the `first_k_dense_layers` dense layers as the dense model
counts them (`flops.layer_forward_flops`), each MoE layer as its attention (the dense
layer without an MLP) plus `moe.moe_forward_flops` less the router's 2·T·h·E, and the
logits 2·B·s·h·v. So MFU counts active parameters (docs/moe.md, "Parameters, total and
active"); the router's GEMM is priced in the op graph but not counted as model FLOPs.
"""

from __future__ import annotations

from dataclasses import replace

from simcluster.config.choices import Recompute
from simcluster.config.moe_choices import RecomputeModule
from simcluster.workload.flops import LayerWidths, custom_modules, layer_forward_flops, selective_rerun_flops
from simcluster.workload.moe import moe_forward_flops, shared_expert_shape
from simcluster.workload.moe_config import MoEConfig


def moe_layer_forward_flops(B: int, s: int, widths: LayerWidths, moe: MoEConfig) -> float:
    """One MoE layer's forward model FLOPs over B·s tokens: its attention (linear and
    core) and the active experts, router excluded."""
    tokens = B * s
    attention = layer_forward_flops(B, s, replace(widths, ffn_hidden_size=0))
    experts = moe_forward_flops(tokens, widths.hidden_size, moe, widths.gated)
    router = 2.0 * tokens * widths.hidden_size * moe.num_experts
    return attention + experts - router


def moe_model_flops(
    B: int, s: int, L: int, v: int, widths: LayerWidths, moe: MoEConfig, recompute: Recompute,
    recompute_modules: frozenset[RecomputeModule] | None = None,
) -> tuple[float, float]:  # fmt: skip
    """(model FLOPs, hardware FLOPs) of one iteration: 3 × the forward; hardware adds what
    recompute re-runs (selective: the attention core's forward 4·B·s²·width per layer, or
    what other `recompute_modules` re-run, `moe_rerun_flops`; full: every layer's forward),
    as `flops.hardware_flops` does for the dense model."""
    k = min(moe.first_k_dense_layers, L)
    layers = k * layer_forward_flops(B, s, widths) + (L - k) * moe_layer_forward_flops(B, s, widths, moe)
    logits = 2.0 * B * s * widths.hidden_size * v
    model = 3.0 * (layers + logits)
    if recompute_modules is not None and custom_modules(recompute, recompute_modules):
        dense = replace(widths, ffn_hidden_size=0)  # a MoE layer reads no `mlp`
        rerun = k * selective_rerun_flops(B, s, widths, recompute_modules) + (L - k) * (
            selective_rerun_flops(B, s, dense, recompute_modules)
            + moe_rerun_flops(B, s, widths, moe, recompute_modules)
        )
        return model, model + rerun
    if recompute is Recompute.SELECTIVE:
        return model, model + L * 4.0 * B * s * s * widths.attention_width
    if recompute is Recompute.FULL:
        return model, model + layers
    return model, model


def moe_rerun_flops(
    B: int, s: int, widths: LayerWidths, moe: MoEConfig, modules: frozenset[RecomputeModule]
) -> float:
    """GEMM FLOPs a MoE block re-runs under selective recompute, counted as the model FLOPs
    are (no router): `moe` its routed and shared experts; `shared_experts` the shared ones
    again (the checkpoint inside `moe`'s runs once more, `moe_layer.moe_recompute_ops`);
    `moe_act` and `layernorm` no GEMM."""
    tokens = B * s
    shared = tokens * shared_expert_shape(widths.hidden_size, moe, widths.gated).forward_flops_per_token
    block = (
        moe_forward_flops(tokens, widths.hidden_size, moe, widths.gated)
        - 2.0 * tokens * widths.hidden_size * moe.num_experts
    )
    return (block if RecomputeModule.MOE in modules else 0.0) + (
        shared if RecomputeModule.SHARED_EXPERTS in modules else 0.0
    )
