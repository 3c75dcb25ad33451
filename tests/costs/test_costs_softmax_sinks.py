"""`model.softmax_type` (Megatron --softmax-type; gpt-oss's learned attention sinks): TE runs
a non-vanilla softmax in cuDNN's fused attention only, priced at the head dim's cuDNN rate
(the H100 profile's ratios from the FlashAttention-3 paper's cuDNN bars, head dim 64 over
128); the vanilla softmax keeps the head-dim-128 rates, as before the key existed."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from simcluster.config.choices import SoftmaxType
from simcluster.config.errors import ConfigError
from simcluster.config.hardware import load_hardware
from simcluster.config.megatron_export import to_megatron_args
from simcluster.config.megatron_import import parse_megatron_args
from simcluster.config.scenario import parse_scenario
from simcluster.costs.compute import flash_attention_flop_per_s
from simcluster.workload.ops import AttentionShape
from tests.paths import ROOT

GPT_OSS = ROOT / "scenarios" / "moe" / "gpt-oss-120b-h100.yaml"
HW = load_hardware("h100-sxm5-80gb")
SHAPE = AttentionShape(batch=1, heads=32, kv_heads=4, seq_q=4096, seq_k=4096, head_dim=64, causal=True)
SINKS = replace(SHAPE, softmax_type=SoftmaxType.LEARNABLE)


def _rate(shape):
    return flash_attention_flop_per_s(shape, HW)


def test_vanilla_softmax_keeps_the_head_dim_128_rates():
    assert _rate(SHAPE) == _rate(replace(SHAPE, head_dim=128))


@pytest.mark.parametrize(
    ("changes", "published"),
    [
        ({}, 363 / 518),  # causal forward, FA3 Fig. 5b / 5d at 4k
        ({"causal": False}, 408 / 609),  # forward, Fig. 5a / 5c
        ({"backward": True}, 417 / 499),  # backward, Fig. 6
    ],
)
def test_sinks_run_at_cudnns_head_dim_64_rate(changes, published):
    """At 4,096 keys the rate is the head-dim-128 rate times cuDNN's hd64 / hd128 at 4k."""
    vanilla, sinks = replace(SHAPE, **changes), replace(SINKS, **changes)
    assert _rate(sinks) / _rate(vanilla) == pytest.approx(published, abs=5e-4)


def test_window_reads_the_ratio_at_its_band():
    """A 128-key window reads the table at its w + 1 keys: the 128 row, cuDNN's measured window
    forward on an H200 (125.8 TFLOP/s) over the 512-key causal rate (514 × 0.633); the
    backward repeats the 512 row (FA3 Fig. 6, 266 / 305)."""
    window = replace(SINKS, window_size=127)
    assert _rate(window) / _rate(replace(window, softmax_type=SoftmaxType.VANILLA)) == pytest.approx(
        0.387, abs=5e-4
    )
    assert _rate(window) == pytest.approx(125.8e12, rel=0.002)
    backward = replace(window, backward=True)
    assert _rate(backward) / _rate(replace(backward, softmax_type=SoftmaxType.VANILLA)) == pytest.approx(
        266 / 305, abs=5e-4
    )


def test_a_head_dim_without_a_row_keeps_its_rate():
    assert _rate(replace(SINKS, head_dim=128)) == _rate(replace(SHAPE, head_dim=128))
    assert _rate(replace(SINKS, head_dim=96)) == _rate(replace(SHAPE, head_dim=96))


def _data():
    return yaml.safe_load(GPT_OSS.read_text())


@pytest.mark.parametrize("training", [{"attention_backend": "unfused"}, {"attention_kernel": "flash_attn_2"}])
def test_sinks_need_tes_cudnn_attention(training):
    data = _data()
    data["training"].update(training)
    with pytest.raises(ConfigError, match="model.softmax_type: value learnable"):
        parse_scenario(data, "s.yaml")


def test_softmax_type_round_trips_through_megatron_flags():
    scenario = parse_scenario(_data(), "s.yaml")
    line = to_megatron_args(scenario, 8)
    assert "--softmax-type learnable" in line
    back = parse_megatron_args(line, scenario.hardware, scenario.name).requested["model"]
    assert back["softmax_type"] == "learnable"
    data = _data()
    data["model"].pop("softmax_type")
    assert "--softmax-type" not in to_megatron_args(parse_scenario(data, "v.yaml"), 8)
