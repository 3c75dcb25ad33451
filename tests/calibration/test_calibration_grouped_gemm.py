"""The grouped expert GEMMs' grid and fit (`calibration.grouped_shapes`, `grouped_fit`): the
grid spans the shipped MoE scenarios' expert GEMMs, the fit reproduces a synthetic curve
at every measured shape and between them, and the profile says what was measured."""

from __future__ import annotations

import dataclasses
import json
from typing import get_args

import pytest

from simcluster.calibration.grouped_fit import grouped_gemm_points, grouped_measured_grid
from simcluster.calibration.grouped_shapes import (
    EXPERT_SHAPES,
    GROUPED_KINDS,
    GROUPS,
    MAX_ROWS,
    TOKENS_PER_EXPERT,
    busiest_tokens_per_expert,
    grouped_grid,
)
from simcluster.calibration.profile import build_profile
from simcluster.calibration.records import GroupedGemmRecord, Measurements
from simcluster.config.hardware import GroupedGemmKind, load_hardware, parse_hardware
from simcluster.config.scenario import load_scenario
from simcluster.costs.grouped_gemm import grouped_gemm_flop_per_s, grouped_gemm_time_s
from simcluster.workload.grouped_gemm import expert_gemm_kind, series_key, tokens_per_expert
from simcluster.workload.model import build_workload
from simcluster.workload.ops import GemmShape
from tests.paths import ROOT

MOE_SCENARIOS = sorted((ROOT / "scenarios" / "moe").glob("*.yaml"))
H100 = load_hardware("h100-sxm5-80gb")


def _expert_gemms(path):
    scenario = load_scenario(path)
    workload = build_workload(scenario, H100.fp8_weight_copies)
    seg = next(s for s in workload.stages[0].chunks[0].segments if s.kind.moe)
    return scenario, [
        (expert_gemm_kind(op), op.gemm)
        for op in seg.layer.forward + seg.layer.backward
        if expert_gemm_kind(op)
    ]


@pytest.mark.parametrize("path", MOE_SCENARIOS, ids=lambda p: p.stem)
def test_the_grid_spans_every_shipped_moe_scenario(path):
    """Each expert GEMM of each shipped MoE scenario has a measured series of its kind with its
    own hidden dims, and its G and tokens per expert lie inside the grid's range."""
    scenario, gemms = _expert_gemms(path)
    assert len(gemms) == 6
    grid = grouped_grid()
    for kind, gemm in gemms:
        series = {series_key(s.kind, s.groups, s.m, s.n, s.k)[1:] for s in grid if s.kind == kind}
        assert series_key(kind, gemm.batch, gemm.m, gemm.n, gemm.k)[1:] in series, (kind, gemm)
        assert min(GROUPS) <= gemm.batch <= max(GROUPS)
        assert min(TOKENS_PER_EXPERT) <= tokens_per_expert(kind, gemm.m, gemm.k) <= max(TOKENS_PER_EXPERT)


@pytest.mark.parametrize("path", MOE_SCENARIOS, ids=lambda p: p.stem)
def test_tokens_per_expert_formula_matches_the_op_graph(path):
    """M = li · s·b/(cp·tp) · topk · ep / E, the op graph's fc1 m (module docstring)."""
    scenario, gemms = _expert_gemms(path)
    moe, par = scenario.model.moe, scenario.parallel
    m = busiest_tokens_per_expert(
        scenario.model.seq_length, scenario.training.micro_batch_size, moe.router_topk, moe.num_experts,
        par.ep, par.tp, par.cp, moe.load_imbalance,
    )  # fmt: skip
    fc1 = next(g for kind, g in gemms if kind == "fc1")
    assert fc1.m == round(m)


def test_grid_size_and_rows():
    """Five models × six kinds × the (G, M) pairs with G·M <= 32k: 420 shapes (the GPU budget
    in scripts/gpu_calibrate.sh is set from this count)."""
    grid = grouped_grid()
    assert len(grid) == len(set(grid)) == 420
    assert all(s.groups * s.tokens <= MAX_ROWS for s in grid)
    assert {s.kind for s in grid} == set(GROUPED_KINDS)
    assert {s.model for s in grid} == {e.model for e in EXPERT_SHAPES}


def synthetic_seconds(launch_s: float, groups: int, m: int, n: int, k: int, kind: str) -> float:
    tokens = tokens_per_expert(kind, m, k)
    tflop = 500.0 * tokens / (tokens + 1024.0 / groups)
    return launch_s + 2.0 * groups * m * n * k / (tflop * 1e12)


