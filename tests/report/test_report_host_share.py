"""How close a run is to host-bound (`SimulationResult.host_issue_share`,
`costs.stage_pricing.host_issue_share`): the busiest chunk's host issue seconds over its GPU
seconds, in `run`'s table and `--json`, with a note where the prediction rests on the host."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config.hardware import HardwareProfile, load_hardware
from simcluster.config.scenario import load_scenario
from simcluster.costs.stage_pricing import StagePricing, host_issue_share
from simcluster.report.tables import NEAR_HOST_BOUND, format_result, host_note
from simcluster.simulation import run_simulation
from simcluster.workload.model import build_workload
from tests.paths import ROOT

QWEN = ROOT / "benchmarks" / "public_runs" / "bridge26.04-qwen3-30b-a3b-h100-fp8cs.yaml"
LLAMA = ROOT / "scenarios" / "modern" / "llama3-8b-h100.yaml"


def _without_host(hw: HardwareProfile) -> HardwareProfile:
    return hw.model_copy(update={"compute": hw.compute.model_copy(update={"host_issue_us_per_op": None})})


def test_the_share_is_the_busiest_chunks_host_over_gpu_seconds():
    scenario = load_scenario(QWEN)
    hw = load_hardware(scenario.hardware)
    pricing = StagePricing(hw)
    stages = pricing.stages(scenario, build_workload(scenario, hw.fp8_weight_copies))
    chunks = [c for stage in stages for c in stage.chunks]
    expected = max(
        (c.host_forward_s + c.host_backward_s) / (c.cost.forward_s + c.cost.backward_s) for c in chunks
    )
    assert host_issue_share(stages) == pytest.approx(expected, rel=1e-12)
    result = run_simulation(scenario, hw).result
    assert result.host_issue_share == pytest.approx(expected, rel=1e-12)
    # a fine-grained MoE layer without graphs: the host issues most of the GPU's time (80 %)
    assert 0.5 < result.host_issue_share < 1
    near = replace(result, host_issue_share=max(result.host_issue_share, NEAR_HOST_BOUND))
    note = host_note(near)
    share = near.host_issue_share
    assert note.startswith("near host-bound") and f"{100 * share:.0f} %" in note
    assert "host issue / GPU time (busiest chunk)" in format_result(result)
    assert note in format_result(near)


def test_a_dense_layer_is_far_from_the_host_and_gets_no_note():
    result = run_simulation(load_scenario(LLAMA), load_hardware("h100-sxm5-80gb")).result
    assert result.host_issue_share is not None and 0 < result.host_issue_share < 0.5
    assert host_note(result) == ""
    assert host_note(replace(result, host_issue_share=1.2)).startswith("host-bound")


def test_a_profile_that_does_not_price_the_host_reports_none():
    scenario = load_scenario(QWEN)
    result = run_simulation(scenario, _without_host(load_hardware(scenario.hardware))).result
    assert result.host_issue_share is None
    assert host_note(result) == "" and "host issue / GPU time" not in format_result(result)


def test_run_json_carries_the_share():
    out = CliRunner().invoke(app, ["run", str(QWEN), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert 0.5 < doc["host_issue_share"] < 1
