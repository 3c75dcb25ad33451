"""CLI: `--hwprofiles DIR`, a shipped scenario by name, profile errors against the scenario
file, and `--version`."""

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.cli.version import installed_version
from simcluster.config.profiles import ENV_VAR
from tests.paths import ROOT

runner = CliRunner()
SCENARIO = ROOT / "scenarios/paper/gpt-22b-sp-selective.yaml"


@pytest.fixture(autouse=True)
def no_user_folders(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--hwprofiles` sets $SIMCLUSTER_HWPROFILES for the process: restore it after each test."""
    monkeypatch.setenv(ENV_VAR, "")


def _scenario_naming(folder: Path, hardware: str) -> Path:
    path = folder / "s.yaml"
    path.write_text(SCENARIO.read_text().replace("hardware: a100-sxm4-80gb", f"hardware: {hardware}"))
    return path


def test_hwprofiles_folder_is_searched(tmp_path: Path) -> None:
    """A scenario naming a profile that lives only in --hwprofiles DIR runs with it."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    shutil.copy(ROOT / "hwprofiles/h100-sxm5-80gb.yaml", profiles / "my-gpu.yaml")
    path = _scenario_naming(tmp_path, "my-gpu")
    assert runner.invoke(app, ["run", str(path)]).exit_code == 2
    result = runner.invoke(app, ["run", str(path), "--json", "--hwprofiles", str(profiles)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["hardware"] == "h100-sxm5-80gb"
    # the copy's `name:` is the shipped profile's: stderr says which file was read
    assert (
        f"note: hardware profile 'h100-sxm5-80gb' is read from {profiles / 'my-gpu.yaml'}, "
        "not the shipped h100-sxm5-80gb.yaml"
    ) in result.stderr
    shipped = runner.invoke(app, ["run", str(SCENARIO), "--json"])
    assert shipped.exit_code == 0 and "note:" not in shipped.stderr


def test_hwprofiles_must_be_a_folder(tmp_path: Path) -> None:
    result = runner.invoke(app, ["run", str(SCENARIO), "--hwprofiles", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "--hwprofiles: value" in result.output and "not a folder" in result.output


def test_unknown_profile_names_the_scenario_file(tmp_path: Path) -> None:
    """`error: <scenario file>:` (not its folder), the value and a did-you-mean."""
    path = _scenario_naming(tmp_path, "h100-sxm5-80g")
    result = runner.invoke(app, ["run", str(path)])
    assert result.exit_code == 2
    assert f"error: {path}: invalid configuration" in result.output
    assert "'h100-sxm5-80g': unknown hardware profile (did you mean 'h100-sxm5-80gb'?)" in result.output


def test_a_shipped_scenario_runs_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From any folder, `run gpt-22b-sp-selective` is the shipped file; a bad name says so."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["run", "gpt-22b-sp-selective", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["scenario"] == "gpt-22b-sp-selective"
    missing = runner.invoke(app, ["run", "gpt-22b-sp-selectiv"])
    assert missing.exit_code == 2 and "nor a shipped scenario" in missing.output


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"simcluster {installed_version()}\n"
