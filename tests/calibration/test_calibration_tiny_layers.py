"""Tiny-layer runs measured apart from the microbench (`calibration.tiny_layers`,
`calibrate --tiny-layers`): the eager tiny layers of the 2026-11-27 follow-up
(docs/calibration/h100-2026-11-27-script/followup.json) give the 2026-11-26 eager microbench
its host terms, and the profile declares the two machines."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simcluster.calibration.host_fit import checkpoint_host, tiny_layer_per_op_s
from simcluster.calibration.profile import build_profile
from simcluster.calibration.records import Measurements
from simcluster.calibration.tiny_layers import declare, with_tiny_layers
from simcluster.cli import app

DOCS = Path(__file__).resolve().parents[2] / "docs" / "calibration"
MICROBENCH = DOCS / "h100-2026-11-26" / "microbench.json"
FOLLOWUP = DOCS / "h100-2026-11-27-script" / "followup.json"


@pytest.fixture(scope="module")
def followup() -> dict:
    return json.loads(FOLLOWUP.read_text())


def test_the_runs_replace_the_microbenchs_and_give_checkpoint_terms(
    eager: Measurements, followup: dict
) -> None:
    """The committed microbench kept only the median (no checkpoint term); with the 12 eager
    runs the per-op cost is the median of the four runs without a checkpoint and the fit finds
    a positive checkpoint term."""
    assert eager.tiny_layers == [] and checkpoint_host(eager) is None
    meas, provenance = with_tiny_layers(eager, FOLLOWUP.read_text(), "followup.json")
    rows = followup["tiny_layers_eager"]
    assert len(meas.tiny_layers) == len(rows) == 12 and provenance["field"] == "tiny_layers_eager"
    plain = [r["total_s"] / r["priced_ops"] for r in rows if r["checkpoints"] == 0]
    assert len(plain) == 4 and tiny_layer_per_op_s(meas) == pytest.approx(statistics.median(plain))
    assert meas.layer_overhead_s == pytest.approx(
        statistics.median(r["total_s"] / r["priced_ops"] for r in rows)
    )
    host = checkpoint_host(meas)
    assert host is not None and host.per_checkpoint_s > 0
    # the kernels are untouched
    assert meas.gemms == eager.gemms and meas.elementwise == eager.elementwise


def test_the_profile_declares_the_two_machines(eager: Measurements) -> None:
    meas, provenance = with_tiny_layers(eager, FOLLOWUP.read_text(), "followup.json")
    doc = declare(build_profile(meas), provenance, host_graph=False)
    tiny = doc["calibration"]["tiny_layers"]
    assert tiny["date"] == "2026-11-27" and doc["provenance"]["date"] == "2026-11-26"
    assert tiny["machines"].startswith("mixed:") and "differing: date" in tiny["machines"]
    source = doc["compute"]["sources"]["host_issue_us_per_op"]
    assert "followup.json" in source and "mixed:" in source
    assert doc["compute"]["host_issue_us_per_op"] == pytest.approx(tiny_layer_per_op_s(meas) * 1e6, abs=0.01)
    assert doc["calibration"]["host_issue"]["checkpoint_us"] > 0


def test_one_device_record_is_not_called_mixed(eager: Measurements, followup: dict) -> None:
    same = {**followup, "device": {**followup["device"], "date": eager.device.date}}
    _, provenance = with_tiny_layers(eager, json.dumps(same), "same.json")
    assert provenance["machines"].startswith("one device record")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: {**d, "device": {**d["device"], "name": "NVIDIA A100-SXM4-80GB"}}, "same kind of GPU"),
        (lambda d: {k: v for k, v in d.items() if k != "tiny_layers_eager"}, "'tiny_layers_eager': missing"),
        (
            lambda d: {**d, "tiny_layers_eager": [{**d["tiny_layers_eager"][0], "ops": 3}]},
            "tiny_layers_eager[0]",
        ),
        (
            lambda d: {**d, "tiny_layers_eager": [{**d["tiny_layers_eager"][0], "total_s": 0.0}]},
            "must be > 0",
        ),
        (
            lambda d: {**d, "tiny_layers_eager": [r for r in d["tiny_layers_eager"] if r["checkpoints"]]},
            "no run without a checkpoint",
        ),
    ],
)
def test_bad_files_are_refused_naming_the_field(
    eager: Measurements, followup: dict, change, message: str
) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        with_tiny_layers(eager, json.dumps(change(followup)), "f.json")


def test_a_microbench_of_the_same_mode_is_read_by_its_tiny_layers(
    eager: Measurements, followup: dict
) -> None:
    """A microbench JSON keeps its runs under `tiny_layers`, in its own `layer_mode`: read when
    that is the measurement's mode, refused when it is not."""
    doc = {"device": followup["device"], "layer_mode": "eager", "tiny_layers": followup["tiny_layers_eager"]}
    meas, provenance = with_tiny_layers(eager, json.dumps(doc), "mb.json")
    assert provenance["field"] == "tiny_layers" and len(meas.tiny_layers) == 12
    with pytest.raises(ValueError, match="layer_mode eager"):
        with_tiny_layers(eager, json.dumps({**doc, "layer_mode": "fused"}), "mb.json")


def test_calibrate_takes_the_tiny_layers(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    args = ["calibrate", "--measurements", str(MICROBENCH), "--tiny-layers", str(FOLLOWUP), "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "host terms: 12 tiny-layer runs" in result.output and "mixed:" in result.output
    profile = yaml.safe_load(out.read_text())
    assert profile["calibration"]["tiny_layers"]["file"] == str(FOLLOWUP)
    assert profile["calibration"]["host_issue"]["checkpoint_us"] > 0


def test_calibrate_refuses_saving_mixed_measurements_and_bad_files(tmp_path: Path) -> None:
    base = ["calibrate", "--measurements", str(MICROBENCH), "--out", str(tmp_path / "p.yaml")]
    saved = CliRunner().invoke(
        app, [*base, "--tiny-layers", str(FOLLOWUP), "--save-measurements", str(tmp_path / "m.json")]
    )
    assert saved.exit_code == 2 and "--save-measurements" in saved.output
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"device": {"name": "NVIDIA H100 80GB HBM3"}}))
    result = CliRunner().invoke(app, [*base, "--tiny-layers", str(bad)])
    assert result.exit_code == 2 and "--tiny-layers" in result.output and "tiny_layers_eager" in result.output
    assert not (tmp_path / "p.yaml").exists()


def test_with_a_host_graph_the_tiny_layers_give_the_checkpoint_terms(eager: Measurements) -> None:
    """`--host-graph` keeps its per-op cost; the tiny layers' file is named for the checkpoint terms."""
    host_graph = json.loads((DOCS / "h100-2026-11-26-script" / "host_graph.json").read_text())
    meas, provenance = with_tiny_layers(eager, FOLLOWUP.read_text(), "followup.json")
    plain = build_profile(meas, host_graph=host_graph)
    doc = declare(plain, provenance, host_graph=True)
    assert doc["compute"]["host_issue_us_per_op"] == plain["compute"]["host_issue_us_per_op"]
    source = doc["compute"]["sources"]["host_issue_us_per_op"]
    assert source.startswith(plain["compute"]["sources"]["host_issue_us_per_op"])
    assert "checkpoint terms (calibration.host_issue) from tiny-layer runs from followup.json" in source
    assert doc["calibration"]["host_issue"]["checkpoint_us"] > 0
