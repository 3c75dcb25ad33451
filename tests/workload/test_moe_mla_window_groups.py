"""Multi-latent attention (parameters, FLOPs against Megatron's MFU count, per-rank GEMMs,
saved bytes), sliding-window attention FLOPs, and the parallel-folding group table."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simcluster.workload.mla import (
    MLAShape,
    core_attention_forward_flops,
    is_window_layer,
    mla_forward_flops,
    mla_rank_gemms,
    mla_saved_bytes,
    window_score_pairs,
)
from simcluster.workload.moe_config import ExpertLayout, MLAConfig
from simcluster.workload.moe_groups import group_spans

DS_MLA = MLAConfig(
    q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128
)
DS = MLAShape(hidden_size=7168, num_attention_heads=128, mla=DS_MLA)


def megatron_mla_forward(b, s, h, n, m):
    """megatron/training/training.py num_floating_point_operations, multi_latent_attention
    branch, transcribed, divided by 3 (forward only): per token 2·(q_term + kv_term + o)
    plus the causal core 2·(n·(qk + rope)/2 + n·v/2) per s² entry."""
    q_term = m.q_lora_rank * (h + n * (m.qk_head_dim + m.qk_pos_emb_head_dim) + 1)
    kv_term = m.kv_lora_rank * (h + n * (m.qk_head_dim + m.v_head_dim) + 1) + h * m.qk_pos_emb_head_dim
    o_term = n * m.v_head_dim * h
    core = 2 * (n * (m.qk_head_dim + m.qk_pos_emb_head_dim) / 2 + n * m.v_head_dim / 2)
    return b * s * 2 * (q_term + kv_term + o_term) + b * s * s * core


def test_deepseek_v3_mla_params_by_hand():
    """q_down 7168·1536, q_up 1536·128·192, kv_down 7168·576, kv_up 512·128·256, proj 128·128·7168."""
    assert (
        DS.linear_weights == 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    )
    assert DS.params == DS.linear_weights + 1536 + 512


def test_mla_flops_are_megatrons_count_less_the_norms():
    """Megatron counts the two latent norms as q_lora + kv_lora 'weights'; we do not."""
    b, s = 2, 4096
    norms = 2 * b * s * (1536 + 512)
    assert mla_forward_flops(DS, b, s) == megatron_mla_forward(b, s, 7168, 128, DS_MLA) - norms


def test_mla_without_q_lora_has_one_query_projection():
    m = MLAConfig(q_lora_rank=None, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128)
    shape = MLAShape(2048, 16, m)
    assert shape.linear_weights == 2048 * 16 * 192 + 2048 * 576 + 512 * 16 * 256 + 16 * 128 * 2048
    gemms = mla_rank_gemms(shape, tokens=4096, tp=2, sequence_parallel=True)
    assert "attn.q_proj" in gemms and "attn.q_down" not in gemms


def test_mla_rank_gemms_sum_to_the_layer_over_tp():
    """Down projections are duplicated on the tp ranks but each runs on s/tp tokens, so the
    tp ranks together do the layer's linear FLOPs once."""
    tokens, tp = 4096, 8
    gemms = mla_rank_gemms(DS, tokens, tp, sequence_parallel=True)
    assert gemms["attn.kv_down"].m == 512 and gemms["attn.kv_up"].n == 16 * 256
    assert sum(g.flops for g in gemms.values()) * tp == 2.0 * tokens * DS.linear_weights


def test_mla_saved_bytes_by_hand():
    """T = 8, tp = 2, SP, bf16: local 4 tokens. input 4·7168·2; q 4·1536·2·2; kv_combined
    4·576·2 + kv norm out 4·512·2; Q, K, V, O 8·64·2·(2·192 + 2·128); LSE 8·64·4."""
    expected = (
        4 * 7168 * 2
        + 4 * 1536 * 4
        + 4 * 576 * 2
        + 4 * 512 * 2
        + 8 * 64 * 2 * (2 * 192 + 2 * 128)
        + 8 * 64 * 4
    )
    assert mla_saved_bytes(DS, tokens=8, tp=2, sequence_parallel=True) == expected
    recomputed = mla_saved_bytes(DS, tokens=8, tp=2, sequence_parallel=True, recompute_up_proj=True)
    # mla_up_proj drops the norms' outputs and Q, K, V, keeps the all-gathered k_pos_emb
    freed = 4 * 1536 * 2 + 4 * 512 * 2 + 8 * 64 * 2 * (2 * 192 + 128) - 8 * 64 * 2
    assert expected - recomputed == freed


