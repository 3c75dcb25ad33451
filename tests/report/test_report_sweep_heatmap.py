"""The sweep heatmap tells a layout that does not fit (grey, with the memory it needs) from
one the scenario rules reject (hatched, "invalid"), names the model, GPU count and
hardware in its title, and refuses a table that mixes models unless one is chosen."""

import math

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.report import plots


def _table() -> pd.DataFrame:
    """(tp, pp, status, fits, mfu, peak GB): a cell that fits, one that does not, one that
    only raised; tp 1 × pp 2 has no row at all."""
    rows = [
        (2, 1, "ok", True, 0.40, 70.0),
        (2, 1, "ok", True, 0.45, 75.0),
        (1, 1, "oom", False, math.nan, 120.0),
        (1, 1, "oom", False, math.nan, 95.0),
        (2, 2, "error", None, math.nan, math.nan),
    ]
    table = pd.DataFrame(rows, columns=["tp", "pp", "status", "fits", "mfu", "max_stage_peak_memory_bytes"])
    table["max_stage_peak_memory_bytes"] *= 1e9
    table["iteration_time_s"], table["hfu"] = 1.0, table["mfu"]
    table["dp"], table["vpp"], table["micro_batch_size"] = 1, 1, 1
    table["sequence_parallel"], table["recompute"] = True, "selective"
    table["model"], table["num_gpus"], table["seq_length"] = "gpt3", 64, 2048
    table["hardware"] = "h100-sxm5-80gb"
    return table


def test_heatmap_cells_say_fits_no_fit_error_or_invalid():
    """(1, 1): no fit, needing the smaller of 120 and 95 GB; (2, 1): 45 %; (2, 2): error;
    (1, 2): no row, so invalid; (4, 1) from the sweep's record of rejected cells: invalid."""
    cells = plots.heatmap_frame(_table(), "mfu", invalid_cells=[(4, 1)]).set_index(["tp", "pp"])
    assert cells["state"].to_dict() == {
        (1, 1): "no fit", (2, 1): "fits", (4, 1): "invalid",
        (1, 2): "invalid", (2, 2): "error", (4, 2): "invalid",
    }  # fmt: skip
    assert cells.loc[(2, 1), "value"] == pytest.approx(0.45)
    assert cells.loc[(1, 1), "min_peak_memory_bytes"] == 95e9
    assert math.isnan(cells.loc[(1, 2), "value"]) and math.isnan(cells.loc[(1, 1), "value"])


def test_heatmap_figure_labels_invalid_apart_from_no_fit_and_names_the_run():
    figure = plots.sweep_heatmap_figure(_table(), invalid_cells=[(4, 1)])
    axes = figure.axes[0]
    texts = [text.get_text() for text in axes.texts]
    assert texts.count("invalid") == 3 and "no fit\nneeds 95 GB" in texts and "error" in texts
    assert any(text.startswith("45.0%") for text in texts)
    hatched = [patch for patch in axes.patches if patch.get_hatch() == "xx"]
    assert len(hatched) == 3  # the three invalid cells, hatched; no-fit cells are plain grey
    assert axes.get_title() == "best MFU of fitting configurations\ngpt3, 64 GPUs, h100-sxm5-80gb, s = 2048"
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert legend == [
        "does not fit in memory", "every configuration raised",
        "invalid layout (the scenario rules reject it)",
    ]  # fmt: skip


def test_a_table_of_two_models_must_be_narrowed_first():
    """A best per cell over two models compares unlike runs: mixed_subject says so and
    select_rows narrows it; a bad column or value names what is allowed."""
    other = _table().assign(model="llama")
    both = pd.concat([_table(), other], ignore_index=True)
    problem = plots.mixed_subject(both)
    assert "several model values (gpt3, llama); choose one with --where model=VALUE" in problem
    assert plots.mixed_subject(plots.select_rows(both, {"model": "llama"})) is None
    assert len(plots.select_rows(both, {"model": "llama", "sequence_parallel": "true"})) == len(other)
    with pytest.raises(ValueError, match="--where: model=bert: no row has it; allowed: gpt3, llama"):
        plots.select_rows(both, {"model": "bert"})
    with pytest.raises(ValueError, match="--where: colour: no such column; allowed: tp, pp"):
        plots.select_rows(both, {"colour": "red"})


def _sweep_files(folder) -> None:
    """Two GPUs, tp {1, 2, 4}, pp {1, 2}: tp 4, and tp 2 with pp 2, need more than 2 GPUs,
    so they have no row; only the sweep's metadata says they were swept and rejected."""
    scenario = {
        "name": "tiny", "hardware": "a100-sxm4-80gb",
        "model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "seq_length": 128,
                  "vocab_size": 1024},
        "parallel": {"tp": 1, "pp": 1}, "training": {"micro_batch_size": 1, "global_batch_size": 4},
    }  # fmt: skip
    (folder / "tiny.yaml").write_text(yaml.safe_dump(scenario))
    spec = {"base": "tiny.yaml", "num_gpus": 2, "axes": {"tp": [1, 2, 4], "pp": [1, 2]}}
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec))


def test_cli_heatmap_marks_the_swept_but_rejected_tp_invalid(tmp_path, monkeypatch):
    """Through the CLI: the Parquet metadata brings tp 4 into the grid as invalid cells."""  # and (2, 2)
    _sweep_files(tmp_path)
    runner = CliRunner()
    out = tmp_path / "o.parquet"
    result = runner.invoke(app, ["sweep", str(tmp_path / "spec.yaml"), "--out", str(out), "--workers", "1",
                                 "--no-progress"])  # fmt: skip
    assert result.exit_code == 0, result.output
    drawn = []
    real = plots.sweep_heatmap_figure
    monkeypatch.setattr(plots, "sweep_heatmap_figure", lambda *a: drawn.append(a) or real(*a))
    result = runner.invoke(app, ["plot", "sweep-heatmap", str(out), "-o", str(tmp_path / "h.png")])
    assert result.exit_code == 0, result.output
    ((table, _, invalid),) = drawn
    assert sorted(invalid) == [(2, 2), (4, 1), (4, 2)] and 4 not in set(table["tp"])


def test_cli_heatmap_of_two_models_exits_2_without_where(tmp_path):
    table = tmp_path / "t.parquet"
    pd.concat([_table(), _table().assign(model="llama")], ignore_index=True).to_parquet(table)
    runner = CliRunner()
    result = runner.invoke(app, ["plot", "sweep-heatmap", str(table), "-o", str(tmp_path / "h.png")])
    assert result.exit_code == 2 and "choose one with --where model=VALUE" in result.output
    result = runner.invoke(app, ["plot", "sweep-heatmap", str(table), "-o", str(tmp_path / "h.png"),
                                 "--where", "model=llama"])  # fmt: skip
    assert result.exit_code == 0, result.output
