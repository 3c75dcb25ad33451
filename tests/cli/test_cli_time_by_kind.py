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
    """Every kind with time in the step or the layer has its row; a kind with none (no CP here,
    no host-bound wait) is left out of the table, and --json still has it at 0."""
    from simcluster.report.tables import _KIND_LABELS

    table = runner.invoke(app, ["run", str(SCENARIO)])
    assert table.exit_code == 0, table.output
    assert "where the time goes" in table.output
    payload = json.loads(runner.invoke(app, ["run", str(SCENARIO), "--json"]).output)
    step, layer = payload["time_by_kind_s"], payload["layer_time_by_kind_s"]
    shown = [kind for kind in step if step[kind] > 0 or layer.get(kind, 0) > 0]
    assert {"gemm", "fp8_cast", "pp_comm", "pipeline_idle"} <= set(shown)
    for kind, label in _KIND_LABELS.items():
        assert (f"\n{label}  " in table.output) == (kind in shown), label
    assert step["cp_comm"] == 0 and "\nCP comm (exposed)" not in table.output
