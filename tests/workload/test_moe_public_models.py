"""Parameter counts of five public MoE models against the totals and active counts their
publishers state, within the rounding of the stated figure (half a unit of its last digit).

Configs are the models' Hugging Face config.json files (fields named in each comment):
- DeepSeek-V3: huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json; 671B total,
  37B activated (arXiv 2412.19437, abstract); the checkpoint is 685B with the 14B
  multi-token-prediction module, which carries its own embedding and output head
  (README "Model Weights" of the same repository).
- Qwen3-235B-A22B, Qwen3-30B-A3B: huggingface.co/Qwen/<name>/blob/main/config.json;
  "235B in total and 22B activated", "30.5B in total and 3.3B activated" (the model cards).
- Mixtral 8x7B: huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json; 46.7B
  total, 12.9B per token (mistral.ai/news/mixtral-of-experts; arXiv 2401.04088 §2).
- gpt-oss-120b: huggingface.co/openai/gpt-oss-120b/blob/main/config.json; 116.83B total,
  5.13B active (gpt-oss model card, arXiv 2508.10925, Table 1).

Publishers count "active" two ways (docs/moe.md): Mixtral and Qwen3 include both embedding
matrices; DeepSeek-V3 and gpt-oss leave out the input embedding (a lookup). Each test
names the one it follows, and the other one misses the stated figure, which the tests
also check, so a convention cannot be picked to pass.
"""

import dataclasses

import pytest

from simcluster.workload.moe_config import MLAConfig, MoEConfig
from simcluster.workload.moe_params import MoEModelShape, mtp_extra_forward_flops, param_counts

B = 1e9

# DeepSeek-V3: num_hidden_layers 61, first_k_dense_replace 3, n_routed_experts 256,
# num_experts_per_tok 8, n_shared_experts 1, hidden_size 7168, moe_intermediate_size 2048,
# intermediate_size 18432, num_attention_heads 128, q_lora_rank 1536, kv_lora_rank 512,
# qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, vocab_size 129280,
# n_group 8, topk_group 4, scoring_func sigmoid, num_nextn_predict_layers 1, untied.
DEEPSEEK_V3 = MoEModelShape(
    num_layers=61,
    hidden_size=7168,
    vocab_size=129280,
    num_attention_heads=128,
    ffn_hidden_size=18432,
    moe=MoEConfig(
        num_experts=256,
        router_topk=8,
        ffn_hidden_size=2048,
        shared_expert_ffn_hidden_size=2048,
        first_k_dense_layers=3,
        router_score="sigmoid",
        router_num_groups=8,
        router_group_topk=4,
    ),
    mla=MLAConfig(
        q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128
    ),
)
# Qwen3-235B-A22B: num_hidden_layers 94, hidden_size 4096, num_attention_heads 64,
# num_key_value_heads 4, head_dim 128, num_experts 128, num_experts_per_tok 8,
# moe_intermediate_size 1536, vocab_size 151936, tie_word_embeddings false, QK-norm.
QWEN3_235B = MoEModelShape(
    num_layers=94,
    hidden_size=4096,
    vocab_size=151936,
    num_attention_heads=64,
    ffn_hidden_size=12288,
    moe=MoEConfig(num_experts=128, router_topk=8, ffn_hidden_size=1536),
    num_query_groups=4,
    kv_channels=128,
    qk_layernorm=True,
)
# Qwen3-30B-A3B: 48 layers, hidden 2048, 32 heads, 4 KV heads, head_dim 128, 128 experts
# top-8, moe_intermediate_size 768, vocab 151936, untied, QK-norm.
QWEN3_30B = dataclasses.replace(
    QWEN3_235B,
    num_layers=48,
    hidden_size=2048,
    num_attention_heads=32,
    ffn_hidden_size=6144,
    moe=MoEConfig(num_experts=128, router_topk=8, ffn_hidden_size=768),
)
# Mixtral-8x7B: 32 layers, hidden 4096, 32 heads, 8 KV heads (head 128), 8 experts top-2,
# intermediate_size 14336, vocab 32000, untied.
MIXTRAL = MoEModelShape(
    num_layers=32,
    hidden_size=4096,
    vocab_size=32000,
    num_attention_heads=32,
    ffn_hidden_size=14336,
    moe=MoEConfig(num_experts=8, router_topk=2, ffn_hidden_size=14336),
    num_query_groups=8,
)
# gpt-oss-120b: 36 layers, hidden 2880, 64 heads, 8 KV heads, head_dim 64, 128 experts
# top-4, intermediate_size 2880, vocab 201088, attention_bias true (and expert and router
# biases, per-head sinks in the weights), sliding_window 128 on alternate layers, untied.
GPT_OSS_120B = MoEModelShape(
    num_layers=36,
    hidden_size=2880,
    vocab_size=201088,
    num_attention_heads=64,
    ffn_hidden_size=2880,
    moe=MoEConfig(num_experts=128, router_topk=4, ffn_hidden_size=2880, router_bias=True),
    num_query_groups=8,
    kv_channels=64,
    attention_bias=True,
    attention_sinks=True,
    expert_bias=True,
)


