"""The shipped H100 profile's grouped expert GEMMs are the fit of the committed H100 run
(docs/calibration/h100-2026-11-27-script/microbench.json, `calibration.grouped_profile`):
measured shapes priced at their measured times, other shapes bounded by the ceilings, the
points never hand-edited, no other profile given the H100's points."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest

from simcluster.calibration.grouped_fit import grouped_measured_grid
from simcluster.calibration.grouped_profile import (
    H100_MICROBENCH,
    grouped_source,
    profile_grouped_points,
    sustained_ceiling_tflop_per_s,
    yaml_block,
)
from simcluster.calibration.grouped_shapes import GroupedShape
from simcluster.calibration.records import Measurements
from simcluster.config.files import read_yaml
from simcluster.config.hardware import load_hardware
from simcluster.costs.compute import gemm_memory_roofline_s
from simcluster.costs.grouped_gemm import grouped_gemm_flop_per_s, grouped_gemm_time_s, grouped_placement
from simcluster.workload.ops import GemmShape
from tests.paths import ROOT

H100 = load_hardware("h100-sxm5-80gb")
DATA = read_yaml(ROOT / "hwprofiles" / "h100-sxm5-80gb.yaml")
MEAS = Measurements.from_json((ROOT / H100_MICROBENCH).read_text())
CEILING_S_PER_FLOP = 1e-12 / sustained_ceiling_tflop_per_s(H100)


def test_the_profile_holds_the_fit_of_the_committed_file():
    """Points, their source and the measured grid equal what the fitting command writes."""
    assert DATA["compute"]["grouped_gemm_points"] == profile_grouped_points(MEAS, H100)
    source = DATA["compute"]["sources"]["grouped_gemm_points"]
    assert source == grouped_source(MEAS, H100, H100_MICROBENCH, "h100-sxm5-80gb")
    assert DATA["calibration"]["measured_grid"]["grouped_gemm"] == grouped_measured_grid(MEAS)
    assert source.startswith("measured: " + H100_MICROBENCH)
    assert "python -m simcluster.calibration.grouped_profile" in source


def test_the_command_prints_what_the_profile_holds(capsys):
    """The YAML the command prints parses to the profile's three pieces."""
    from simcluster.calibration.grouped_profile import main

    main([str(ROOT / H100_MICROBENCH)])
    printed = capsys.readouterr().out
    assert printed == yaml_block(MEAS, H100, str(ROOT / H100_MICROBENCH), "h100-sxm5-80gb")
    first = printed.splitlines()[2].strip().removeprefix("- ")
    assert first.startswith("{kind: ") and "tflop_per_s:" in first


def test_the_command_names_a_file_without_grouped_gemms(tmp_path):
    data = json.loads((ROOT / H100_MICROBENCH).read_text())
    data["grouped_gemms"] = []
    path = tmp_path / "microbench.json"
    path.write_text(json.dumps(data))
    from simcluster.calibration.grouped_profile import main

    with pytest.raises(SystemExit, match="grouped_gemms: no grouped GEMM was measured"):
        main([str(path)])


def _as_measured(record) -> GemmShape:  # noqa: ANN001
    """The shape the microbench ran: its wgrad writes bf16, not TE's fp32 accumulation."""
    shape = GroupedShape(record.kind, record.groups, record.m, record.n, record.k).gemm
    return dataclasses.replace(shape, accumulate_fp32=False)


def _priced(record) -> tuple[float, GemmShape]:  # noqa: ANN001
    shape = _as_measured(record)
    return grouped_gemm_time_s(record.kind, shape, H100), shape


def test_every_measured_shape_is_priced_at_its_measured_time_or_the_sustained_ceiling():
    """Within the points' 4-digit rounding, except the shapes that ran faster than the
    sustained GEMM ceiling: those at the ceiling, i.e. slower than measured."""
    capped = 0
    for record in MEAS.grouped_gemms:
        seconds, shape = _priced(record)
        at_ceiling = H100.kernel_launch_s + shape.flops * CEILING_S_PER_FLOP
        if record.seconds < at_ceiling * (1 - 1e-3):
            capped += 1
            assert seconds == pytest.approx(at_ceiling, rel=2e-4)
        else:
            assert seconds == pytest.approx(record.seconds, rel=1e-3)
    assert 0 < capped <= 0.1 * len(MEAS.grouped_gemms)


