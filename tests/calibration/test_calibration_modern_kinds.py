"""The modern memory-bound kernels (RMSNorm, RoPE, SwiGLU) join the fit: each kind gets a
curve from the records timed in the measurement's own layer mode."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import pytest

from simcluster.calibration.check import compare
from simcluster.calibration.eager_traffic import roofline_points
from simcluster.calibration.fit import MODERN_KINDS, copy_gb_per_s, elementwise_points_by_op, measured_grid
from simcluster.calibration.profile import build_profile
from simcluster.calibration.records import LayerRun, Measurements
from simcluster.config.hardware import parse_hardware

FOLDER = Path(__file__).resolve().parents[2] / "docs" / "calibration" / "h100-2026-11-26-script"
KINDS = set(MODERN_KINDS.values())


@pytest.fixture(scope="module")
def fused() -> Measurements:
    """The script run's microbench: 25 modern kernels, the memory-bound ones fused."""
    return Measurements.from_json((FOLDER / "microbench.json").read_text())


def test_the_fused_file_gives_a_curve_per_modern_kind(fused: Measurements) -> None:
    by_op = elementwise_points_by_op(fused)
    assert KINDS <= set(by_op)
    # GB/s of op-graph bytes: the 176 MB SwiGLU (0.148 ms, 1,264 GB/s) is host-bound, the
    # 705 MB one (3,124 GB/s) is not, so both bins are priced at the device's rate
    assert by_op["swiglu"] == [
        [pytest.approx(1.762e8, rel=1e-3), 3124.0],
        [pytest.approx(7.046e8, rel=1e-3), 3124.0],
    ]
    assert set(measured_grid(fused)["memory_bound_bytes"]) >= KINDS


def test_records_of_the_other_mode_are_left_out(fused: Measurements) -> None:
    """Fused records never price an eager profile (and a fused run's eager ones never a fused
    one): an eager file without eager records prices these kinds at their eager traffic's
    roofline (`eager_traffic`), not from the fused records."""
    as_eager = dataclasses.replace(fused, layer_mode="eager")
    by_op = elementwise_points_by_op(as_eager)
    roofline = roofline_points(copy_gb_per_s(as_eager), set())
    assert {kind: by_op[kind] for kind in KINDS} == {kind: roofline[kind] for kind in KINDS}


def test_the_fused_modern_layers_come_closer(fused: Measurements) -> None:
    """Llama 3 8B fused (t 1, t 2; committed): median |error| 4.4 % -> 2.1 % with SwiGLU and
    RoPE priced by their own fused curves instead of the paper sites' generic one; 4.0 % (fast)
    once their host-bound small records no longer price the device (`device_envelope`); 5.0 %
    with the dropout-0 bias-dropout-add priced as the residual add's fused curve (t 1 +0.5 ->
    −1.1 %, t 2 −7.5 -> −8.9 %); 4.1 % with the query / V copies and the QKV-gradient concat
    the torch layer runs (profiler/layer/transformer.py) priced."""
    profile = parse_hardware(build_profile(fused), "fused.yaml")
    run = LayerRun.from_json((FOLDER / "modern_layers_fused.json").read_text())
    errors = [abs(c.error) for c in compare(run, profile)]
    assert statistics.median(errors) == pytest.approx(0.041, abs=0.003)


def test_a_cpu_microbench_times_the_modern_kinds_and_the_fit_reads_them() -> None:
    """Quick eager CPU run (first kernels only): the modern memory-bound kernels are recorded
    eager and each gets its curve."""
    from simcluster.config.choices import LayerMode
    from simcluster.profiler.bench.microbench import run_calibration

    meas = run_calibration("cpu", quick=True, mode=LayerMode.EAGER, modern=True, limit=2)
    names = {k.name for k in meas.modern if k.kind == "memory_bound"}
    assert names == set(MODERN_KINDS) and all(k.layer_mode == "eager" for k in meas.modern if k.name in names)
    assert KINDS <= set(elementwise_points_by_op(meas))
