"""`run` shows where the time goes: a table after the summary, and two new --json keys."""

import json

import pytest
from typer.testing import CliRunner

from simcluster.cli import app
from tests.paths import ROOT

runner = CliRunner()
SCENARIO = ROOT / "scenarios" / "modern" / "gpt3-175b-h100-fp8.yaml"


def test_run_json_splits_the_step_and_the_layer_by_kind():
    """time_by_kind_s sums to iteration_time_s, layer_time_by_kind_s to the layer's forward +
    backward; the earlier keys are all still there."""
    result = runner.invoke(app, ["run", str(SCENARIO), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    step, layer = payload["time_by_kind_s"], payload["layer_time_by_kind_s"]
    assert sum(step.values()) == pytest.approx(payload["iteration_time_s"], rel=1e-9)
    assert sum(layer.values()) == pytest.approx(payload["layer_forward_s"] + payload["layer_backward_s"])
    assert step["fp8_cast"] > 0 and step["pp_comm"] > 0 and step["pipeline_idle"] > 0
    assert {"time_breakdown_s", "layer_forward_s", "mfu", "stages"} <= payload.keys()


def test_run_table_has_a_where_the_time_goes_block():
    result = runner.invoke(app, ["run", str(SCENARIO)])
    assert result.exit_code == 0, result.output
    assert "where the time goes" in result.output
    for label in ("GEMM", "FP8 casts", "CP comm (exposed)", "host-bound wait", "pipeline idle"):
        assert label in result.output
