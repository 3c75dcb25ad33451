"""The sliding-window flash kernel's price: its band's FLOPs at the measured rates of w + 1
keys (the length each query block walks), and a windowed model's step against the same model
without windows: faster, with the same model FLOPs (Megatron's MFU count has no window)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import parse_scenario
from simcluster.costs.compute import attention_time_s
from simcluster.simulation import run_simulation
from simcluster.workload.ops import AttentionShape
from tests.paths import ROOT

GPT_OSS = ROOT / "scenarios" / "moe" / "gpt-oss-120b-h100.yaml"


def test_window_kernel_is_priced_at_the_rate_of_its_band():
    """H100 profile: w + 1 = 128 keys lies below the measured 512, so the 512-key rates hold
    (forward 514 TFLOP/s × causal 0.633; backward 258 × 0.633); a window as wide as the
    sequence is the causal kernel."""
    hw = load_hardware("h100-sxm5-80gb")
    full = AttentionShape(batch=1, heads=32, kv_heads=4, seq_q=4096, seq_k=4096, head_dim=64, causal=True)
    window = replace(full, window_size=127)
    assert attention_time_s(window, hw) == pytest.approx(hw.kernel_launch_s + window.flops / (514e12 * 0.633))
    back = replace(window, backward=True)
    assert attention_time_s(back, hw) == pytest.approx(hw.kernel_launch_s + back.flops / (258e12 * 0.633))
    assert attention_time_s(replace(full, window_size=4095), hw) == attention_time_s(full, hw)


def test_windows_shorten_the_step_and_keep_the_model_flops():
    data = yaml.safe_load(GPT_OSS.read_text())
    hw = load_hardware("h100-sxm5-80gb")
    windowed = run_simulation(parse_scenario(data, "w.yaml"), hw).result
    data["model"].update(window_size=None, window_attn_skip_freq=None)
    full = run_simulation(parse_scenario(data, "f.yaml"), hw).result
    assert windowed.model_flops == full.model_flops
    assert windowed.iteration_time_s < full.iteration_time_s
    assert windowed.stages == full.stages  # memory: flash keeps the same tensors
