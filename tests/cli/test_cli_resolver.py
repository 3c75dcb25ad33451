"""Every command that reads a scenario takes what `run` takes (a path, or a shipped
scenario's name, with a did-you-mean otherwise: `config.shipped.resolve_scenario`), and the
same --hwprofiles; profile names and scenario keys get a did-you-mean too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config.errors import ConfigError
from simcluster.config.profiles import ENV_VAR
from simcluster.config.shipped import resolve_scenario
from tests.paths import ROOT

runner = CliRunner()
SHIPPED = "gpt-22b-sp-selective"
TINY = {
    "name": "tiny",
    "hardware": "my-gpu",
    "model": {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "seq_length": 128,
              "vocab_size": 1024},
    "parallel": {"tp": 1, "pp": 1},
    "training": {"micro_batch_size": 1, "global_batch_size": 4},
}  # fmt: skip

# each command that reads a scenario, as it is called with SCENARIO in place
COMMANDS = {
    "run": ["run", "SCENARIO"],
    "export-megatron": ["export-megatron", "SCENARIO"],
    "plan": ["plan", "SCENARIO", "--gpus", "8", "--no-progress"],
    "memory": ["memory", "SCENARIO"],
    "compare": ["compare", "SCENARIO", "SCENARIO"],
    "plot timeline": ["plot", "timeline", "SCENARIO", "-o", "t.png"],
}


@pytest.fixture(autouse=True)
def empty_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test runs from an empty folder, with no user profile folders."""
    monkeypatch.setenv(ENV_VAR, "")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _with(command: list[str], scenario: str) -> list[str]:
    return [scenario if word == "SCENARIO" else word for word in command]


def test_the_resolver(tmp_path: Path) -> None:
    """A file wins; a stem, a folder/stem and (for run) a folder name the shipped ones; a
    typo gets the closest shipped name; a shipped folder where a file is needed says so."""
    own = tmp_path / f"{SHIPPED}.yaml"
    own.write_text("x: 1\n")
    assert resolve_scenario(own) == own
    shipped = ROOT / f"scenarios/paper/{SHIPPED}.yaml"
    assert resolve_scenario(SHIPPED) == shipped and resolve_scenario(f"paper/{SHIPPED}") == shipped
    assert resolve_scenario("paper", folders=True) == ROOT / "scenarios/paper"
    with pytest.raises(ConfigError, match=f"nor a shipped scenario \\(did you mean '{SHIPPED}'\\?\\)"):
        resolve_scenario("gpt-22b-sp-selectiv")
    with pytest.raises(
        ConfigError, match="names a folder of shipped scenarios; give one of them, e.g. paper/"
    ):
        resolve_scenario("paper")
    with pytest.raises(ConfigError, match="nor a shipped scenario"):
        resolve_scenario("../hwprofiles/a100-sxm4-80gb")


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_every_command_says_did_you_mean(command: list[str]) -> None:
    """A misspelt shipped name: exit 2 with the closest name, before any work."""
    result = runner.invoke(app, _with(command, "gpt-22b-sp-selectiv"))
    assert result.exit_code == 2, result.output
    assert f"nor a shipped scenario (did you mean '{SHIPPED}'?)" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name", ["run", "export-megatron", "memory", "compare"])
def test_quick_commands_take_a_shipped_name(name: str) -> None:
    """From an empty folder (plan and plot timeline too, in the wheel test)."""
    result = runner.invoke(app, _with(COMMANDS[name], SHIPPED))
    assert result.exit_code == 0, result.output
    assert "gpt-22b" in result.output or "--num-layers 48" in result.output


@pytest.mark.parametrize("name", ["plan", "compare", "memory", "export-megatron", "plot timeline"])
def test_every_command_takes_hwprofiles(tmp_path: Path, name: str) -> None:
    """A scenario naming a profile found only in --hwprofiles DIR: each command finds it
    (without the option, exit 2 naming the profile)."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    shutil.copy(ROOT / "hwprofiles/a100-sxm4-80gb.yaml", profiles / "my-gpu.yaml")
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(TINY))
    command = _with(COMMANDS[name], str(scenario))
    command = [("2" if word == "8" else word) for word in command]  # plan: a tiny model on 2 GPUs
    missing = runner.invoke(app, command)
    assert missing.exit_code == 2 and "'my-gpu': unknown hardware profile" in missing.output
    found = runner.invoke(app, [*command, "--hwprofiles", str(profiles)])
    assert found.exit_code == 0, found.output
    # the copy's name: is the shipped a100 profile's, so stderr names the file read
    assert f"is read from {profiles / 'my-gpu.yaml'}, not the shipped a100-sxm4-80gb.yaml" in found.stderr


def test_hardware_prefix_gets_did_you_mean() -> None:
    """`--hardware h100` is no profile name, but the start of one."""
    result = runner.invoke(app, ["run", SHIPPED, "--hardware", "h100"])
    assert result.exit_code == 2, result.output
    assert "'h100': unknown hardware profile (did you mean 'h100-sxm5-80gb'?)" in result.output


def test_misspelt_scenario_keys_get_did_you_mean(tmp_path: Path) -> None:
    """`tpp` in parallel, `modle` at the top: each names the key it is closest to there."""
    data = yaml.safe_load((ROOT / f"scenarios/paper/{SHIPPED}.yaml").read_text())
    data["parallel"]["tpp"] = data["parallel"].pop("tp")
    data["modle"] = data.pop("model")
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["run", str(path)])
    assert result.exit_code == 2, result.output
    assert "parallel.tpp: unknown key (value 8); did you mean 'tp'?" in result.output
    assert "modle: unknown key" in result.output and "did you mean 'model'?" in result.output


def test_run_json_is_clean_with_the_note_on_stderr(tmp_path: Path) -> None:
    """The file note goes to stderr, so --json on stdout still parses."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    shutil.copy(ROOT / "hwprofiles/a100-sxm4-80gb.yaml", profiles / "my-gpu.yaml")
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(TINY))
    result = runner.invoke(app, ["run", str(scenario), "--json", "--hwprofiles", str(profiles)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["hardware"] == "a100-sxm4-80gb" and "note:" in result.stderr
