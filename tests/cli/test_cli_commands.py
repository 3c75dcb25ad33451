"""CLI: run, validate and memory produce the public keys and clear errors."""

import json

from typer.testing import CliRunner

from simcluster.cli import app
from tests.paths import ROOT

runner = CliRunner()
PAPER = ROOT / "scenarios" / "paper"
JSON_KEYS = {
    "iteration_time_s",
    "mfu",
    "hfu",
    "tflops_per_gpu",
    "model_flops",
    "hardware_flops",
    "bubble_fraction",
    "num_gpus",
    "fits_in_memory",
    "time_breakdown_s",
    "stages",
}
STAGE_KEYS = {
    "stage",
    "peak_memory_bytes",
    "activation_bytes",
    "weight_bytes",
    "gradient_bytes",
    "optimizer_bytes",
}


def test_run_json_has_the_contract_keys():
    """`run --json` prints one object with every public key."""
    result = runner.invoke(app, ["run", str(PAPER / "gpt3-175b-sp-selective.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert JSON_KEYS <= payload.keys()
    assert STAGE_KEYS <= payload["stages"][0].keys()
    assert len(payload["stages"]) == 8 and payload["num_gpus"] == 64
    assert set(payload["time_breakdown_s"]) == {
        "compute",
        "recompute",
        "tp_comm",
        "ep_comm",
        "pp_comm",
        "dp_comm",
        "optimizer",
        "host_wait",
        "idle",
    }
    assert abs(sum(payload["time_breakdown_s"].values()) - payload["iteration_time_s"]) < 1e-6


def test_run_table_and_trace(tmp_path):
    """The readable table names MFU and the stages; --trace writes Perfetto JSON."""
    trace = tmp_path / "t.json"
    result = runner.invoke(app, ["run", str(PAPER / "gpt-22b-sp-selective.yaml"), "--trace", str(trace)])
    assert result.exit_code == 0, result.output
    assert "MFU" in result.output and "peak GB" in result.output
    assert json.loads(trace.read_text())["traceEvents"]


def test_run_steady_state_gives_the_full_runs_numbers():
    """`run --steady-state` (64 microbatches from a certified run of 24) prints the numbers of
    the full simulation to float rounding; it cannot write a trace."""
    path = str(PAPER / "gpt3-175b-sp-selective.yaml")
    full = json.loads(runner.invoke(app, ["run", path, "--json"]).output)
    result = runner.invoke(app, ["run", path, "--json", "--steady-state"])
    assert result.exit_code == 0, result.output
    fast = json.loads(result.output)
    for key in ("iteration_time_s", "mfu", "bubble_fraction"):
        assert abs(fast[key] - full[key]) <= 1e-9 * abs(full[key])
    peaks = [s["peak_memory_bytes"] for s in fast["stages"]]
    assert peaks == [s["peak_memory_bytes"] for s in full["stages"]]
    assert fast["num_events"] < full["num_events"]
    refused = runner.invoke(app, ["run", path, "--steady-state", "--trace", "t.json"])
    assert refused.exit_code != 0 and "--trace needs every task simulated" in refused.output


def test_run_folder_prints_one_line_per_scenario():
    """`run scenarios/paper/` summarises every scenario."""
    result = runner.invoke(app, ["run", str(PAPER)])
    assert result.exit_code == 0, result.output
    assert all(path.stem in result.output for path in PAPER.glob("*.yaml"))


def test_bad_scenario_exits_2_naming_the_field(tmp_path):
    """A misspelt key is reported with the file and the key, exit code 2."""
    bad = tmp_path / "bad.yaml"
    bad.write_text((PAPER / "gpt-22b-sp-selective.yaml").read_text().replace("tp: 8", "tpp: 8"))
    result = runner.invoke(app, ["run", str(bad)])
    assert result.exit_code == 2
    assert "bad.yaml" in result.output and "parallel.tpp: unknown key" in result.output


def test_validate_reports_both_tables():
    """validate lists Table 4 and Table 5 rows and labels the calibration."""
    result = runner.invoke(app, ["validate"])
    assert result.exit_code == 0, result.output
    assert "Table 4" in result.output and "Table 5" in result.output
    assert "CALIBRATION" in result.output and "mean |error|" in result.output


def test_memory_measure_json_matches_prediction():
    """`memory --measure --json` at a small s: the real layer's bytes == the prediction."""
    args = ["memory", str(PAPER / "gpt-22b-sp-selective.yaml"), "--measure", "--seq-length", "64", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["measured_bytes_per_layer"] == payload["predicted_bytes_per_layer"]
    assert payload["table2_row"] == "tensor + sequence parallel + selective recompute"


def test_memory_measure_refuses_shapes_that_do_not_fit(monkeypatch):
    """With little free memory, --measure exits 2 and proposes smaller overrides."""
    import simcluster.cli.memory as memory_command

    monkeypatch.setattr(memory_command, "_available_memory_bytes", lambda: 1e6)
    result = runner.invoke(app, ["memory", str(PAPER / "gpt3-175b-sp-selective.yaml"), "--measure"])
    assert result.exit_code == 2
    assert "--seq-length 256" in result.output and "--micro-batch-size" in result.output
