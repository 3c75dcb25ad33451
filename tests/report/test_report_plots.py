"""Plots: the numbers behind each figure (hand-checked), the figures themselves (PNG/SVG by
suffix), and the `simcluster plot` commands."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config import parse_scenario
from simcluster.config.hardware import load_hardware
from simcluster.report import plots
from simcluster.simulation import run_simulation
from simcluster.validation import Comparison

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

TINY = {
    "hardware": "a100-sxm4-80gb",
    "model": {
        "num_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "seq_length": 128,
        "vocab_size": 1024,
    },
    "parallel": {"tp": 2, "pp": 2, "sequence_parallel": True},
    "training": {"micro_batch_size": 1, "global_batch_size": 4, "recompute": "selective"},
}


def _sweep_table() -> pd.DataFrame:
    """Six configurations: (tp, pp, status, fits, mfu, time s, peak GB)."""
    rows = [
        (1, 1, "oom", False, math.nan, math.nan, 120.0),
        (2, 1, "ok", True, 0.40, 10.0, 70.0),
        (2, 1, "ok", True, 0.45, 9.0, 75.0),
        (2, 2, "ok", True, 0.30, 12.0, 50.0),
        (2, 2, "ok", False, 0.60, 6.0, 90.0),  # simulated but over capacity
        (1, 2, "error", None, math.nan, math.nan, math.nan),
    ]
    table = pd.DataFrame(
        rows, columns=["tp", "pp", "status", "fits", "mfu", "iteration_time_s", "max_stage_peak_memory_bytes"]
    )
    table["max_stage_peak_memory_bytes"] *= 1e9
    table["hfu"] = table["mfu"] * 1.1
    table["dp"], table["vpp"], table["micro_batch_size"] = 1, 1, 1
    table["sequence_parallel"], table["recompute"] = True, "selective"
    return table


def test_memory_ladder_matches_table2_by_hand_for_gpt3():
    """175B, t = 8: baseline sbh(10 + 3 + 10) = 23sbh; SP 14.25; selective 13; both 4.25; full 2."""
    frame = plots.memory_ladder_frame()
    gpt3 = frame[frame["model"] == "175B"].set_index("configuration")["percent_of_baseline"]
    expected = [100, 100 * 14.25 / 23, 100 * 13 / 23, 100 * 4.25 / 23, 100 * 2 / 23]
    assert list(gpt3) == pytest.approx(expected)
    assert set(frame["model"]) == {"22B", "175B", "530B", "1T"}


def test_memory_ladder_formula_agrees_with_the_op_graph():
    """The simulator's saved bytes per layer equal Table 2's for every ladder step."""
    frame = plots.memory_ladder_frame()
    assert list(frame["simulator_bytes"]) == pytest.approx(list(frame["formula_bytes"]))


def test_table2_frame_first_row_is_no_parallelism():
    """175B, b = 1: sbh(34 + 5as/h) with s = 2048, h = 12288, a = 96 → sbh · 114."""
    frame = plots.table2_frame(plots.paper_scenarios()["175B"])
    assert len(frame) == 6
    sbh = 2048 * 1 * 12288
    assert frame["bytes_per_layer"].iloc[0] == pytest.approx(sbh * (34 + 5 * 96 * 2048 / 12288))
    assert frame["bytes_per_layer"].iloc[-1] == pytest.approx(sbh * 2)


def test_memory_budget_none_fit_without_the_present_work():
    """Paper Figure 1: without SP + selective no model fits in 80 GB; with it every one does."""
    frame = plots.memory_budget_frame()
    baseline = frame["static_gb"] + frame["activations_baseline_gb"]
    present = frame["static_gb"] + frame["activations_present_gb"]
    assert (baseline > frame["capacity_gb"]).all()
    assert (present < frame["capacity_gb"]).all()


def test_table5_frame_gain_is_full_over_present_minus_one():
    rows = [
        Comparison("Table 5", "22B full recompute", "iteration s", 1.5, 1.42, "s"),
        Comparison("Table 5", "22B SP + selective", "iteration s", 1.0, 1.10, "s"),
        Comparison("Table 5", "22B SP + selective", "MFU", 40.0, 41.5, "%"),
    ]
    frame = plots.table5_frame(rows).set_index("model")
    assert frame.loc["22B", "gain_predicted"] == pytest.approx(0.5)
    assert frame.loc["22B", "gain_measured"] == pytest.approx(1.42 / 1.10 - 1)
    plots.table5_figure(rows)  # one model: a single axes


def test_timeline_rows_tile_each_stage_up_to_the_iteration_end():
    """Busy, recompute, comms and idle rows of a stage never overlap and sum to the iteration."""
    scenario = parse_scenario(TINY, "tiny")
    simulation = run_simulation(scenario, load_hardware("a100-sxm4-80gb"), record=True)
    frame = plots.timeline_frame(simulation)
    assert set(frame["category"]) <= set(plots.TIMELINE_COLORS)
    assert {"forward", "backward", "recompute"} <= set(frame["category"])
    for _, rows in frame.groupby("stage"):
        rows = rows.sort_values("start_s")
        ends = (rows["start_s"] + rows["duration_s"]).to_numpy()
        assert (rows["start_s"].to_numpy()[1:] >= ends[:-1] - 1e-12).all()
        assert rows["duration_s"].sum() == pytest.approx(simulation.result.iteration_time_s)
    plots.timeline_figure(frame)


def test_timeline_needs_a_recorded_run():
    scenario = parse_scenario(TINY, "tiny")
    with pytest.raises(ValueError, match="record=True"):
        plots.timeline_frame(run_simulation(scenario, load_hardware("a100-sxm4-80gb")))


def test_pareto_front_keeps_fitting_points_nobody_beats():
    """Fitting (GB, s): (50, 12), (70, 10), (75, 9) — none dominates another; (90, 6) does not fit."""
    front = plots.pareto_front(_sweep_table())
    assert list(front["max_stage_peak_memory_bytes"] / 1e9) == [50.0, 70.0, 75.0]
    assert list(front["iteration_time_s"]) == [12.0, 10.0, 9.0]
    plots.pareto_figure(_sweep_table(), capacity_bytes=80e9)


def test_sweep_heatmap_shows_the_best_fitting_mfu_per_cell():
    """(pp 1, tp 2): best of 40 % and 45 %; (pp 2, tp 2): 30 % (the 60 % row does not fit);
    (pp 1, tp 1) and (pp 2, tp 1) have nothing that fits."""
    figure = plots.sweep_heatmap_figure(_sweep_table())
    grid = np.ma.filled(figure.axes[0].images[0].get_array().astype(float), np.nan)
    assert grid[0][1] == pytest.approx(45.0) and grid[1][1] == pytest.approx(30.0)
    assert math.isnan(grid[0][0]) and math.isnan(grid[1][0])


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_save_figure_format_follows_the_suffix(tmp_path, suffix):
    path = plots.save_figure(plots.pareto_figure(_sweep_table()), tmp_path / f"sub/fig{suffix}")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) if suffix == ".png" else b"<svg" in data[:2000]


def test_save_figure_rejects_unknown_formats(tmp_path):
    with pytest.raises(ValueError, match="unknown figure format"):
        plots.save_figure(plots.pareto_figure(_sweep_table()), tmp_path / "fig.jpg")


def test_only_report_imports_matplotlib():
    """docs/layout.md: matplotlib stays in simcluster/report/ (the CLI imports it lazily, via report)."""
    pattern = re.compile(r"^\s*(import|from)\s+matplotlib", re.MULTILINE)
    offenders = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "simcluster").rglob("*.py")
        if "report" not in path.parts and pattern.search(path.read_text())
    ]
    assert offenders == []


# --- the CLI ------------------------------------------------------------------------------


def _plot(*args):
    return CliRunner().invoke(app, ["plot", *args])


def test_cli_memory_ladder_svg(tmp_path):
    out = tmp_path / "ladder.svg"
    result = _plot("memory-ladder", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert b"<svg" in out.read_bytes()[:2000]


def test_cli_timeline_png(tmp_path):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(json.dumps(TINY))  # JSON is YAML
    out = tmp_path / "timeline.png"
    result = _plot("timeline", str(scenario), "-o", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("kind", ["sweep-heatmap", "pareto"])
def test_cli_sweep_plots_from_parquet(tmp_path, kind):
    table = tmp_path / "sweep.parquet"
    _sweep_table().to_parquet(table)
    out = tmp_path / f"{kind}.png"
    result = _plot(kind, str(table), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_cli_table5(tmp_path):
    out = tmp_path / "table5.png"
    result = _plot("table5", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_cli_rejects_a_bad_suffix_and_a_non_sweep_table(tmp_path):
    assert _plot("memory-ladder", "--out", str(tmp_path / "x.gif")).exit_code == 2
    table = tmp_path / "other.csv"
    table.write_text("a,b\n1,2\n")
    result = _plot("pareto", str(table), "--out", str(tmp_path / "p.png"))
    assert result.exit_code == 2
    assert "missing columns" in result.stderr
