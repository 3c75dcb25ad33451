"""The op graph agrees with the paper's closed forms (one source of truth)."""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from simcluster.config.choices import Recompute
from simcluster.workload.layer import layer_ops, saved_activation_bytes
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.memory import table2_bytes_per_layer
from simcluster.workload.ops import CollectiveKind, OpKind


@st.composite
def layer_configs(draw):
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    heads = tp * draw(st.integers(1, 6))
    head_dim = draw(st.integers(1, 48))
    hidden = heads * head_dim
    seq = tp * draw(st.integers(1, 64))
    return LayerConfig(
        micro_batch_size=draw(st.integers(1, 8)),
        seq_length=seq,
        hidden_size=hidden,
        num_attention_heads=heads,
        ffn_hidden_size=4 * hidden,
        tp=tp,
        sequence_parallel=tp > 1 and draw(st.booleans()),
        recompute=draw(st.sampled_from(list(Recompute))),
    )


@settings(max_examples=300, deadline=None)
@given(layer_configs())
def test_saved_bytes_equal_table2_for_any_dimensions(cfg):
    """Σ saved_bytes of the forward ops == Table 2's row for this configuration."""
    expected = table2_bytes_per_layer(
        cfg.seq_length,
        cfg.micro_batch_size,
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.tp,
        cfg.sequence_parallel,
        cfg.recompute,
    )
    assert abs(saved_activation_bytes(cfg) - expected) <= 1e-9 * expected


def test_table2_odd_dimensions_by_hand():
    """h=96, a=3, s=40, b=3, t=1: sbh(34 + 5as/h) = 11520·(34 + 6.25) = 463,680 bytes."""
    cfg = LayerConfig(96, 3, 40, 3, 384)
    assert saved_activation_bytes(cfg) == 463_680


@given(layer_configs())
def test_forward_gemm_flops_match_narayanan(cfg):
    """t · Σ forward GEMM FLOPs per rank = 24·b·s·h² + 4·b·s²·h (Narayanan Eq. 3 per layer)."""
    b, s, h = cfg.micro_batch_size, cfg.seq_length, cfg.hidden_size
    total = sum(op.flops for op in layer_ops(cfg).forward) * cfg.tp
    assert abs(total - (24 * b * s * h * h + 4 * b * s * s * h)) <= 1e-9 * total


@given(layer_configs())
def test_backward_gemm_flops_are_twice_forward(cfg):
    """Input-grad plus weight-grad GEMMs do 2× the forward FLOPs."""
    ops = layer_ops(cfg)
    forward = sum(op.flops for op in ops.forward)
    backward = sum(op.flops for op in ops.backward)
    assert abs(backward - 2 * forward) <= 1e-9 * forward


def test_recompute_reruns_attention_core_or_whole_layer():
    """Selective re-runs 4bs²h/t FLOPs (QKᵀ and ×V); full re-runs the whole forward."""
    cfg = LayerConfig(128, 4, 64, 2, 512, tp=2)
    forward = sum(op.flops for op in layer_ops(cfg).forward)
    selective = layer_ops(replace(cfg, recompute=Recompute.SELECTIVE)).recompute
    full = layer_ops(replace(cfg, recompute=Recompute.FULL)).recompute
    assert sum(op.flops for op in selective) == 4 * 2 * 64**2 * 128 / 2
    assert sum(op.flops for op in full) == forward


def test_sequence_parallel_swaps_all_reduce_for_gather_and_scatter():
    """Without SP: 2 all-reduces forward; with SP: 2 all-gathers + 2 reduce-scatters (Fig. 5)."""

    def kinds(c):
        return sorted(op.collective.value for op in layer_ops(c).forward if op.kind is OpKind.COLLECTIVE)

    cfg = LayerConfig(128, 4, 64, 1, 512, tp=4)
    assert kinds(cfg) == [CollectiveKind.ALL_REDUCE.value] * 2
    assert kinds(replace(cfg, sequence_parallel=True)) == ["all_gather"] * 2 + ["reduce_scatter"] * 2