def synthetic_measurements() -> Measurements:
    """The committed H100 microbench with grouped records timed off a synthetic curve."""
    base = Measurements.from_json(
        (ROOT / "docs" / "calibration" / "h100-2026-11-26-script" / "microbench.json").read_text()
    )
    records = [
        GroupedGemmRecord(s.kind, s.groups, s.m, s.n, s.k,
                          synthetic_seconds(base.launch_s, s.groups, s.m, s.n, s.k, s.kind), 0.01,
                          "grouped_mm", s.model)
        for s in grouped_grid()
    ]  # fmt: skip
    return dataclasses.replace(base, grouped_gemms=records)


def test_the_fit_reproduces_a_synthetic_curve():
    """Every measured shape priced within the fit's 4-digit rounding of its synthetic time, and
    a shape between measured M within the two neighbours' times per FLOP."""
    meas = synthetic_measurements()
    hw = parse_hardware(build_profile(meas), "fitted.yaml")
    assert len(hw.compute.grouped_gemm_points) == 420
    for record in meas.grouped_gemms[::7]:
        shape = GemmShape(record.m, record.n, record.k, record.groups)
        assert grouped_gemm_time_s(record.kind, shape, hw) == pytest.approx(record.seconds, rel=1e-3)
    between = GemmShape(1024, 2 * 768, 2048, 4)  # Qwen3-30B fc1, M 1024 between 512 and 2048
    rate = grouped_gemm_flop_per_s("fc1", between, hw) / 1e12
    low = 500.0 * 512 / (512 + 256)
    high = 500.0 * 2048 / (2048 + 256)
    assert low < rate < high
    assert rate == pytest.approx(500.0 * 1024 / (1024 + 256), rel=0.05)  # the curve itself, near


def test_duplicates_keep_the_median_rate():
    meas = synthetic_measurements()
    first = meas.grouped_gemms[0]
    dupes = [dataclasses.replace(first, seconds=first.seconds * f) for f in (1.0, 2.0, 4.0)]
    points = grouped_gemm_points(dataclasses.replace(meas, grouped_gemms=dupes))
    assert len(points) == 1
    slow = grouped_gemm_points(dataclasses.replace(meas, grouped_gemms=[dupes[1]]))
    assert points[0]["tflop_per_s"] == slow[0]["tflop_per_s"]


def test_the_profile_records_the_measured_grid():
    grid = grouped_measured_grid(synthetic_measurements())
    assert grid["kinds"]["fc1"]["groups"] == [1, 16]
    assert grid["kinds"]["fc1"]["tokens_per_expert"] == [128, 8192]
    assert grid["kinds"]["fc2.wgrad"]["tokens_per_expert"] == [128, 8192]
    assert grid["impl"] == ["grouped_mm"] and grid["shapes"] == 420
    assert "gemm_max_efficiency" in grid["rule"]
    profile = build_profile(synthetic_measurements())
    assert profile["calibration"]["measured_grid"]["grouped_gemm"] == grid
    assert "grouped_gemm_points" in profile["compute"]["sources"]


def test_a_profile_without_grouped_records_has_no_points():
    base = dataclasses.replace(synthetic_measurements(), grouped_gemms=[])
    profile = build_profile(base)
    assert "grouped_gemm_points" not in profile["compute"]
    assert "grouped_gemm" not in profile["calibration"]["measured_grid"]


def test_records_round_trip_and_older_files_read_empty():
    meas = synthetic_measurements()
    again = Measurements.from_json(meas.to_json())
    assert again.grouped_gemms == meas.grouped_gemms
    data = json.loads(meas.to_json())
    del data["grouped_gemms"]
    assert Measurements.from_json(json.dumps(data)).grouped_gemms == []


def test_the_profile_schema_knows_every_kind():
    """config's `GroupedGemmKind` (what a profile may list) is the workload's kinds."""
    assert get_args(GroupedGemmKind) == GROUPED_KINDS


def test_the_fit_takes_the_pricing_profiles_launch_and_ceiling():
    """rate = FLOPs / (time − launch) with the launch given (the profile's, not the file's),
    and a ceiling holds every rate to it, written rounded down."""
    meas = synthetic_measurements()
    record = meas.grouped_gemms[-1]
    launch_s = 2e-6
    (point,) = grouped_gemm_points(dataclasses.replace(meas, grouped_gemms=[record]), launch_s=launch_s)
    assert point["tflop_per_s"] == pytest.approx(record.flops / (record.seconds - launch_s) / 1e12, rel=5e-4)
    capped = grouped_gemm_points(meas, launch_s=launch_s, ceiling_tflop_per_s=300.04)
    assert max(p["tflop_per_s"] for p in capped) == 300.0
    free = grouped_gemm_points(meas, launch_s=launch_s)
    assert all(c["tflop_per_s"] == min(f["tflop_per_s"], 300.0) for c, f in zip(capped, free))
    assert any(f["tflop_per_s"] > 300.0 for f in free) and any(f["tflop_per_s"] < 300.0 for f in free)
