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
    shape = {"hidden_size": 128, "num_attention_heads": 8, "seq_length": 32, "micro_batch_size": 1,
             "ffn_hidden_size": 512, "tp": 1, "sequence_parallel": False, **sizes}
    rule_args = {k: v for k, v in shape.items() if k != "micro_batch_size"}
    assert [bad.field for bad in indivisible_sizes(**rule_args)] == [field]
    with pytest.raises(ValueError, match=f"LayerConfig.{field}="):
        LayerConfig(**shape)
