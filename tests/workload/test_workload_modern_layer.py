"""The Llama-style layer options in the op graph (docs/memory.md): widths and saved
bytes computed by hand, the closed forms of `memory.layer_activation_bytes` against the op
graph for any shape, flash attention priced from its achieved throughput."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcluster.config.choices import (
    Activation,
    AttentionBackend,
    Normalization,
    PositionEmbedding,
    Recompute,
)
from simcluster.config.hardware import load_hardware
from simcluster.costs.compute import attention_time_s
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.memory import layer_activation_bytes, table2_bytes_per_layer
from simcluster.workload.ops import AttentionShape, OpKind

FLASH = AttentionBackend.FLASH


def _llama3_8b(**overrides) -> LayerConfig:
    """Llama 3 8B (h 4096, a 32, g 8, f 14336, s 8192) on t = 8 with SP, Llama recipe: no dropout."""
    fields = dict(
        hidden_size=4096,
        num_attention_heads=32,
        seq_length=8192,
        micro_batch_size=1,
        ffn_hidden_size=14336,
        tp=8,
        sequence_parallel=True,
        num_query_groups=8,
        activation=Activation.SWIGLU,
        normalization=Normalization.RMSNORM,
        position_embedding=PositionEmbedding.ROPE,
        attention_backend=FLASH,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    return LayerConfig(**{**fields, **overrides})


def _ops(cfg: LayerConfig) -> dict:
    ops = layer_ops(cfg)
    return {op.name: op for op in ops.forward + ops.backward}


def test_llama3_8b_layer_keeps_34_sbh_over_t_plus_the_lse():
    """docs/memory.md: (sb/t)(8h + 4q + 4k + 6f) = 139264·sb/t = 34·sbh/t, plus the fp32 LSE
    4·s·b·a/t that row 5 counts (the norms' fp32 rsigma is not counted, as in Table 2)."""
    cfg = _llama3_8b()
    s, b, h, t, a = 8192, 1, 4096, 8, 32
    assert layer_ops(cfg).saved_bytes == 34 * s * b * h / t + 4 * s * b * a / t
    # with Megatron's default dropout 0.1 the two hidden-dropout masks add sbh/t each
    with_dropout = replace(cfg, hidden_dropout=0.1, attention_dropout=0.1)
    assert layer_ops(with_dropout).saved_bytes == 36 * s * b * h / t + 4 * s * b * a / t


def test_gqa_shrinks_the_qkv_gemm_and_the_saved_kv_by_hand():
    """a 32, g 8, d_h 128, t 8: QKV n = (4096 + 2·1024)/8 = 768 (MHA: 1536); flash keeps
    Q, K, V, O = 2·s·b·(2·4096 + 2·1024)/8 bytes + LSE, against 2·s·b·4·4096/8 for MHA."""
    s, b = 8192, 1
    gqa, mha = _ops(_llama3_8b()), _ops(_llama3_8b(num_query_groups=32))
    assert (gqa["attn.qkv"].gemm.n, mha["attn.qkv"].gemm.n) == (768, 1536)
    assert gqa["attn.qkv.wgrad"].gemm.n == gqa["attn.qkv.dgrad"].gemm.k == 768
    lse = 4 * s * b * 32 / 8
    assert gqa["attn.flash"].saved_bytes == 2 * s * b * (2 * 4096 + 2 * 1024) / 8 + lse
    assert mha["attn.flash"].saved_bytes == 2 * s * b * 4 * 4096 / 8 + lse
    assert gqa["attn.flash"].attention.kv_heads == 1 and gqa["attn.flash"].attention.heads == 4


def test_gqa_unfused_core_repeats_kv_as_megatron_core():
    """The unfused core repeats K/V to the a/t query heads (repeat_interleave): saved bytes
    equal MHA's; selective recompute keeps the un-repeated K and V (2·s·b·(q + 2k)/t) and,
    V being a view of the QKV output, that whole output beside the RoPE'd Q and K
    (2·s·b·(q + k)/t more)."""
    shape = dict(attention_backend=AttentionBackend.UNFUSED, seq_length=512)
    gqa, mha = _llama3_8b(**shape), _llama3_8b(num_query_groups=32, **shape)
    assert layer_ops(gqa).saved_bytes == layer_ops(mha).saved_bytes
    assert "attn.kv_repeat" in _ops(gqa) and "attn.kv_repeat" not in _ops(mha)
    sel = layer_ops(replace(gqa, recompute=Recompute.SELECTIVE))
    core = {op.name: op.saved_bytes for op in sel.forward if op.name in ("attn.qk", "attn.av")}
    assert sum(core.values()) == 2 * 512 * (4096 + 2 * 1024) / 8 + 2 * 512 * (4096 + 1024) / 8


def test_swiglu_widths_and_saved_bytes():
    """fc1 is one GEMM 2f/t wide; the gating kernel reads 2f, writes f, keeps its 2f input
    (4sbf/t bytes); fc2 keeps its f-wide input (2sbf/t)."""
    s, b, f, t = 8192, 1, 14336, 8
    ops = _ops(_llama3_8b())
    assert ops["mlp.fc1"].gemm.n == 2 * f // t and ops["mlp.fc2"].gemm.k == f // t
    assert ops["mlp.fc1.wgrad"].gemm.n == 2 * f // t
    assert ops["mlp.swiglu"].saved_bytes == 4 * s * b * f / t
    assert ops["mlp.swiglu"].bytes_moved == 2 * 3 * s * b * f / t
    assert ops["mlp.fc2"].saved_bytes == 2 * s * b * f / t
    relu = _ops(_llama3_8b(activation=Activation.SQUARED_RELU))
    assert relu["mlp.fc1"].gemm.n == f // t and relu["mlp.squared_relu"].saved_bytes == 2 * s * b * f / t


def test_rope_is_an_elementwise_kernel_on_q_and_k_each_way():
    s, b, t = 8192, 1, 8
    ops = _ops(_llama3_8b())
    width = 4096 + 1024  # q + k
    assert ops["attn.rope"].bytes_moved == ops["attn.rope.bwd"].bytes_moved == 2 * 2 * s * b * width / t
    assert ops["attn.rope"].saved_bytes == 0
    assert "attn.rope" not in _ops(_llama3_8b(position_embedding=PositionEmbedding.LEARNED))


def test_flash_removes_every_s_squared_term():
    """Doubling s doubles the flash layer's saved bytes exactly (no s² term); the unfused
    core's grows faster. No op of the flash layer is an s × s GEMM or softmax."""
    for recompute in Recompute:
        small = layer_ops(_llama3_8b(seq_length=2048, recompute=recompute)).saved_bytes
        large = layer_ops(_llama3_8b(seq_length=4096, recompute=recompute)).saved_bytes
        assert large == 2 * small
    unfused = dict(attention_backend=AttentionBackend.UNFUSED)
    assert (
        layer_ops(_llama3_8b(seq_length=4096, **unfused)).saved_bytes
        > 2 * layer_ops(_llama3_8b(seq_length=2048, **unfused)).saved_bytes
    )
    names = set(_ops(_llama3_8b()))
    assert not names & {"attn.qk", "attn.softmax", "attn.dropout", "attn.av", "attn.context_copy"}


def test_flash_selective_recompute_frees_only_the_lse_and_reruns_the_forward():
    """Megatron-core `--recompute-modules core_attn`: Q, K, V kept by the checkpoint, O by
    proj; only the LSE goes; the backward re-runs the flash forward kernel. Learned
    positions and one group per rank (Q, K, V views of the QKV output): that is all. TE's
    layout copy runs inside the checkpointed core (`layer.layout_copies`), so it re-runs too."""
    cfg = _llama3_8b(position_embedding=PositionEmbedding.LEARNED)
    sel = layer_ops(replace(cfg, recompute=Recompute.SELECTIVE))
    assert layer_ops(cfg).saved_bytes - sel.saved_bytes == 4 * 8192 * 32 / 8
    assert [op.name for op in sel.recompute] == ["attn.value_copy", "attn.flash"]
    assert sel.recompute[1].flops == _ops(cfg)["attn.flash"].flops


def test_flash_selective_recompute_with_rope_keeps_more_than_no_recompute():
    """With RoPE the checkpoint keeps the new Q and K and, through V's view, the whole QKV
    output: e·S·(q + k)/t more, against the 4·S·a/t LSE freed. Llama-3-8B, t = 8,
    S = 8192: 2·8192·5120/8 − 4·8192·32/8 = 10,354,688 bytes more per layer."""
    cfg = _llama3_8b()
    sel = layer_ops(replace(cfg, recompute=Recompute.SELECTIVE))
    assert sel.saved_bytes - layer_ops(cfg).saved_bytes == 2 * 8192 * 5120 / 8 - 4 * 8192 * 32 / 8
    assert [op.name for op in sel.recompute] == ["attn.value_copy", "attn.flash"]
    assert sel.recompute[1].flops == _ops(cfg)["attn.flash"].flops


def test_flash_is_priced_from_the_profile_throughput():
    """Causal forward FLOPs 4·b·heads·s²·d/2 at rate(s) × causal efficiency(s); backward
    2.5× the FLOPs at the backward rate (H100 cuDNN table, s = 8192: 653 and 536 TFLOP/s,
    causal 0.88)."""
    hw = load_hardware("h100-sxm5-80gb")
    fwd = AttentionShape(batch=1, heads=4, kv_heads=1, seq_q=8192, seq_k=8192, head_dim=128, causal=True)
    flops = 4 * 4 * 8192 * 8192 * 128 / 2
    assert fwd.flops == flops
    assert attention_time_s(fwd, hw) == pytest.approx(hw.kernel_launch_s + flops / (653e12 * 0.88))
    bwd = replace(fwd, backward=True)
    assert attention_time_s(bwd, hw) == pytest.approx(hw.kernel_launch_s + 2.5 * flops / (536e12 * 0.88))
    # a context-parallel chunk: 1024 queries against 8192 keys, not causal, full rate
    chunk = replace(fwd, seq_q=1024, causal=False)
    assert chunk.flops == 4 * 4 * 1024 * 8192 * 128


def test_flash_needs_rates_in_the_profile():
    hw = load_hardware("a100-sxm4-80gb")
    shape = AttentionShape(batch=1, heads=4, kv_heads=4, seq_q=2048, seq_k=2048, head_dim=128, causal=True)
    with pytest.raises(ValueError, match="flash_attention"):
        attention_time_s(shape, hw)


def test_flash_op_kind_and_gemm_free_core():
    ops = _ops(_llama3_8b())
    assert ops["attn.flash"].kind is OpKind.ATTENTION and ops["attn.flash.bwd"].attention.backward


@st.composite
def modern_configs(draw):
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    groups = tp * draw(st.integers(1, 4))
    heads = groups * draw(st.integers(1, 4))
    head_dim = draw(st.integers(1, 32))
    hidden = heads * head_dim
    return LayerConfig(
        micro_batch_size=draw(st.integers(1, 4)),
        seq_length=tp * draw(st.integers(1, 64)),
        hidden_size=hidden,
        num_attention_heads=heads,
        ffn_hidden_size=tp * draw(st.integers(1, 64)),
        tp=tp,
        sequence_parallel=tp > 1 and draw(st.booleans()),
        recompute=draw(st.sampled_from(list(Recompute))),
        num_query_groups=groups,
        activation=draw(st.sampled_from(list(Activation))),
        normalization=draw(st.sampled_from(list(Normalization))),
        position_embedding=draw(st.sampled_from(list(PositionEmbedding))),
        attention_backend=draw(st.sampled_from(list(AttentionBackend))),
        hidden_dropout=draw(st.sampled_from([0.0, 0.1])),
        attention_dropout=draw(st.sampled_from([0.0, 0.1])),
        # Megatron --kv-channels: h / a (0) or a head width of its own (Qwen3, gpt-oss)
        kv_channels=draw(st.sampled_from([0, draw(st.integers(1, 48))])),
        qk_layernorm=draw(st.booleans()),
    )


@settings(max_examples=300, deadline=None)
@given(modern_configs())
def test_closed_forms_equal_the_op_graph_for_any_shape(cfg):
    """memory.layer_activation_bytes (docs/memory.md's formulas) == Σ saved bytes of the op graph."""
    expected = layer_activation_bytes(
        cfg.seq_length,
        cfg.micro_batch_size,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.tp,
        cfg.sequence_parallel,
        cfg.recompute,
        ffn=cfg.ffn_hidden_size,
        query_groups=cfg.query_groups,
        activation=cfg.activation,
        flash=cfg.flash,
        hidden_dropout=cfg.hidden_dropout > 0,
        attention_dropout=cfg.attention_dropout > 0,
        rope=cfg.position_embedding is PositionEmbedding.ROPE, kv_channels=cfg.kv_channels or 0,
        qk_layernorm=cfg.qk_layernorm,
    )
    assert layer_ops(cfg).saved_bytes == pytest.approx(expected, rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(modern_configs())
def test_forward_flops_follow_the_widths(cfg):
    """t · Σ forward GEMM FLOPs = 2sb·(h(q + 2k) + qh + h·fc1 + f·h) + unfused core 4bs²q;
    flash counts its causal half, 2bs²q."""
    s, b, h, t = cfg.seq_length, cfg.micro_batch_size, cfg.hidden_size, cfg.tp
    q, k, f = cfg.query_width, cfg.kv_width, cfg.ffn_hidden_size
    linear = 2 * s * b * (h * (q + 2 * k) + q * h + h * cfg.fc1_width + f * h)
    core = (2 if cfg.flash else 4) * b * s * s * q
    assert sum(op.flops for op in layer_ops(cfg).forward) * t == pytest.approx(linear + core, rel=1e-12)


@pytest.mark.parametrize("recompute", list(Recompute))
@pytest.mark.parametrize(("tp", "sp"), [(1, False), (8, False), (8, True)])
def test_closed_form_is_table2_at_the_defaults(recompute, tp, sp):
    args = (2048, 4, 6144, 64, tp, sp, recompute)
    assert layer_activation_bytes(*args) == pytest.approx(table2_bytes_per_layer(*args), rel=1e-12)