def test_window_pairs():
    """s = 1000, w = 127 (128 keys a query): 1000·128 - 128²/2; a window that covers the
    sequence is the causal triangle s²/2; the two agree where they meet."""
    assert window_score_pairs(1000, 127) == 1000 * 128 - 128 * 128 / 2
    assert window_score_pairs(1000, None) == window_score_pairs(1000, 5000) == 500_000
    assert window_score_pairs(1000, 999) == 500_000


@given(s=st.integers(2, 1 << 17), w=st.integers(0, 1 << 17))
def test_window_never_costs_more_than_causal(s, w):
    assert 0 < window_score_pairs(s, w) <= window_score_pairs(s, None)


def test_core_flops_match_the_flash_causal_convention():
    """No window, qk = v = d: 4·b·n·(s²/2)·d, ops.AttentionShape's causal forward."""
    assert core_attention_forward_flops(2, 1024, 8, 64, 64, None) == 4 * 2 * 8 * (1024 * 1024 / 2) * 64


def test_gpt_oss_alternates_window_and_full_layers():
    """window_attn_skip_freq = 2: layer 1 window, layer 2 full, ... (1-based, utils.py)."""
    assert [is_window_layer(n, 128, 2) for n in range(1, 7)] == [True, False] * 3
    assert is_window_layer(5, 128, None) and not is_window_layer(5, None, 2)
    # gpt-oss-120b at s = 4096: a window layer does (4096·128 - 128²/2)/(4096²/2) = 0.0615 of
    # a full layer's core work
    window = core_attention_forward_flops(1, 4096, 64, 64, 64, 127)
    full = core_attention_forward_flops(1, 4096, 64, 64, 64, None)
    assert math.isclose(window / full, (4096 * 128 - 128 * 128 / 2) / (4096 * 4096 / 2), rel_tol=1e-15)
    assert round(window / full, 4) == 0.0615


def spans(layout, domain):
    return {g.name: g for g in group_spans(layout, domain)}


def test_dgx_h100_groups():
    """8 GPUs a node, tp = 8, dp = 32, ep = 32, etp = 1: tp and etp stay in a node; ep (32
    consecutive ranks) spans 4 nodes; edp = 8, stride 32, spans 8; dp spans 32."""
    table = spans(ExpertLayout(tp=8, cp=1, dp=32, ep=32, etp=1), 8)
    assert [(table[n].size, table[n].max_domains) for n in ("tp", "etp", "ep", "edp", "dp")] == [
        (8, 1),
        (1, 1),
        (32, 4),
        (8, 8),
        (32, 32),
    ]
    assert not table["tp"].crosses_domain and table["ep"].crosses_domain
    assert table["ep"].max_remote_peer_fraction == pytest.approx(24 / 31)


def test_nvl72_keeps_ep64_in_one_domain_only_when_aligned():
    """GB200 NVL72, tp = 1, dp = 576, ep = 64: groups of 64 consecutive ranks; 72 is not a
    multiple of 64, so some EP groups straddle two NVLink domains; ep = 72 never does."""
    ep64 = spans(ExpertLayout(tp=1, cp=1, dp=576, ep=64), 72)["ep"]
    assert (ep64.min_domains, ep64.max_domains) == (1, 2)
    ep72 = spans(ExpertLayout(tp=1, cp=1, dp=576, ep=72), 72)["ep"]
    assert ep72.max_domains == 1 and ep72.max_remote_peer_fraction == 0


def test_folding_strides():
    """etp = 2, ep = 4: ep stride 2, edp stride 8, etp_ep 8 consecutive; dp_cp stride tp."""
    table = spans(ExpertLayout(tp=4, cp=2, dp=4, ep=4, etp=2), 8)
    assert (table["ep"].stride, table["edp"].stride, table["etp_ep"].size) == (2, 8, 8)
    assert (table["dp_cp"].size, table["dp_cp"].stride, table["edp"].size) == (8, 4, 4)
    with pytest.raises(ValueError, match="domain_size=0"):
        group_spans(ExpertLayout(tp=1, cp=1, dp=2), 0)
