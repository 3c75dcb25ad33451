"""`model.kv_channels` (Megatron --kv-channels): a head width d_h apart from h / a, as Qwen3
(h 2048, 32 heads of 128) and gpt-oss (h 2880, 64 heads of 64) have it. Megatron-core
attention.py: query_projection_size = kv_channels · heads, kv_projection_size = kv_channels ·
groups; linear_qkv is h -> q + 2k, linear_proj q -> h. The op graph, the parameter count,
MFU and the context-parallel ring follow those widths."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simcluster.config.scenario import load_scenario, parse_scenario
from simcluster.workload.flops import layer_widths
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.model import build_workload, layer_config
from simcluster.workload.moe_config import MoEConfig
from simcluster.workload.moe_mfu import moe_model_flops
from simcluster.workload.moe_params import param_counts
from simcluster.workload.ops import Module, Pass
from tests.paths import ROOT
from tests.workload.test_moe_public_models import QWEN3_30B

QWEN3_30B_FILE = ROOT / "scenarios" / "moe" / "qwen3-30b-a3b-h100.yaml"


def _qwen(**parallel):
    scenario = load_scenario(QWEN3_30B_FILE)
    data = scenario.model_dump(mode="json")
    data["parallel"].update(parallel)
    return parse_scenario(data, "s.yaml")


def _forward(cfg: LayerConfig):
    return {op.name: op for op in layer_ops(cfg).forward}


def test_default_is_hidden_over_heads_and_equal_configs_are_equal():
    """kv_channels 0 and h / a are one layer (so cached ops and every result stay ==)."""
    base = LayerConfig(hidden_size=2048, num_attention_heads=32, seq_length=128, micro_batch_size=1)
    assert base.kv_channels == base.head_dim == 64
    assert replace(base, kv_channels=64) == base
    assert base.query_width == 2048


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_qwen3_widths_in_the_op_graph(tp):
    """Qwen3-30B-A3B: q = 32·128 = 4096, k = 4·128 = 512; QKV GEMM h -> (q + 2k)/t, proj
    q/t -> h, flash attention of head dim 128 on a/t heads."""
    cfg = LayerConfig(
        hidden_size=2048, num_attention_heads=32, num_query_groups=4, kv_channels=128, seq_length=256,
        micro_batch_size=1, ffn_hidden_size=768, tp=tp, attention_backend="flash",
    )  # fmt: skip
    ops = _forward(cfg)
    assert (ops["attn.qkv"].gemm.n, ops["attn.qkv"].gemm.k) == ((4096 + 2 * 512) // tp, 2048)
    assert (ops["attn.proj"].gemm.n, ops["attn.proj"].gemm.k) == (2048, 4096 // tp)
    flash = ops["attn.flash"].attention
    assert (flash.head_dim, flash.heads, flash.kv_heads) == (128, 32 // tp, 4 // tp)
    # Q, K, V, O and the LSE: 2·s·b·(2q + 2k)/t + 4·s·b·a/t
    assert ops["attn.flash"].saved_bytes == 2 * 256 * (2 * 4096 + 2 * 512) / tp + 4 * 256 * 32 / tp


def test_unfused_core_contracts_over_the_head_width():
    """The unfused QKᵀ is [s, d] x [d, s] per head, ×V gives [s, d]: d = kv_channels."""
    cfg = LayerConfig(
        hidden_size=256, num_attention_heads=4, kv_channels=96, seq_length=128, micro_batch_size=2
    )
    ops = _forward(cfg)
    assert (ops["attn.qk"].gemm.k, ops["attn.qk"].gemm.batch) == (96, 2 * 4)
    assert ops["attn.av"].gemm.n == 96
    backward = {op.name: op for op in layer_ops(cfg).backward}
    assert backward["attn.proj.dgrad"].gemm.n == 4 * 96


def test_qwen3_30b_parameters_are_megatrons_count():
    """All 48 layers on one rank: the workload's parameters are the published model's 30.53B
    (tests/workload/test_moe_public_models.py, from the HF config) plus what the scenario
    contract cannot switch off: Megatron's default linear biases (QKV q + 2k, proj h per
    layer). The QK-norm weights (2·128 per layer, `model.qk_layernorm`) are in both."""
    scenario = _qwen(dp=1, ep=1)
    assert scenario.model.qk_layernorm
    workload = build_workload(scenario)
    (stage,) = workload.stages
    q, k, h, layers = 4096, 512, 2048, 48
    expected = param_counts(QWEN3_30B).total + layers * (q + 2 * k + h)
    assert stage.num_params == expected
    assert abs(stage.num_params / 1e9 - 30.53) < 0.005


def test_qwen3_30b_mfu_flops_are_megatrons_formula():
    """training.py `num_floating_point_operations` (@d98e8a64) for Qwen3-30B-A3B, transcribed
    with kv_channels 128 (query_projection_size = 128·32, key/value 128·4), plus the causal
    half simcluster keeps (workload/flops.py: 6·B·s²·L·q); its active parameters are the
    3.35B of the model card."""
    scenario = load_scenario(QWEN3_30B_FILE)
    m, tr = scenario.model, scenario.training
    B, s, L, h, V = tr.global_batch_size, m.seq_length, m.num_layers, m.hidden_size, m.vocab_size
    q, kv = 128 * 32, 128 * 4
    self_attn = 3 * 2 * (h * (q + kv + kv) + q * h)
    core = 3 * 2 * q / 2 * 2
    moe = 4 * h * 768 * 8 * 1.5  # moe_layer_flops: 4·T·h·f·k·3/2 (SwiGLU)
    megatron = B * s * L * (self_attn + 3 * moe) + B * s * s * L * core + 3 * 2 * B * s * h * V
    widths = layer_widths(layer_config(scenario))
    moe_config = MoEConfig(**m.moe.model_dump())
    model, _ = moe_model_flops(B, s, L, V, widths, moe_config, tr.recompute)
    assert model == pytest.approx(megatron + 6 * B * s * s * L * q, rel=1e-12)
    # without the attention core: 6·B·s·(the 3.35B active parameters less those without a
    # GEMM: the input embedding (a lookup), the norms and the router)
    core_flops = 12 * B * s * s * L * q
    active = param_counts(QWEN3_30B).active - V * h  # less the input embedding (no FLOPs)
    norms = L * 2 * h + h + L * 2 * 128  # norms and QK-norm: no GEMM
    router = L * 128 * h  # priced, but not in Megatron's count (docs/moe.md)
    assert (model - core_flops) / (6 * B * s) == pytest.approx(active - norms - router, rel=1e-12)


def test_context_parallel_ring_moves_k_and_v_of_the_head_width():
    """With cp the ring sends K and V of g·d_h per token (not g·h/a)."""
    scenario = _qwen(dp=8, ep=8, cp=2)
    workload = build_workload(scenario)
    forward = workload.layer.forward
    flash = next(op for op in forward if op.module is Module.FLASH and op.pass_ is Pass.FORWARD)
    tokens = 4096 // 2
    assert flash.ring is not None
    assert flash.ring.first_message_bytes == 2 * 2 * tokens * 512
