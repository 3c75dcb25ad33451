"""Fused attention in calibration: the SDPA benchmark (CPU, tiny shapes) and the fit of the
profile's three flash tables, which must give the measured times back through the model."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from simcluster.calibration.attention_fit import TABLES, flash_tables
from simcluster.calibration.profile import build_profile
from simcluster.calibration.records import AttentionRecord, Measurements
from simcluster.calibration.shapes import FLASH_TABLE_HEAD_DIM, attention_grid
from simcluster.config.hardware import parse_hardware
from simcluster.costs.compute import attention_time_s
from simcluster.profiler.bench.attention import sdpa_backend, time_attention
from simcluster.profiler.bench.kernels import BuildContext
from simcluster.profiler.bench.timing import Timer, TimingPolicy, device_generator
from simcluster.workload.ops import AttentionShape
from tests.calibration.test_calibration_fit import GEMMS, LAUNCH_S, SITES, _measurements

# FlashAttention-3-like rates (TFLOP/s) at three lengths: forward, backward, causal efficiency.
RATES = {512: (500.0, 300.0, 0.6), 2048: (620.0, 460.0, 0.8), 8192: (600.0, 520.0, 0.9)}
HEADS, TOKENS = 16, 16384


def _record(
    s: int, causal: bool, head_dim: int = FLASH_TABLE_HEAD_DIM, scale: float = 1.0
) -> AttentionRecord:
    """The times a device running at RATES would measure (launch + FLOPs / rate per call)."""
    fwd, bwd, efficiency = RATES[s]
    factor = efficiency * scale if causal else 1.0
    flops = 4.0 * (TOKENS // s) * HEADS * s * s * head_dim * (0.5 if causal else 1.0)
    forward_s = LAUNCH_S + flops / (fwd * 1e12 * factor)
    backward_s = LAUNCH_S + 2.5 * flops / (bwd * 1e12 * factor)
    return AttentionRecord(
        TOKENS // s, HEADS, s, head_dim, causal, forward_s, forward_s + backward_s, 0, 0, "Cudnn"
    )


def _shape(record: AttentionRecord, backward: bool) -> AttentionShape:
    r = record
    return AttentionShape(
        r.batch, r.heads, r.heads, r.seq_length, r.seq_length, r.head_dim, r.causal, backward
    )


RECORDS = [_record(s, causal) for s in RATES for causal in (False, True)]


@pytest.fixture(scope="module")
def profile():
    meas = replace(_measurements(GEMMS, SITES), attention=RECORDS)
    return parse_hardware(build_profile(meas), "synthetic.yaml")


def test_the_fit_recovers_the_rates_the_times_were_made_from(profile) -> None:
    """Forward, backward and causal-efficiency tables, sorted by length, are the rates the
    synthetic times were computed from."""
    c = profile.compute
    assert c.has_flash_attention
    assert c.flash_attention_fwd_tflop_per_s == [(s, pytest.approx(r[0], rel=1e-3)) for s, r in RATES.items()]
    assert c.flash_attention_bwd_tflop_per_s == [(s, pytest.approx(r[1], rel=1e-3)) for s, r in RATES.items()]
    assert c.flash_attention_causal_efficiency == [
        (s, pytest.approx(r[2], rel=1e-3)) for s, r in RATES.items()
    ]


@pytest.mark.parametrize(
    "record", RECORDS, ids=lambda r: f"s{r.seq_length}-{'causal' if r.causal else 'full'}"
)
def test_the_model_gives_back_the_measured_times(profile, record: AttentionRecord) -> None:
    """costs.compute prices each measured call at its measured time: the forward alone, and
    forward + backward (a causal call pays the fitted efficiency in both directions)."""
    forward = attention_time_s(_shape(record, backward=False), profile)
    total = forward + attention_time_s(_shape(record, backward=True), profile)
    assert total == pytest.approx(record.total_s, rel=1e-3)
    assert forward == pytest.approx(record.forward_s, rel=1e-3)


def test_flops_are_counted_as_the_model_counts_them() -> None:
    """4·b·h·s²·d forward (half causal), 2.5 × that backward: the same as workload.ops."""
    for record in RECORDS:
        assert record.forward_flops == _shape(record, backward=False).flops
        assert record.backward_flops == _shape(record, backward=True).flops


def test_a_causal_kernel_faster_than_the_full_one_is_capped_at_one() -> None:
    """Noise (tiny CPU shapes) can make the causal rate exceed the full one; the profile's
    rule is ratio <= 1, so the fit caps it and the profile still loads."""
    records = [_record(s, False) for s in RATES] + [_record(s, True, scale=1.5) for s in RATES]
    meas = replace(_measurements(GEMMS, SITES), attention=records)
    hw = parse_hardware(build_profile(meas), "fast-causal.yaml")
    efficiency = dict(hw.compute.flash_attention_causal_efficiency or [])
    assert efficiency[8192] == 1.0 and efficiency[512] == pytest.approx(0.9, rel=1e-3)


def test_a_length_missing_one_mask_gets_no_efficiency_point() -> None:
    """A causal shape skipped (memory) leaves its length out of the efficiency table only."""
    records = [r for r in RECORDS if not (r.causal and r.seq_length == 2048)]
    tables = flash_tables(records, LAUNCH_S)
    assert [s for s, _ in tables[TABLES[0]]] == [512, 2048, 8192]
    assert [s for s, _ in tables[TABLES[2]]] == [512, 8192]


def test_without_attention_records_the_profile_has_no_flash_tables() -> None:
    """Measurements of an older calibrate (no "attention" in the JSON) load and fit as before:
    no flash tables, so flash scenarios stay refused on that profile."""
    meas = _measurements(GEMMS, SITES)
    data = json.loads(meas.to_json())
    del data["attention"]
    older = Measurements.from_json(json.dumps(data))
    assert older.attention == []
    assert not parse_hardware(build_profile(older), "old.yaml").compute.has_flash_attention
    only_causal = replace(meas, attention=[r for r in RECORDS if r.causal])
    assert not parse_hardware(build_profile(only_causal), "causal.yaml").compute.has_flash_attention


def test_other_head_dims_are_reported_not_priced(profile) -> None:
    """Records at the layer's head dim go to calibration:, the tables stay head dim 128's."""
    records = RECORDS + [
        _record(s, causal, head_dim=64, scale=0.5) for s in RATES for causal in (False, True)
    ]
    meas = replace(_measurements(GEMMS, SITES), attention=records)
    hw = parse_hardware(build_profile(meas), "two-dims.yaml")
    assert hw.compute.flash_attention_causal_efficiency == profile.compute.flash_attention_causal_efficiency
    other = hw.calibration["flash_attention_other_head_dims"]["head_dim_64"]
    assert [s for s, _ in other["causal_efficiency"]] == list(RATES)
    assert other["causal_efficiency"][0][1] == pytest.approx(0.3, rel=1e-3)
    assert "flash_attention_other_head_dims" not in profile.calibration


def test_attention_records_survive_json() -> None:
    meas = replace(_measurements(GEMMS, SITES), attention=RECORDS)
    assert Measurements.from_json(meas.to_json()) == meas


# ---------------------------------------------------------------- the benchmark (CPU)


@pytest.fixture(scope="module")
def cpu_records() -> list[AttentionRecord]:
    dev = torch.device("cpu")
    timer = Timer(dev, TimingPolicy.for_device("cpu", quick=True))
    ctx = BuildContext(dev, torch.bfloat16, device_generator(dev, 0))
    return time_attention(timer, ctx, attention_grid("cpu", quick=True, head_dim=32))


def test_the_benchmark_times_every_length_mask_and_head_dim(cpu_records) -> None:
    """One record per (head dim, length, mask) of the quick grid, batch × s fixed, with the
    backend SDPA used and positive times and rates in both directions."""
    grid = attention_grid("cpu", quick=True, head_dim=32)
    assert grid.head_dims == (128, 32)
    assert {(r.head_dim, r.seq_length, r.causal) for r in cpu_records} == {
        (d, s, causal) for d in grid.head_dims for s in grid.seq_lengths for causal in (False, True)
    }
    assert len(cpu_records) == len(grid.head_dims) * len(grid.seq_lengths) * 2
    assert all(r.batch * r.seq_length == grid.tokens and r.heads == grid.heads for r in cpu_records)
    assert all(r.backend and "Backward0" not in r.backend for r in cpu_records)
    tables = flash_tables([r for r in cpu_records if r.head_dim == 128], launch_s=0.0)
    for name in TABLES:
        assert [s for s, _ in tables[name]] == list(grid.seq_lengths)
        assert all(rate > 0 for _, rate in tables[name])


def test_sdpa_backend_names_the_fused_kernel_or_the_math_path() -> None:
    """A fused SDPA output names its kernel; any other autograd node is the unfused path."""
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    assert sdpa_backend(torch.nn.functional.scaled_dot_product_attention(q, q, q)) != ""
    assert sdpa_backend(q @ q.transpose(-1, -2)).startswith("math (")
