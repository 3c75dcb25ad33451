"""One rule for every output path (`simcluster.output_files`): an existing file is refused
unless --force (the error names the flag), and an input of the same command is never an
output, even with --force. One test (or two) per command that writes a file; `sweep --out`
is in tests/sweep/test_sweep_targets.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config.profiles import ENV_VAR
from simcluster.output_files import OutputPathError, check_output_file
from tests.cli.no_work import no_work
from tests.paths import ROOT

runner = CliRunner()
MINIMAL = "--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --micro-batch-size 2"
TINY = {
    "hardware": "gpu.yaml",
    "model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "seq_length": 128,
              "vocab_size": 1024},
    "parallel": {"tp": 1, "pp": 2},
    "training": {"micro_batch_size": 1, "global_batch_size": 4},
}  # fmt: skip
KEEP = "keep me\n"


@pytest.fixture(autouse=True)
def no_user_folders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "")


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    """A tiny scenario naming its profile by path (gpu.yaml beside it): both are inputs."""
    shutil.copy(ROOT / "hwprofiles/a100-sxm4-80gb.yaml", tmp_path / "gpu.yaml")
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY))
    return path


@pytest.fixture
def existing(tmp_path: Path) -> Path:
    path = tmp_path / "existing.out"
    path.write_text(KEEP)
    return path


def _refused_existing(result, path: Path, option: str) -> None:
    assert result.exit_code == 2, result.output
    assert f"{path}: {option}: exists; refusing to overwrite it" in result.output
    assert "add --force to replace it" in result.output


def _refused_input(result, path: Path, option: str) -> None:
    assert result.exit_code == 2, result.output
    assert f"{path}: {option}: is an input of this command" in result.output
    assert "even with --force" in result.output


def test_the_rule_in_one_place(tmp_path: Path, existing: Path) -> None:
    """New file: fine. Existing: refused unless force. An input, spelt through `..` or a
    symbolic link or a hard link: refused even with force."""
    assert check_output_file(tmp_path / "new.json", "--out") == tmp_path / "new.json"
    with pytest.raises(OutputPathError, match="exists; refusing to overwrite it.*--force"):
        check_output_file(existing, "--out")
    assert check_output_file(existing, "--out", force=True) == existing
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.out").symlink_to(existing)
    os.link(existing, tmp_path / "hard.out")
    for spelling in (tmp_path / "sub" / ".." / existing.name, tmp_path / "link.out", tmp_path / "hard.out"):
        with pytest.raises(OutputPathError, match="is an input of this command"):
            check_output_file(spelling, "--out", force=True, inputs=[existing])
    assert existing.read_text() == KEEP


def test_run_trace_over_a_file_needs_force(scenario: Path, existing: Path, monkeypatch) -> None:
    no_work(monkeypatch, "simcluster.simulation.run_simulation")
    _refused_existing(
        runner.invoke(app, ["run", str(scenario), "--trace", str(existing)]), existing, "--trace"
    )
    assert existing.read_text() == KEEP


def test_run_trace_with_force_replaces_it(scenario: Path, existing: Path) -> None:
    result = runner.invoke(app, ["run", str(scenario), "--trace", str(existing), "--force"])
    assert result.exit_code == 0, result.output
    assert json.loads(existing.read_text())["traceEvents"]


@pytest.mark.parametrize("target", ["tiny.yaml", "gpu.yaml"])
def test_run_trace_never_replaces_the_scenario_or_its_profile(scenario: Path, target: str) -> None:
    """`run A.yaml --trace A.yaml` turned the scenario into trace JSON; the profile it names
    is an input as well."""
    path = scenario.parent / target
    before = path.read_text()
    result = runner.invoke(app, ["run", str(scenario), "--trace", str(path), "--force"])
    _refused_input(result, path, "--trace")
    assert path.read_text() == before


def test_import_megatron_out(tmp_path: Path, existing: Path) -> None:
    """An existing --out is refused (untouched), replaced with --force."""
    _refused_existing(
        runner.invoke(app, ["import-megatron", MINIMAL, "--out", str(existing)]), existing, "--out"
    )
    assert existing.read_text() == KEEP
    result = runner.invoke(app, ["import-megatron", MINIMAL, "--out", str(existing), "--force"])
    assert result.exit_code == 0, result.output
    assert "num_layers: 8" in existing.read_text()


def test_calibrate_out_is_checked_before_measuring(existing: Path, monkeypatch) -> None:
    no_work(monkeypatch, "simcluster.cli.calibrate.require_device")
    result = runner.invoke(app, ["calibrate", "--device", "cpu", "--quick", "--out", str(existing)])
    _refused_existing(result, existing, "--out")
    assert existing.read_text() == KEEP


def test_calibrate_never_writes_over_its_base_profile(tmp_path: Path, monkeypatch) -> None:
    """--base P --out P --force: P is an input (its network section is kept)."""
    no_work(monkeypatch, "simcluster.cli.calibrate.require_device")
    profile = tmp_path / "mine.yaml"
    shutil.copy(ROOT / "hwprofiles/a100-sxm4-80gb.yaml", profile)
    before = profile.read_text()
    args = [
        "calibrate",
        "--device",
        "cpu",
        "--quick",
        "--base",
        str(profile),
        "--out",
        str(profile),
        "--force",
    ]
    _refused_input(runner.invoke(app, args), profile, "--out")
    assert profile.read_text() == before


def test_calibrate_two_outputs_are_two_files(tmp_path: Path, monkeypatch) -> None:
    no_work(monkeypatch, "simcluster.cli.calibrate.require_device")
    out = tmp_path / "p.yaml"
    args = ["calibrate", "--device", "cpu", "--quick", "--out", str(out), "--save-measurements", str(out)]
    _refused_input(runner.invoke(app, args), out, "--save-measurements")


def test_check_profile_reports_are_not_replaced_without_force(tmp_path: Path, monkeypatch) -> None:
    """check-profile writes <profile>-<device>.csv and .md into --out-dir: an earlier
    report there is refused before measuring."""
    no_work(monkeypatch, "simcluster.cli.check_profile.require_device")
    report = tmp_path / "a100-sxm4-80gb-cpu.md"
    report.write_text(KEEP)
    args = ["check-profile", "a100-sxm4-80gb", "--device", "cpu", "--quick", "--out-dir", str(tmp_path)]
    _refused_existing(runner.invoke(app, args), report, "--out-dir")
    assert report.read_text() == KEEP


def test_check_profile_never_saves_over_the_profile(tmp_path: Path, monkeypatch) -> None:
    no_work(monkeypatch, "simcluster.cli.check_profile.require_device")
    profile = tmp_path / "mine.yaml"
    shutil.copy(ROOT / "hwprofiles/a100-sxm4-80gb.yaml", profile)
    args = ["check-profile", str(profile), "--device", "cpu", "--quick", "--out-dir", str(tmp_path / "r"),
            "--save-measurements", str(profile), "--force"]  # fmt: skip
    _refused_input(runner.invoke(app, args), profile, "--save-measurements")


def test_plot_out_over_a_figure_needs_force(tmp_path: Path, monkeypatch) -> None:
    figure = tmp_path / "ladder.svg"
    figure.write_text(KEEP)
    _refused_existing(runner.invoke(app, ["plot", "memory-ladder", "-o", str(figure)]), figure, "--out")
    assert figure.read_text() == KEEP
    result = runner.invoke(app, ["plot", "memory-ladder", "-o", str(figure), "--force"])
    assert result.exit_code == 0, result.output
    assert figure.read_text().lstrip().startswith("<?xml")


def test_plot_never_draws_over_its_input(tmp_path: Path, scenario: Path, monkeypatch) -> None:
    """A sweep table or a scenario named as the figure: refused even with --force (the
    figure format is checked first, so the inputs carry a figure suffix here)."""
    no_work(monkeypatch, "simcluster.simulation.run_simulation")
    table = tmp_path / "table.svg"
    table.write_text(KEEP)
    for command in (["sweep-heatmap", str(table)], ["pareto", str(table)]):
        _refused_input(runner.invoke(app, ["plot", *command, "-o", str(table), "--force"]), table, "--out")
    assert table.read_text() == KEEP
    svg_scenario = scenario.with_suffix(".svg")
    shutil.copy(scenario, svg_scenario)
    result = runner.invoke(app, ["plot", "timeline", str(svg_scenario), "-o", str(svg_scenario), "--force"])
    _refused_input(result, svg_scenario, "--out")
