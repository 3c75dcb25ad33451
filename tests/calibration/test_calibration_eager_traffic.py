"""The eager modern regions priced by the bytes their kernels move (`calibration.eager_traffic`):
the table is what tracing the eager layer's regions gives, only eager GPU profiles without a
measured curve use it, and the committed eager modern layers come within 10 %."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import pytest

from simcluster.calibration.check import compare
from simcluster.calibration.eager_traffic import EAGER_TRAFFIC, roofline_points
from simcluster.calibration.extra_kernels import with_extra_kernels
from simcluster.calibration.fit import copy_gb_per_s, elementwise_points_by_op
from simcluster.calibration.profile import build_profile
from simcluster.calibration.records import LayerRun, Measurements
from simcluster.config.hardware import HardwareProfile, parse_hardware

FOLDER = Path(__file__).resolve().parents[2] / "docs" / "calibration" / "h100-2026-11-26"


def test_the_table_is_what_the_eager_regions_launch() -> None:
    """`python -m simcluster.profiler.layer.eager_traffic` traces regions.EAGER_MATH at Llama 3
    8B's shapes: the fp32 RMSNorm backward is 14 kernels, the SwiGLU backward 13 (its forward
    2: silu and a product on the halves), the dropout-0 bias add 2 forward, 1 backward."""
    from simcluster.profiler.layer.eager_traffic import region_traffic

    regions = {r.kind: r for r in region_traffic()}
    assert {kind: round(r.ratio, 2) for kind, r in regions.items()} == EAGER_TRAFFIC
    assert {kind: r.kernels for kind, r in regions.items()} == {
        "rmsnorm": 10,
        "rmsnorm.bwd": 14,
        "rope": 10,  # q and k: 5 each (two products, neg, cat, add)
        "rope.bwd": 10,
        "swiglu": 2,
        "swiglu.bwd": 13,
        "bias_add": 2,  # dropout 0: x + bias, residual + that
        "bias_add.bwd": 1,  # the adds pass the gradient; the bias's sum
    }


def test_only_an_eager_gpu_profile_without_the_kind_takes_the_roofline(eager: Measurements) -> None:
    by_op = elementwise_points_by_op(eager)
    copy = copy_gb_per_s(eager)
    assert by_op["swiglu.bwd"] == [[1e6, round(copy / 14.2, 1)], [1e11, round(copy / 14.2, 1)]]
    assert set(EAGER_TRAFFIC) <= set(by_op)
    cpu = dataclasses.replace(eager, device=dataclasses.replace(eager.device, device_type="cpu"))
    assert not set(EAGER_TRAFFIC) & set(elementwise_points_by_op(cpu))
    fused = dataclasses.replace(eager, layer_mode="fused")
    assert not set(EAGER_TRAFFIC) & set(elementwise_points_by_op(fused))
    assert roofline_points(copy, set(EAGER_TRAFFIC)) == {}


def test_the_forwards_measured_eager_stay_below_their_roofline(eager: Measurements) -> None:
    """A roofline is a bound: the eager forwards measured on the same GPU (measure2.py) run at
    or below it (RMSNorm 94 % of it, RoPE 64 %, SwiGLU 56 %: strided halves)."""
    text = (FOLDER / "elementwise_host_optimizer.json").read_text()
    measured = elementwise_points_by_op(with_extra_kernels(eager, text, "measure2")[0])
    roofline = roofline_points(copy_gb_per_s(eager), set())
    for kind in ("rmsnorm", "rope", "swiglu"):
        assert measured[kind][0][1] <= roofline[kind][0][1]
    assert measured["rmsnorm"][0][1] >= 0.9 * roofline["rmsnorm"][0][1]


@pytest.mark.parametrize("extra", [False, True])
def test_the_twelve_eager_modern_layers_within_ten_percent(eager: Measurements, extra: bool) -> None:
    """measure.py's 12 eager layers (Llama 3 8B / 70B, GPT-3 175B flash and paper, t 1-8):
    the Llama 3 rows were 11-23 % fast before (the eager backwards priced as fused kernels);
    now every one is within 10 %, with or without the measured eager forwards."""
    meas = (
        with_extra_kernels(eager, (FOLDER / "elementwise_host_optimizer.json").read_text(), "m2")[0]
        if extra
        else eager
    )
    profile: HardwareProfile = parse_hardware(build_profile(meas), "eager.yaml")
    run = LayerRun.from_json((FOLDER / "modern_layer_timing.json").read_text())
    checks = [c for c in compare(run, profile) if c.timing.layer_mode == "eager"][:12]
    assert len(checks) == 12
    assert max(abs(c.error) for c in checks) <= 0.10
    assert statistics.median(abs(c.error) for c in checks) <= 0.05