def test_an_accumulating_wgrad_is_held_to_its_fp32_bytes_at_a_measured_shape():
    """TE's wgrad reads and writes fp32 main_grad: at 128 tokens per expert its output bytes
    take longer than the measured bf16-output kernel, and set the time; at 8192 the measured
    rate does."""
    for record in MEAS.grouped_gemms:
        if not record.kind.endswith(".wgrad"):
            continue
        measured = _as_measured(record)
        accumulating = dataclasses.replace(measured, accumulate_fp32=True)
        roofline = H100.kernel_launch_s + gemm_memory_roofline_s(accumulating, H100)
        seconds = grouped_gemm_time_s(record.kind, accumulating, H100)
        assert seconds == pytest.approx(
            max(grouped_gemm_time_s(record.kind, measured, H100), roofline), rel=1e-12
        )
    small = next(r for r in MEAS.grouped_gemms if r.kind == "fc1.wgrad" and r.groups == 8 and r.k == 128)
    shape = dataclasses.replace(_as_measured(small), accumulate_fp32=True)
    assert grouped_gemm_time_s("fc1.wgrad", shape, H100) > 1.5 * small.seconds


@pytest.mark.parametrize(
    ("kind", "groups", "m", "n", "k"),
    [
        ("fc1", 8, 4096, 1536, 2048),  # Qwen3-30B-A3B's layout: G 8 past its series' end
        ("fc2", 8, 1024, 2880, 2880),  # gpt-oss-120B: between M 512 and 2048
        ("fc1.wgrad", 4, 7168, 4096, 4096),  # DeepSeek-V3: between M 2048 and 8192
        ("fc1", 64, 16, 4096, 7168),  # outside the grid: G 64, M 16 per expert
        ("fc2", 2, 65536, 4096, 14336),  # outside: M 65536
        ("fc1.dgrad", 32, 256, 2048, 3000),  # outside every hidden dim measured
    ],
)  # fmt: skip
def test_unmeasured_shapes_are_bounded_by_the_roofline(kind, groups, m, n, k):
    """At most the sustained GEMM rate, at least the bytes over the copy bandwidth, and no
    faster than the fastest measured point of the kind (no trend extended)."""
    shape = GemmShape(m, n, k, groups)
    assert grouped_placement(kind, shape, list(H100.compute.grouped_gemm_points)) != "measured"
    seconds = grouped_gemm_time_s(kind, shape, H100)
    assert seconds >= H100.kernel_launch_s + shape.flops * CEILING_S_PER_FLOP
    assert seconds >= H100.kernel_launch_s + gemm_memory_roofline_s(shape, H100)
    fastest = max(p.tflop_per_s for p in H100.compute.grouped_gemm_points if p.kind == kind)
    assert grouped_gemm_flop_per_s(kind, shape, H100) <= fastest * 1e12


def test_the_grouped_kernels_ran_at_sustained_not_burst_rates():
    """The evidence the profile relies on to keep the rates unscaled (docs/calibration/
    grouped_gemm.md, "Burst or sustained"): Mixtral's six G 1, M 8192 GEMMs ran slower in the
    sustained microbench than the same calls from an idle GPU (followup.json), and the grouped
    kernel at the heat GEMM's shape ran at the heat loop's settled rate, not at the faster
    per-kernel rate the same run's dense GEMM read there."""
    followup = json.loads((ROOT / "docs/calibration/h100-2026-11-27-script/followup.json").read_text())
    sustained = {(r.kind, r.groups, r.m, r.n, r.k): r.seconds for r in MEAS.grouped_gemms}
    idle = {
        (f["kind"], f["groups"], f["m"], f["n"], f["k"]): f["seconds"]
        for f in followup["grouped_loop"]
        if f["impl"] == "grouped_mm"  # Mixtral's rows ran first, from an idle GPU
    }
    ratios = [sustained[key] / seconds for key, seconds in idle.items() if key in sustained]
    assert len(ratios) == 6 and statistics.median(ratios) > 1.02
    assert MEAS.warmup is not None
    m, k, n = MEAS.warmup["heat_gemm_mkn"]
    settled = MEAS.warmup["settled_tflop_per_s"]
    grouped = sustained[("fc1", 1, m, n, k)]
    dense = next(x for x in MEAS.modern if x.name == "fc1.gemm_bf16" and list(x.dims) == [m, n, k])
    grouped_tflop = 2 * m * n * k / grouped / 1e12
    assert grouped_tflop == pytest.approx(settled, rel=0.01)
    assert dense.flops / dense.seconds / 1e12 > 1.05 * grouped_tflop


@pytest.mark.parametrize(
    "name",
    sorted(p.stem for p in (ROOT / "hwprofiles").glob("*.yaml") if p.stem != "h100-sxm5-80gb"),
)
def test_no_other_profile_carries_grouped_points(name):
    """H200 / Blackwell / A100: no grouped GEMM was measured on them, and the H100's points
    are not copied (docs/calibration/grouped_gemm.md): their experts keep the GEMM model."""
    assert load_hardware(name).compute.grouped_gemm_points == []
