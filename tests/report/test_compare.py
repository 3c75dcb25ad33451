"""`simcluster compare`: scenarios side by side, differences marked, deltas relative to the first."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config import load_hardware, load_scenario
from simcluster.config.scenario import parse_scenario
from simcluster.report.compare import compare_results, format_comparison
from simcluster.simulation import run_simulation
from tests.paths import ROOT

SELECTIVE = ROOT / "scenarios" / "paper" / "gpt3-175b-sp-selective.yaml"
FULL = ROOT / "scenarios" / "paper" / "gpt3-175b-full-recompute.yaml"
HW = load_hardware("a100-sxm4-80gb")


def _small(pp: int, recompute: str = "selective"):
    data = {
        "name": f"small-pp{pp}-{recompute}",
        "hardware": "a100-sxm4-80gb",
        "model": {"num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 512,
                  "vocab_size": 32000},
        "parallel": {"tp": 2, "pp": pp},
        "training": {"micro_batch_size": 1, "global_batch_size": 8, "recompute": recompute},
    }  # fmt: skip
    return parse_scenario(data, "small")


def _compare(*scenarios):
    return compare_results(scenarios, [run_simulation(s, HW).result for s in scenarios])


def _row(comparison, quantity):
    return next(row for row in comparison.rows if row.quantity == quantity)


def test_identical_scenarios_differ_nowhere():
    """The same scenario twice: no row is marked, no delta shown."""
    scenario = _small(2)
    comparison = _compare(scenario, scenario)
    assert not any(row.differs for row in comparison.rows)
    assert comparison.names == ("small-pp2-selective (1)", "small-pp2-selective (2)")
    assert "* differs (0 of" in format_comparison(comparison)


def test_changed_recompute_marks_exactly_what_changed():
    """Full vs selective recompute: recompute time and the layout row differ, with the
    relative delta of each number; the model rows do not."""
    a, b = _small(2, "selective"), _small(2, "full")
    comparison = _compare(a, b)
    ra, rb = comparison.results
    recompute = _row(comparison, "recompute_s")
    assert recompute.differs
    assert recompute.values == (ra.time_breakdown_s["recompute"], rb.time_breakdown_s["recompute"])
    iteration = _row(comparison, "iteration_time_s")
    expected = (rb.iteration_time_s - ra.iteration_time_s) / ra.iteration_time_s
    assert iteration.relative_delta == (None, pytest.approx(expected))
    assert _row(comparison, "recompute").values == ("selective", "full")
    assert _row(comparison, "recompute").differs
    assert not _row(comparison, "hidden_size").differs and not _row(comparison, "tp").differs


def test_every_time_category_and_stage_is_a_row():
    """One row per time category and one per stage; a shorter pipeline shows None."""
    comparison = _compare(_small(2), _small(4))
    quantities = [row.quantity for row in comparison.rows]
    for category in ("compute", "recompute", "tp_comm", "pp_comm", "dp_comm", "optimizer", "idle"):
        assert f"{category}_s" in quantities
    stage3 = _row(comparison, "stage 3 peak_memory_bytes")
    assert stage3.values[0] is None and stage3.values[1] == comparison.results[1].stages[3].peak_memory_bytes
    assert stage3.differs
    assert _row(comparison, "pp").values == (2, 4)


def test_cli_table_and_json(tmp_path):
    """The CLI prints the table with markers, and --json the same rows plus each run's result."""
    runner = CliRunner()
    table = runner.invoke(app, ["compare", str(SELECTIVE), str(FULL)])
    assert table.exit_code == 0, table.output
    recompute_line = next(line for line in table.stdout.splitlines() if line.startswith("time: recompute s"))
    assert recompute_line.rstrip().endswith("*") and "%" in recompute_line
    hidden_line = next(line for line in table.stdout.splitlines() if line.startswith("layout: hidden_size"))
    assert not hidden_line.rstrip().endswith("*")
    payload = json.loads(runner.invoke(app, ["compare", str(SELECTIVE), str(FULL), "--json"]).stdout)
    assert payload["scenarios"] == ["gpt3-175b-sp-selective", "gpt3-175b-full-recompute"]
    assert {"section", "quantity", "values", "relative_delta", "differs"} <= payload["rows"][0].keys()
    assert "recompute_s" in payload["differing"] and "hidden_size" not in payload["differing"]
    assert [r["scenario"] for r in payload["results"]] == payload["scenarios"]
    expected = run_simulation(load_scenario(FULL), HW).result.iteration_time_s
    assert payload["results"][1]["iteration_time_s"] == expected


def test_cli_needs_two_files_and_valid_ones(tmp_path):
    """One file, or a file that does not load: exit 2 with the reason."""
    runner = CliRunner()
    one = runner.invoke(app, ["compare", str(SELECTIVE)])
    assert one.exit_code == 2 and "two or more" in one.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "bad"}))
    broken = runner.invoke(app, ["compare", str(SELECTIVE), str(bad)])
    assert broken.exit_code == 2 and "bad.yaml" in broken.stderr


def test_the_modern_keys_are_layout_rows():
    """Issue 11's keys (cp, the attention kernel, the FP8 recipe, ...) are compared too: a
    flash-attention scenario against its FlashAttention-2 twin differs in that row and in
    time, not in the kernel-independent layout rows."""
    data = {
        "name": "small-flash",
        "hardware": "h100-sxm5-80gb",
        "model": {"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "num_query_groups": 4,
                  "seq_length": 2048, "vocab_size": 32000},
        "parallel": {"tp": 2, "cp": 2, "pp": 1},
        "training": {"micro_batch_size": 1, "global_batch_size": 8, "attention_backend": "flash"},
    }  # fmt: skip
    auto = parse_scenario(data, "auto")
    training = {**data["training"], "attention_kernel": "flash_attn_2"}
    fa2 = parse_scenario({**data, "training": training}, "fa2")
    h100 = load_hardware("h100-sxm5-80gb")
    # the kernels' difference, not the host's: this small layer is host-bound (costs.host)
    h100 = h100.model_copy(update={"compute": h100.compute.model_copy(update={"host_issue_us_per_op": None})})
    comparison = compare_results((auto, fa2), [run_simulation(s, h100).result for s in (auto, fa2)])
    assert _row(comparison, "attention_kernel").values == ("auto", "flash_attn_2")
    assert _row(comparison, "attention_kernel").differs and _row(comparison, "iteration_time_s").differs
    assert _row(comparison, "cp").values == (2, 2) and not _row(comparison, "cp").differs
    assert _row(comparison, "num_query_groups").values == (4, 4)
