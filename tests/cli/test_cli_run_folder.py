"""`run FOLDER` runs every good file and reports every bad one; `--json` is always valid
JSON (never Infinity or NaN); the bubble reads right."""

import json

import pytest
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config import ConfigError, load_hardware, load_scenario
from simcluster.simulation import require_finite, run_simulation
from tests.paths import ROOT

runner = CliRunner()
PAPER = ROOT / "scenarios" / "paper"


def _strict_json(text: str):
    """json.loads that refuses Infinity / NaN (which Python's json accepts by default)."""

    def refuse(constant: str):
        raise AssertionError(f"{constant} in --json output")

    return json.loads(text, parse_constant=refuse)


def _folder(tmp_path):
    good = (PAPER / "gpt-22b-sp-selective.yaml").read_text()
    (tmp_path / "a-good.yaml").write_text(good)
    (tmp_path / "b-duplicate.yaml").write_text(good + "name: x\nname: y\n")
    (tmp_path / "c-misspelt.yaml").write_text(good.replace("tp: 8", "tpp: 8"))
    (tmp_path / "d-good.yaml").write_text(good.replace("name: ", "name: second-"))
    return tmp_path


def test_folder_runs_every_good_file_and_reports_every_bad_one(tmp_path):
    """Two good and two bad files: both good ones are in the table, both bad ones named on
    stderr with their problem, exit 2."""
    result = runner.invoke(app, ["run", str(_folder(tmp_path))])
    assert result.exit_code == 2
    assert "gpt-22b-sp-selective" in result.stdout and "second-" in result.stdout
    assert "b-duplicate.yaml" in result.stderr and "appears twice" in result.stderr
    assert "c-misspelt.yaml" in result.stderr and "parallel.tpp: unknown key" in result.stderr
    assert "2 of 4 scenario files" in result.stderr


def test_folder_json_holds_the_good_results(tmp_path):
    """With --json, stdout is one valid JSON list of the good runs; errors go to stderr."""
    result = runner.invoke(app, ["run", str(_folder(tmp_path)), "--json"])
    assert result.exit_code == 2
    payload = _strict_json(result.stdout)
    assert [item["scenario"] for item in payload] == ["gpt-22b-sp-selective", "second-gpt-22b-sp-selective"]


def test_paper_json_is_strict_json_with_the_bubble_keys():
    """Every paper scenario's --json parses without Infinity/NaN; the bubble is given as a
    ratio and as an idle share below 1, the old key kept."""
    result = runner.invoke(app, ["run", str(PAPER), "--json"])
    assert result.exit_code == 0, result.output
    for item in _strict_json(result.stdout):
        ratio = item["bubble_to_busy_ratio"]
        assert item["bubble_fraction"] == ratio
        assert item["pipeline_idle_fraction"] == pytest.approx(ratio / (1 + ratio))
        assert 0 <= item["pipeline_idle_fraction"] < 1


def test_bubble_of_one_microbatch_on_eight_stages(tmp_path):
    """p = 8, m = 1: the ratio is the textbook (p − 1)/m = 7 and the table says 87.5 % idle
    (it said "pipeline bubble 700 %")."""
    path = tmp_path / "p8.yaml"
    path.write_text(
        "hardware: a100-sxm4-80gb\nmodel: {num_layers: 8, hidden_size: 1024, num_attention_heads: 16,"
        " seq_length: 512, vocab_size: 5000}\nparallel: {tp: 1, pp: 8}\n"
        "training: {micro_batch_size: 1, global_batch_size: 1}\n"
    )
    result = run_simulation(load_scenario(path), load_hardware("a100-sxm4-80gb")).result
    assert result.bubble_to_busy_ratio == pytest.approx(7.0)
    assert result.pipeline_idle_fraction == pytest.approx(0.875)
    table = runner.invoke(app, ["run", str(path)])
    assert "87.5 %" in table.stdout and "700" not in table.stdout


def test_a_non_finite_result_is_an_error_not_infinity():
    """A profile edited past validation (1e-320 GB/s NIC) makes times infinite: refused."""
    scenario = load_scenario(PAPER / "gpt3-175b-sp-selective.yaml")
    hw = load_hardware("a100-sxm4-80gb")
    network = hw.network.model_copy(update={"nic_achieved_gb_per_s": 1e-320})
    broken = hw.model_copy(update={"network": network})
    result = run_simulation(scenario, broken).result
    with pytest.raises(ConfigError, match="non-finite iteration_time_s"):
        require_finite(result, "s.yaml")
