"""The one description of a layer: defaults, derived facts, and the shape rules it shares
with the scenario validator (`config.layer_shape`)."""

import pytest

from simcluster.config.choices import Dtype
from simcluster.config.layer_shape import indivisible_sizes
from simcluster.workload.layer_config import LayerConfig


def test_derived_facts_of_the_22b_layer():
    """h 6144, a 64, s 2048, b 4 on t = 8 with SP: d = 96, 8 heads and 256 rows per rank, f = 4h."""
    cfg = LayerConfig(6144, 64, 2048, 4, tp=8, sequence_parallel=True, dtype=Dtype.FP32)
    assert (cfg.head_dim, cfg.heads_per_rank, cfg.local_seq_length) == (96, 8, 256)
    assert (cfg.ffn_hidden_size, cfg.tokens, cfg.element_bytes) == (4 * 6144, 8192, 4)


@pytest.mark.parametrize(
    ("sizes", "field"),
    [
        ({"hidden_size": 100, "num_attention_heads": 8}, "hidden_size"),
        ({"hidden_size": 96, "num_attention_heads": 6, "tp": 4}, "num_attention_heads"),
        ({"ffn_hidden_size": 1002, "tp": 4}, "ffn_hidden_size"),
        ({"seq_length": 30, "tp": 4, "sequence_parallel": True}, "seq_length"),
    ],
)
def test_each_broken_rule_is_named_once_and_rejected(sizes, field):
    """A broken divisibility rule is reported for that field alone, and LayerConfig refuses it."""
    shape = {
        "hidden_size": 128,
        "num_attention_heads": 8,
        "seq_length": 32,
        "micro_batch_size": 1,
        "ffn_hidden_size": 512,
        "tp": 1,
        "sequence_parallel": False,
        **sizes,
    }
    rule_args = {k: v for k, v in shape.items() if k != "micro_batch_size"}
    assert [bad.field for bad in indivisible_sizes(**rule_args)] == [field]
    with pytest.raises(ValueError, match=f"LayerConfig.{field}="):
        LayerConfig(**shape)


def test_modern_options_default_to_the_paper_layer():
    """No GQA (g = a), GeLU, LayerNorm, learned positions, unfused attention: QKV is 3h, fc1 is f."""
    cfg = LayerConfig(6144, 64, 2048, 4, tp=8)
    assert cfg.query_groups == cfg.num_query_groups == 64
    widths = (cfg.kv_heads_per_rank, cfg.kv_width, cfg.qkv_width, cfg.fc1_width)
    assert widths == (8, 6144, 3 * 6144, 4 * 6144)
    assert LayerConfig(6144, 64, 2048, 4, tp=8, num_query_groups=None) == cfg


def test_llama3_8b_gqa_and_swiglu_widths():
    """Llama 3 8B: h 4096, a 32, g 8, f 14336, d_h 128: q 4096 + 2·k 1024 = 6144; fc1 2·14336."""
    cfg = LayerConfig(4096, 32, 8192, 1, 14336, tp=8, num_query_groups=8, activation="swiglu")
    assert (cfg.kv_channels, cfg.query_width, cfg.kv_width, cfg.qkv_width) == (128, 4096, 1024, 6144)
    assert (cfg.kv_heads_per_rank, cfg.fc1_width) == (1, 28672)


@pytest.mark.parametrize(("groups", "tp", "message"), [(3, 1, "num_attention_heads=40"), (4, 8, "tp=8")])
def test_query_groups_rules_of_megatron_core(groups, tp, message):
    """g must divide a, and t must divide g (Megatron-core asserts; KV heads are never replicated)."""
    with pytest.raises(ValueError, match=message):
        LayerConfig(1280, 40 if groups == 3 else 32, 64, 1, tp=tp, num_query_groups=groups)
