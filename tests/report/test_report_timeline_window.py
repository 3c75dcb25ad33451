"""A long pipeline timeline stays readable: each span knows its microbatch, a window of
microbatches or seconds is drawn alone (spans cut to it), and the recompute part of a
backward is hatched as well as coloured."""

import json

import pytest
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config import parse_scenario
from simcluster.config.hardware import load_hardware
from simcluster.report import plots
from simcluster.simulation import run_simulation

# 2 stages, 8 microbatches (global batch 8, micro batch 1, dp 1), selective recompute.
TINY = {
    "hardware": "a100-sxm4-80gb",
    "model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "seq_length": 128,
              "vocab_size": 1024},
    "parallel": {"tp": 2, "pp": 2, "sequence_parallel": True},
    "training": {"micro_batch_size": 1, "global_batch_size": 8, "recompute": "selective"},
}  # fmt: skip


@pytest.fixture(scope="module")
def frame():
    scenario = parse_scenario(TINY, "tiny")
    return plots.timeline_frame(run_simulation(scenario, load_hardware("a100-sxm4-80gb"), record=True))


def test_each_task_span_knows_its_microbatch(frame):
    """F3.0 and 'B3.0 recompute' are microbatch 3; idle and the optimizer belong to none."""
    tasks = frame[frame["category"].isin(["forward", "backward", "recompute"])]
    assert sorted(set(tasks["microbatch"])) == list(range(8))
    assert (tasks["microbatch"] == tasks["name"].str.slice(1).str.split(".").str[0].astype(int)).all()
    assert (frame.loc[frame["category"].isin(["idle", "optimizer"]), "microbatch"] == -1).all()


def test_microbatch_window_spans_their_first_forward_to_their_last_backward(frame):
    start_s, end_s = plots.microbatch_window_s(frame, 2, 3)
    chosen = frame[frame["microbatch"].isin([2, 3])]
    assert start_s == chosen["start_s"].min() == frame.loc[frame["name"] == "F2.0", "start_s"].min()
    assert end_s == (chosen["start_s"] + chosen["duration_s"]).max()
    with pytest.raises(ValueError, match="--microbatches: value 8:9: the run has microbatches 0 to 7"):
        plots.microbatch_window_s(frame, 8, 9)


def test_clipped_window_still_tiles_each_stage(frame):
    """Cut to [a, b], each stage's spans sum to b − a (they tiled the whole iteration)."""
    end_s = float((frame["start_s"] + frame["duration_s"]).max())
    a, b = 0.3 * end_s, 0.6 * end_s
    window = plots.clip_timeline(frame, a, b)
    assert (window["start_s"] >= a).all() and (window["start_s"] + window["duration_s"] <= b + 1e-15).all()
    for _, spans in window.groupby("stage"):
        assert spans["duration_s"].sum() == pytest.approx(b - a)
    with pytest.raises(ValueError, match="the start must be before the end"):
        plots.clip_timeline(frame, b, a)


def test_window_figure_zooms_hatches_recompute_and_labels_tasks(frame):
    """The axes span the window; recompute bars carry the hatch, no other category does;
    the chosen microbatches' wide bars are labelled with their task name; the others fade."""
    window = plots.microbatch_window_s(frame, 2, 3)
    figure = plots.timeline_figure(frame, "t", window, highlight=(2, 3))
    axes = figure.axes[0]
    assert axes.get_xlim() == pytest.approx(window)
    hatches = {coll.get_label(): coll.get_hatch() for coll in axes.collections if coll.get_label()[:1] != "_"}
    assert hatches["recompute"] == plots.TIMELINE_HATCHES["recompute"]
    assert all(hatch is None for label, hatch in hatches.items() if label != "recompute")
    labels = {text.get_text() for text in axes.texts}
    assert labels and {int(label[1:].split(".")[0]) for label in labels} <= {2, 3}
    assert any(coll.get_alpha() == 0.3 for coll in axes.collections)


def _plot(tmp_path, *options):
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(json.dumps(TINY))
    out = str(tmp_path / "t.png")
    # --force: each call draws over the figure of the call before
    return CliRunner().invoke(app, ["plot", "timeline", str(scenario), "-o", out, "--force", *options])


def test_cli_timeline_window_options(tmp_path):
    """--microbatches A:B and --window-s A:B draw; bad or conflicting values exit 2 naming the option."""
    assert _plot(tmp_path, "--microbatches", "2:3").exit_code == 0
    assert _plot(tmp_path, "--window-s", "0.0:0.001").exit_code == 0
    for options, message in [
        (("--microbatches", "3"), "--microbatches: value '3': give A:B"),
        (("--microbatches", "5:2"), "--microbatches: value '5:2': needs 0 <= A <= B"),
        (("--microbatches", "20:30"), "the run has microbatches 0 to 7"),
        (("--window-s", "100:200"), "--window-s: value '100:200': the iteration ends at"),
        (("--window-s", "0:1", "--microbatches", "1:2"), "give one of them"),
    ]:
        result = _plot(tmp_path, *options)
        assert result.exit_code == 2 and message in result.output, (options, result.output)
