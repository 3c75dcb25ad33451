"""Sliding-window attention (Megatron --window-size (w, 0), --window-attn-skip-freq N): which
layers have a window (Megatron-core `is_layer_window_attention`), the chunk's segments in layer
order, the window kernel's FLOPs from the visible pairs, memory unchanged, and MFU counting
every layer as full attention as Megatron's `num_floating_point_operations` does."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from simcluster.config.scenario import load_scenario, parse_scenario
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.mla import is_window_layer, window_score_pairs
from simcluster.workload.model import build_workload
from simcluster.workload.moe_params import param_counts
from simcluster.workload.ops import AttentionShape, Module, OpKind, Pass
from tests.paths import ROOT
from tests.workload.test_moe_public_models import GPT_OSS_120B

GPT_OSS = ROOT / "scenarios" / "moe" / "gpt-oss-120b-h100.yaml"


def _gpt_oss(**changes):
    data = yaml.safe_load(GPT_OSS.read_text())
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        data[section][key] = value
    return parse_scenario(data, "s.yaml")


@pytest.mark.parametrize(("s", "w"), [(4096, 127), (4096, 4095), (4096, 5000), (1024, 1), (64, 62)])
def test_window_fraction_is_the_visible_pairs(s, w):
    """AttentionShape's band over s² is `window_score_pairs`, the causal half once w + 1 >= s."""
    shape = AttentionShape(
        batch=1, heads=1, kv_heads=1, seq_q=s, seq_k=s, head_dim=64, causal=True, window_size=w
    )
    assert shape.visible_fraction * s * s == pytest.approx(window_score_pairs(s, w), rel=1e-12)
    assert shape.keys_walked == min(s, w + 1)
    full = replace(shape, window_size=None)
    assert shape.forward_flops <= full.forward_flops


def test_window_needs_a_local_causal_call():
    with pytest.raises(ValueError, match="window_size=127 needs a causal call"):
        AttentionShape(
            batch=1, heads=1, kv_heads=1, seq_q=64, seq_k=128, head_dim=64, causal=True, window_size=127
        )


def test_window_layer_flash_flops_by_hand_and_memory_unchanged():
    """s 4096, b 2, 8 heads of 64 on t = 2 (4 a rank), w 127: forward 4·b·(a/t)·d·pairs with
    pairs = 4096·128 - 128²/2; backward 2.5 ×; saved bytes those of the full layer (flash keeps
    Q, K, V, O and the LSE either way)."""
    full = LayerConfig(
        hidden_size=512, num_attention_heads=8, kv_channels=64, seq_length=4096, micro_batch_size=2, tp=2,
        attention_backend="flash",
    )  # fmt: skip
    window = replace(full, window_size=127)
    fwd = next(op for op in layer_ops(window).forward if op.kind is OpKind.ATTENTION)
    pairs = 4096 * 128 - 128 * 128 / 2
    assert fwd.flops == pytest.approx(4 * 2 * 4 * 64 * pairs, rel=1e-12)
    bwd = next(op for op in layer_ops(window).backward if op.kind is OpKind.ATTENTION)
    assert bwd.flops == pytest.approx(2.5 * fwd.flops, rel=1e-12)
    assert layer_ops(window).saved_bytes == layer_ops(full).saved_bytes
    # at s = 4096, w = 127 a window layer does 6.15 % of a full layer's core work
    full_fwd = next(op for op in layer_ops(full).forward if op.kind is OpKind.ATTENTION)
    assert fwd.flops / full_fwd.flops == pytest.approx(0.0615, abs=5e-5)


def test_unfused_core_computes_every_score_and_masks():
    """Megatron's unfused DotProductAttention runs the full s² baddbmm and masks the window
    in FusedScaleMaskSoftmax: its ops are the full layer's."""
    full = LayerConfig(hidden_size=256, num_attention_heads=4, seq_length=512, micro_batch_size=1)
    assert layer_ops(replace(full, window_size=31)).forward == layer_ops(full).forward


def test_gpt_oss_segments_follow_the_layers_in_order():
    """36 layers on pp 4: stage 0 holds layers 1-9 (w, f, w, ..., w), stage 1 layers 10-18
    starting with a full layer; two kinds in all (window and full MoE layers), built once."""
    scenario = load_scenario(GPT_OSS)
    workload = build_workload(scenario)
    kinds = set()
    for stage in workload.stages:
        (chunk,) = stage.chunks
        first = 9 * stage.stage + 1
        windows = [seg.kind.config.window_size for seg in chunk.segments for _ in range(seg.num_layers)]
        assert windows == [127 if is_window_layer(n, 127, 2) else None for n in range(first, first + 9)]
        assert all(seg.num_layers == 1 for seg in chunk.segments)  # they alternate
        assert all(seg.kind.moe is not None for seg in chunk.segments)
        kinds |= {id(seg.kind) for seg in chunk.segments}
    assert len(kinds) == 2
    assert workload.layer_kind is not None and workload.layer_kind.config.window_size is None  # layer 36


def test_no_skip_frequency_windows_every_layer():
    scenario = _gpt_oss(**{"model.window_attn_skip_freq": None})
    workload = build_workload(scenario)
    for stage in workload.stages:
        ((segment),) = stage.chunks[0].segments
        assert segment.num_layers == 9 and segment.kind.config.window_size == 127


def test_a_model_without_windows_keeps_one_segment_per_kind():
    scenario = _gpt_oss(**{"model.window_size": None, "model.window_attn_skip_freq": None})
    for stage in build_workload(scenario).stages:
        ((segment),) = stage.chunks[0].segments
        assert segment.num_layers == 9 and segment.kind.config.window_size is None


def test_windows_cut_the_attention_flops_of_half_the_layers():
    """Per stage, the forward attention FLOPs are 5 window + 4 full layers (stage 0), the
    layer kinds' own counts: no other op changes."""
    with_window = build_workload(load_scenario(GPT_OSS))
    without = build_workload(_gpt_oss(**{"model.window_size": None, "model.window_attn_skip_freq": None}))

    def flops(workload, module_filter):
        (chunk,) = workload.stages[0].chunks
        return sum(
            seg.num_layers * op.flops
            for seg in chunk.segments
            for op in seg.layer.forward
            if module_filter(op.module) and op.pass_ is Pass.FORWARD
        )

    assert flops(with_window, lambda m: m is not Module.FLASH) == flops(
        without, lambda m: m is not Module.FLASH
    )
    full_layer = flops(without, lambda m: m is Module.FLASH) / 9
    ratio = window_score_pairs(4096, 127) / (4096 * 4096 / 2)
    assert flops(with_window, lambda m: m is Module.FLASH) == pytest.approx(
        full_layer * (4 + 5 * ratio), rel=1e-12
    )


def test_gpt_oss_parameters_are_the_published_count_less_what_is_not_modelled():
    """One rank holds all 36 layers: 116.83B (test_moe_public_models.py, from the HF config)
    less the attention sinks (64 a layer), which the scenario contract does not express; the
    experts' biases (128·(2·2880 + 2880) a layer) and the router bias (128 a layer) are the
    file's model.moe.expert_bias and router_bias."""
    scenario = _gpt_oss(**{"parallel.tp": 1, "parallel.pp": 1, "parallel.dp": 1, "parallel.ep": 1,
                           "parallel.sequence_parallel": False})  # fmt: skip
    (stage,) = build_workload(scenario).stages
    not_modelled = 36 * 64
    assert stage.num_params == param_counts(GPT_OSS_120B).total - not_modelled
