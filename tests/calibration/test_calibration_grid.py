"""The grid's attention GEMMs at head dims it lacked, and how a shape between measured head
dims is priced: interpolated within its neighbours' rates, never below them by the tile model."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from simcluster.calibration.check import compare, summarize
from simcluster.calibration.fit import measured_grid
from simcluster.calibration.profile import build_profile
from simcluster.calibration.records import LayerRun, Measurements
from simcluster.calibration.shapes import attention_bmm_shapes, calibration_shapes, held_out_shapes
from simcluster.config.hardware import HardwareProfile, parse_hardware
from simcluster.costs.compute import gemm_placement, measured_gemm_flop_per_s
from simcluster.profiler.bench.microbench import plan_benchmarks
from simcluster.workload.layer import layer_ops
from simcluster.workload.ops import GemmShape

FOLDER = Path(__file__).resolve().parents[2] / "docs" / "calibration" / "h100-2026-11-26-script"


@pytest.fixture(scope="module")
def meas() -> Measurements:
    return Measurements.from_json((FOLDER / "microbench_static_rows.json").read_text())


@pytest.fixture(scope="module")
def fitted(meas: Measurements) -> HardwareProfile:
    return parse_hardware(build_profile(meas), "static.yaml")


@pytest.mark.parametrize(("device", "quick"), [("cuda", False), ("cpu", True), ("cpu", False)])
def test_the_grid_times_the_held_out_head_dims_attention_gemms(device: str, quick: bool) -> None:
    """Every held-out head dim has batched attention GEMMs in the plan, and the shapes added
    for it add nothing but those GEMMs."""
    shapes, extra = calibration_shapes(device, quick), attention_bmm_shapes(device, quick)
    base = plan_benchmarks(shapes)
    plan = plan_benchmarks(shapes, extra)
    added = plan[len(base) :]
    assert [b.key for b in plan[: len(base)]] == [b.key for b in base] and added
    assert all(b.name.startswith("bmm") and b.gemm is not None for b in added)
    bmm_head_dims = {b.dims[-1] for b in plan if b.name.startswith("bmm")}
    assert {s.head_dim for s in held_out_shapes(device, quick)} <= bmm_head_dims


def test_cuda_grid_adds_the_six_bmm_kinds_at_head_dim_96() -> None:
    extra = plan_benchmarks(calibration_shapes("cuda", False), attention_bmm_shapes("cuda", False))[1338:]
    assert {b.name for b in extra} == {
        "bmm_qk", "bmm_av", "bmm_av_dgrad_probs", "bmm_av_dgrad_v", "bmm_qk_dgrad_q", "bmm_qk_dgrad_k",
    }  # fmt: skip
    assert {b.dims[-1] for b in extra} == {96} and len(extra) == 66


def _held_out_bmms() -> set[GemmShape]:
    """The batched attention GEMMs of the cuda held-out layers at head dim 96 (h 6144, a 64)."""
    out = set()
    for shape in held_out_shapes("cuda", False):
        if shape.head_dim != 96:
            continue
        for tp in (1, 2, 4, 8):
            ops = layer_ops(shape.config(tp))
            out |= {op.gemm for op in ops.forward + ops.backward if op.gemm is not None and op.gemm.batch > 1}
    return out


def test_head_dim_96_is_interpolated_within_its_neighbours(fitted: HardwareProfile) -> None:
    """Between measured head dims 64 and 128 (committed grid): each held-out bmm is
    'interpolated', priced within [min, max] of the measured rates around it; before, the tile
    model put the ×V GEMM (n = 96 on 128-wide tiles) at 3/4 of every neighbour."""
    points = fitted.compute.gemm_points
    shapes = _held_out_bmms()
    assert len(shapes) == 12  # 2 GEMM shapes (QKᵀ-like, ×V-like) × 6 batches
    for shape in shapes:
        assert gemm_placement(shape, points) == "interpolated"
    av = GemmShape(2048, 96, 2048, 256)
    neighbours = [p.tflop_per_s for p in points if (p.m, p.n, p.k) == (2048, 128, 2048) and p.batch >= 64]
    assert measured_gemm_flop_per_s(av, fitted) / 1e12 >= 0.99 * min(neighbours)


def test_single_gemms_and_shapes_outside_keep_the_wave_model(fitted: HardwareProfile) -> None:
    points = fitted.compute.gemm_points
    assert gemm_placement(GemmShape(8192, 18432, 6144, 1), points) == "wave_model"
    assert gemm_placement(GemmShape(2048, 2048, 96, 1), points) == "wave_model"  # batch below
    assert gemm_placement(GemmShape(2048, 2048, 10**6, 8), points) == "wave_model"  # k beyond
    exact = points[0]
    assert gemm_placement(GemmShape(exact.m, exact.n, exact.k, exact.batch), points) == "measured"


def test_the_profile_records_the_bmm_head_dims_and_the_rule(meas: Measurements) -> None:
    grid = measured_grid(meas)
    assert grid["attention_bmm_head_dims"] == [64, 128]
    assert "interpolated" in grid["gemm_rule"] and "wave_model" in grid["gemm_rule"]


def test_bounded_interpolation_on_the_fused_check(fitted: HardwareProfile) -> None:
    """The fused layers (committed): GPU-bound median |error| 5.3 % -> 4.9 % with the head dim
    96 GEMMs bounded, 3.3 % with the fused sites' device envelope (`device_envelope`); still
    priced slow (signed median +3.2 %), not hidden."""
    checks = compare(LayerRun.from_json((FOLDER / "layer_timing_fused.json").read_text()), fitted)
    summary = summarize(checks)
    assert summary.gpu_bound_median_abs_error == pytest.approx(0.033, abs=0.002)
    assert statistics.median(c.error for c in checks if not c.host_bound) > 0


def test_the_fused_check_by_group_of_ops(fitted: HardwareProfile) -> None:
    """Least squares of the 39 GPU-bound fused layers on four groups (`kind_ratio`, a
    diagnostic; the groups are collinear): the attention GEMMs' ratio rose from 0.84 to 0.89
    with the bounded head dim 96; the device envelope then moves the memory-bound sites
    outside the attention core from 0.49 to 0.67 (the fused sites' host time no longer
    priced as device time), and the attention GEMMs take up the rest (0.79; the grid has no
    head dim 96 measured yet), the linears 1.07."""
    from simcluster.calibration.kind_ratio import kind_ratios

    ratios = kind_ratios(LayerRun.from_json((FOLDER / "layer_timing_fused.json").read_text()), fitted)
    assert ratios["other_memory_bound"] == pytest.approx(0.672, abs=0.01)
    assert ratios["attention_bmm"] == pytest.approx(0.793, abs=0.01)
    assert ratios["gemm"] == pytest.approx(1.07, abs=0.01)
