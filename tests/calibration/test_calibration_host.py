"""compute.host_issue_us_per_op from calibrate: one definition (host seconds per priced op of
the stand-in layer, `calibration.host_fit`), fitted from the tiny layers or host_graph.json,
and check-profile prices host-bound runs with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simcluster.calibration.check import compare, host_per_op_s, summarize
from simcluster.calibration.host_fit import case_config, host_cases, host_graph_per_op_s, priced_ops
from simcluster.calibration.profile import build_profile
from simcluster.calibration.records import LayerRun, Measurements
from simcluster.cli import app
from simcluster.config.hardware import HardwareProfile, parse_hardware

FOLDER = Path(__file__).resolve().parents[2] / "docs" / "calibration" / "h100-2026-11-26-script"


@pytest.fixture(scope="module")
def meas() -> Measurements:
    return Measurements.from_json((FOLDER / "microbench_static_rows.json").read_text())


@pytest.fixture(scope="module")
def host_graph() -> dict:
    return json.loads((FOLDER / "host_graph.json").read_text())


@pytest.fixture(scope="module")
def from_host_graph(meas: Measurements, host_graph: dict) -> HardwareProfile:
    return parse_hardware(build_profile(meas, host_graph=host_graph), "host.yaml")


def test_the_committed_cases_per_priced_op(host_graph: dict) -> None:
    """Llama 3 8B t 8 SP, GPT-3 175B flash t 8 SP, Llama 3 8B t 1, tiny: 40, 36, 31, 31 priced
    ops (the GQA / RoPE layers' V copy and QKV-gradient concat, and at t 1 the query copy);
    104, 132, 323, 168 µs each; the t 1 layer is GPU-bound (eager 23.83 ms, graph 23.59)."""
    cases = host_cases(host_graph)
    assert [c.priced_ops for c in cases] == [40, 36, 31, 31]
    assert [round(c.per_op_s * 1e6) for c in cases] == [104, 132, 323, 168]
    assert [c.host_bound for c in cases] == [True, True, False, True]
    assert host_graph_per_op_s(host_graph) == pytest.approx(132.27e-6, rel=1e-3)


def test_priced_ops_are_the_ops_the_check_prices(host_graph: dict) -> None:
    from simcluster.calibration.check import predict_config
    from simcluster.config.hardware import load_hardware

    hw = load_hardware("h100-sxm5-80gb")
    for row in host_graph["cases"]:
        cfg = case_config(row)
        assert priced_ops(cfg) == predict_config(cfg, hw).num_ops


def test_a_case_without_fields_or_a_known_name_is_refused() -> None:
    with pytest.raises(ValueError, match="'mystery'.*llama3-8b"):
        case_config({"name": "mystery", "tp": 1, "sequence_parallel": False, "seq_length": 128})


def test_calibrate_writes_the_tiny_layer_figure_by_default(meas: Measurements) -> None:
    """Without host_graph.json: the microbench's tiny layers, 167.26 µs per op (fused)."""
    profile = parse_hardware(build_profile(meas), "tiny.yaml")
    assert profile.compute.host_issue_us_per_op == pytest.approx(meas.layer_overhead_s * 1e6, abs=0.01)
    assert "tiny layers" in profile.compute.sources["host_issue_us_per_op"]
    assert host_per_op_s(profile) == pytest.approx(meas.layer_overhead_s, rel=1e-4)


def test_host_graph_sets_it_with_its_cases(from_host_graph: HardwareProfile) -> None:
    assert from_host_graph.compute.host_issue_us_per_op == pytest.approx(132.27)
    assert "3 host-bound cases" in from_host_graph.compute.sources["host_issue_us_per_op"]
    detail = from_host_graph.calibration["host_issue"]
    assert len(detail["host_graph_cases"]) == 4 and detail["tiny_layer_us_per_op"] == pytest.approx(167.26)


def test_check_profile_prices_host_bound_runs_with_it(from_host_graph: HardwareProfile) -> None:
    """Fused layers (committed): at 132 µs per op 13 runs are host-bound, priced with the host
    median |error| 11.5 % (device alone 46.2 %); at the tiny layers' 167 µs: 18, 17.1 %."""
    run = LayerRun.from_json((FOLDER / "layer_timing_fused.json").read_text())
    summary = summarize(compare(run, from_host_graph))
    assert summary.num_host_bound == 13
    assert summary.host_bound_with_host_median_abs_error == pytest.approx(0.115, abs=0.003)
    assert summary.host_bound_device_median_abs_error == pytest.approx(0.462, abs=0.003)


def test_calibrate_refuses_a_host_graph_file_without_cases(tmp_path: Path) -> None:
    bad = tmp_path / "host.json"
    bad.write_text(json.dumps({"rows": []}))
    result = CliRunner().invoke(
        app,
        ["calibrate", "--measurements", str(FOLDER / "microbench_static_rows.json"), "--out",
         str(tmp_path / "p.yaml"), "--host-graph", str(bad)],
    )  # fmt: skip
    assert result.exit_code == 2 and "--host-graph" in result.output and "'cases'" in result.output