def within_rounding(value: float, stated: float, last_digit: float) -> bool:
    """`value` rounds to `stated` at the stated precision (half a unit of the last digit)."""
    return abs(value - stated) <= last_digit / 2


def within_truncation(value: float, stated: float, last_digit: float) -> bool:
    """`value` cut to the stated precision is `stated` (the Qwen3 cards cut: 3.35B -> "3.3B")."""
    return stated <= value < stated + last_digit


def test_deepseek_v3_671b_total_37b_active():
    """671B main model; 37B active without the input embedding (36.6B); with it 37.6B, off."""
    counts = param_counts(DEEPSEEK_V3)
    assert within_rounding(counts.total / B, 671, 1)
    assert within_rounding(counts.active_without_embedding / B, 37, 1)
    assert not within_rounding(counts.active / B, 37, 1)


def test_deepseek_v3_mtp_layer():
    """One MTP layer adds enorm, hnorm, final norm (3h), eh_proj (2h·h) and a MoE decoder
    layer (MLA, two norms, the MoE block) and nothing else: embedding and head are shared.
    (With the MTP module's own stored copies of them this gives 684.5B for the checkpoint
    the DeepSeek-V3 README calls 685B.)"""
    h = 7168
    main, with_mtp = (
        param_counts(DEEPSEEK_V3),
        param_counts(dataclasses.replace(DEEPSEEK_V3, mtp_num_layers=1)),
    )
    moe_block = 256 * 3 * h * 2048 + 3 * h * 2048 + 256 * h
    mla = h * 1536 + 1536 * 128 * 192 + h * 576 + 512 * 128 * 256 + 128 * 128 * h + 1536 + 512
    assert with_mtp.moe_total - main.moe_total == moe_block
    assert with_mtp.total - main.total == 3 * h + 2 * h * h + mla + 2 * h + moe_block
    assert with_mtp.active - main.active == 3 * h + 2 * h * h + mla + 2 * h + moe_block - 248 * 3 * h * 2048


def test_qwen3_235b_a22b():
    """235.1B / 22.2B (with both embeddings; 21.6B without the input one, off)."""
    counts = param_counts(QWEN3_235B)
    assert within_truncation(counts.total / B, 235, 1)
    assert within_truncation(counts.active / B, 22, 1)
    assert not within_truncation(counts.active_without_embedding / B, 22, 1)


def test_qwen3_30b_a3b():
    """30.53B / 3.353B (with both embeddings; 3.04B without the input one, off). The card's
    "3.3B" is 3.353B cut, not rounded, so both Qwen3 tests read the cards as cut."""
    counts = param_counts(QWEN3_30B)
    assert within_truncation(counts.total / B, 30.5, 0.1)
    assert within_truncation(counts.active / B, 3.3, 0.1)
    assert not within_truncation(counts.active_without_embedding / B, 3.3, 0.1)


def test_mixtral_8x7b():
    """46.7B / 12.9B (with both embeddings; 12.75B without the input one, off)."""
    counts = param_counts(MIXTRAL)
    assert within_rounding(counts.total / B, 46.7, 0.1)
    assert within_rounding(counts.active / B, 12.9, 0.1)
    assert not within_rounding(counts.active_without_embedding / B, 12.9, 0.1)


def test_gpt_oss_120b():
    """116.83B / 5.13B (without the input embedding; 5.71B with it, off)."""
    counts = param_counts(GPT_OSS_120B)
    assert within_rounding(counts.total / B, 116.83, 0.01)
    assert within_rounding(counts.active_without_embedding / B, 5.13, 0.01)
    assert not within_rounding(counts.active / B, 5.13, 0.01)


def test_a_dense_model_has_no_moe_part():
    """moe=None: every layer's MLP is dense and active equals total."""
    dense = dataclasses.replace(MIXTRAL, moe=None)
    counts = param_counts(dense)
    assert counts.moe_total == 0 and counts.active == counts.total
    assert counts.dense_mlp == 32 * 3 * 4096 * 14336


@pytest.mark.parametrize("model", [DEEPSEEK_V3, QWEN3_235B, QWEN3_30B, MIXTRAL, GPT_OSS_120B])
def test_active_is_total_less_the_idle_experts(model):
    """total - active = MoE layers x (E - k) x one expert's parameters."""
    counts = param_counts(model)
    moe = model.moe
    assert moe is not None
    glu = 3 if model.gated else 2
    one = glu * model.hidden_size * moe.ffn_hidden_size
    if model.expert_bias:
        one += 2 * moe.ffn_hidden_size + model.hidden_size
    idle = moe.num_moe_layers(model.num_layers) * (moe.num_experts - moe.router_topk) * one
    assert counts.total - counts.active == idle


def test_mtp_flops_are_megatrons_less_the_norms():
    """training.py per token and MTP layer, forward: 2·(3h + 2h²) + 2·h·V; ours leaves out 2·3h."""
    tokens, h, v = 4096, 7168, 129280
    megatron = tokens * (2 * (3 * h + 2 * h * h) + 2 * h * v)
    assert mtp_extra_forward_flops(tokens, h, v) == megatron - tokens * 2 * 3 * h
