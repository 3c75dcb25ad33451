"""MLA under FP8 (`workload.fp8` rules applied to `workload.mla_layer`'s TE linears): the
down, up and q projections are quantized like the dense layer's linears, their saved
inputs drop to the quantized byte, current scaling adds an amax pass where the norm does
not compute it, and the 16-bit MLA layer is unchanged."""

from __future__ import annotations

import pytest

from simcluster.config.scenario import parse_scenario
from simcluster.workload.fp8 import is_te_linear_gemm, te_linear_weight_params
from simcluster.workload.model import kind_ops
from simcluster.workload.ops import Module, OpKind, Pass
from tests.workload.test_mla_layer import SMALL, _data, _mla_kind, _small

FP8 = {"training.dtype": "fp8", "training.fp8_recipe": "tensorwise"}
MLA_LINEARS = {Module.MLA_DOWN, Module.MLA_UP, Module.MLA_Q_PROJ, Module.PROJ}


def _ops(**changes):
    _, kind = _mla_kind(_small(**changes))
    return kind, kind_ops(kind)


def _by_name(ops):
    return {op.name: op for op in ops}


def test_every_mla_gemm_is_a_te_linear_but_the_core():
    _, layer = _ops(**FP8)
    gemms = [op for op in layer.forward + layer.backward if op.kind is OpKind.GEMM]
    mla = [op for op in gemms if op.module in MLA_LINEARS]
    assert {op.module for op in mla} == {Module.MLA_DOWN, Module.MLA_UP, Module.PROJ}
    assert all(is_te_linear_gemm(op) for op in mla)
    assert not any(is_te_linear_gemm(op) for op in layer.forward if op.module is Module.FLASH)


def test_saved_inputs_drop_to_one_byte():
    """bf16 -> fp8: the up projections' ln_out halves; the two down projections each keep a
    1-byte copy of ln1's output (T·r·h), where bf16 kept one 2-byte tensor on q_down; proj
    keeps a 1-byte copy of O beside the bf16 O the flash op saves."""
    kind, bf16 = _ops()
    _, fp8 = _ops(**FP8)
    before, after = _by_name(bf16.forward), _by_name(fp8.forward)
    cfg = kind.config
    local_tokens = cfg.region_tokens
    for up in ("attn.q_up", "attn.kv_up"):
        assert before[up].saved_bytes > 0
        assert after[up].saved_bytes == pytest.approx(before[up].saved_bytes / 2)
    norm_out = local_tokens * cfg.hidden_size
    assert before["attn.q_down"].saved_bytes == pytest.approx(2 * norm_out)
    assert before["attn.kv_down"].saved_bytes == 0
    assert after["attn.q_down"].saved_bytes == pytest.approx(norm_out)
    assert after["attn.kv_down"].saved_bytes == pytest.approx(norm_out)
    proj = after["attn.proj"].gemm
    assert before["attn.proj"].saved_bytes == 0
    assert after["attn.proj"].saved_bytes == pytest.approx(proj.m * proj.k)
    assert after["attn.flash"].saved_bytes == before["attn.flash"].saved_bytes


def test_current_scaling_amax_passes_follow_the_norm_fusion():
    """Tensorwise: an amax pass before every MLA fprop but the LayerNormLinear up
    projections (their fused norm computes it), and before every dgrad."""
    _, layer = _ops(**FP8)
    names = {op.name for op in layer.forward + layer.backward}
    for fprop in ("attn.q_down", "attn.kv_down", "attn.proj"):
        assert f"{fprop}.amax" in names
    for fprop in ("attn.q_up", "attn.kv_up"):
        assert f"{fprop}.amax" not in names
    dgrads = [
        op
        for op in layer.backward
        if op.module in MLA_LINEARS and op.pass_ is Pass.INPUT_GRAD and op.kind is OpKind.GEMM
    ]
    assert dgrads and all(f"{op.name}.amax" in names for op in dgrads)


def test_q_projection_without_a_q_latent_has_its_own_amax_and_copy():
    data = _data(**(SMALL | FP8))
    data["model"]["mla"]["q_lora_rank"] = None  # DeepSeek-V2-Lite's shape: no q latent
    _, kind = _mla_kind(parse_scenario(data, "s.yaml"))
    layer = kind_ops(kind)
    forward = _by_name(layer.forward)
    assert forward["attn.q_proj"].module is Module.MLA_Q_PROJ
    assert "attn.q_proj.amax" in forward
    cfg = kind.config
    assert forward["attn.q_proj"].saved_bytes == pytest.approx(cfg.region_tokens * cfg.hidden_size)


def test_fp8_weight_copies_count_the_mla_linears():
    kind, layer = _ops(**FP8)
    mla_only = te_linear_weight_params(layer.forward, frozenset({Module.MLA_DOWN, Module.MLA_UP}))
    cfg, m = kind.config, kind.mla.mla
    h, heads = cfg.hidden_size, cfg.num_attention_heads // cfg.tp
    expected = h * m.q_lora_rank + h * (m.kv_lora_rank + m.qk_pos_emb_head_dim)
    expected += m.q_lora_rank * heads * m.q_head_dim + m.kv_lora_rank * heads * (m.qk_head_dim + m.v_head_dim)
    assert mla_only == expected


def test_bf16_mla_layer_is_the_old_composition():
    """16-bit: the MLA layer is the dense layer's ops with MLA spliced in, then the MoE MLP,
    as before FP8 was priced with MLA (`quantized_layer_ops` returns 16-bit ops as they are)."""
    from simcluster.workload.context_parallel import context_parallel_layer_ops
    from simcluster.workload.layer import layer_ops
    from simcluster.workload.mla_layer import mla_layer_ops
    from simcluster.workload.moe_layer import moe_layer_config, moe_layer_ops

    kind, layer = _ops()
    assert kind.moe is not None
    cfg = moe_layer_config(kind.config)
    dense = mla_layer_ops(context_parallel_layer_ops(layer_ops(cfg), cfg, kind.cp), cfg, kind.mla)
    assert layer == moe_layer_ops(dense, cfg, kind.moe)
