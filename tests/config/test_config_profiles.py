"""Finding a hardware profile: the search path (--hwprofiles, $SIMCLUSTER_HWPROFILES, shipped),
errors against the scenario file with a did-you-mean, and names that are never paths."""

import os
import shutil
from pathlib import Path

import pytest
import yaml

from simcluster.config import ConfigError, load_scenario_and_hardware
from simcluster.config.hardware import load_hardware
from simcluster.config.profiles import ENV_VAR, find_profile, known_profiles, search_path
from simcluster.config.shipped import shipped_dir, shipped_scenario
from tests.paths import ROOT

SCENARIO = {
    "model": {
        "num_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "seq_length": 128,
        "vocab_size": 1000,
    },
    "parallel": {"tp": 2, "pp": 2},
    "training": {"micro_batch_size": 1, "global_batch_size": 8},
}


@pytest.fixture(autouse=True)
def no_user_folders(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from the shipped profiles only, whatever the caller's environment
    (an empty variable names no folder; the caller's value comes back after the test)."""
    monkeypatch.setenv(ENV_VAR, "")


def _scenario(folder: Path, hardware: str) -> Path:
    path = folder / "s.yaml"
    path.write_text(yaml.safe_dump({"hardware": hardware, **SCENARIO}))
    return path


def test_a_checkout_reads_the_top_level_folders() -> None:
    """From a source checkout the shipped profiles and scenarios are the repository's folders."""
    assert shipped_dir("hwprofiles") == ROOT / "hwprofiles"
    assert known_profiles() == sorted(p.stem for p in (ROOT / "hwprofiles").glob("*.yaml"))
    assert shipped_scenario("gpt3-175b-sp-selective") == ROOT / "scenarios/paper/gpt3-175b-sp-selective.yaml"
    assert shipped_scenario("paper") == ROOT / "scenarios/paper"
    assert shipped_scenario("../hwprofiles") is None and shipped_scenario("no-such-scenario") is None


def test_search_order_is_option_then_environment_then_shipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--hwprofiles folders come first, then $SIMCLUSTER_HWPROFILES's (in order), then shipped."""
    a, b, c = (tmp_path / name for name in "abc")
    monkeypatch.setenv(ENV_VAR, f"{b}{os.pathsep}{c}")
    assert search_path([a]) == [a, b, c, ROOT / "hwprofiles"]


def test_a_user_folder_shadows_a_shipped_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first folder holding a name wins: the public A100 saved as `a100-sxm4-80gb` is used."""
    shutil.copy(ROOT / "hwprofiles/a100-sxm4-80gb-public.yaml", tmp_path / "a100-sxm4-80gb.yaml")
    assert load_hardware("a100-sxm4-80gb").provenance.kind == "fitted"
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert load_hardware("a100-sxm4-80gb").provenance.kind != "fitted"
    assert load_hardware("a100-sxm4-80gb", extra=[tmp_path]) == load_hardware("a100-sxm4-80gb-public")


def test_a_profile_only_in_a_user_folder_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new name is found in $SIMCLUSTER_HWPROFILES and listed with the shipped ones."""
    shutil.copy(ROOT / "hwprofiles/h100-sxm5-80gb.yaml", tmp_path / "my-gpu.yaml")
    with pytest.raises(ConfigError):
        find_profile("my-gpu")
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert find_profile("my-gpu") == tmp_path / "my-gpu.yaml"
    assert "my-gpu" in known_profiles() and "a100-sxm4-80gb" in known_profiles()


def test_an_unknown_name_is_reported_against_the_scenario_with_a_suggestion(tmp_path: Path) -> None:
    """The error names the scenario file (not its folder), the field and value, the closest
    known name and where it looked."""
    path = _scenario(tmp_path, "a100-sxm4-80gbb")
    with pytest.raises(ConfigError) as caught:
        load_scenario_and_hardware(path)
    assert caught.value.source == str(path)
    (problem,) = caught.value.problems
    assert problem.startswith("hardware: value 'a100-sxm4-80gbb': unknown hardware profile")
    assert "did you mean 'a100-sxm4-80gb'?" in problem and str(ROOT / "hwprofiles") in problem


def test_a_name_is_never_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`hardware: ../secret` beside a profile folder is refused before any file is read, and
    the file's contents are not echoed."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (tmp_path / "secret.yaml").write_text("password: hunter2\n")
    monkeypatch.setenv(ENV_VAR, str(profiles))
    for reference in ("../secret", "profiles/../secret", "/etc/passwd", "..", "a\\b"):
        with pytest.raises(ConfigError) as caught:
            load_scenario_and_hardware(_scenario(profiles, reference))
        message = str(caught.value)
        assert "not a profile name" in message and "hunter2" not in message, message


def test_a_path_to_a_yaml_is_relative_to_the_scenario(tmp_path: Path) -> None:
    """`hardware: ../x.yaml` is a path (it ends in .yaml), from the scenario's folder."""
    (tmp_path / "scenarios").mkdir()
    shutil.copy(ROOT / "hwprofiles/h100-sxm5-80gb.yaml", tmp_path / "x.yaml")
    _, profile = load_scenario_and_hardware(_scenario(tmp_path / "scenarios", "../x.yaml"))
    assert profile == load_hardware("h100-sxm5-80gb")
    with pytest.raises(ConfigError, match="no profile file at"):
        load_scenario_and_hardware(_scenario(tmp_path / "scenarios", "missing.yaml"))


def test_a_long_bad_name_is_cut_in_the_error(tmp_path: Path) -> None:
    """A hostile reference is not repeated in full."""
    with pytest.raises(ConfigError) as caught:
        load_scenario_and_hardware(_scenario(tmp_path, "../" + "x" * 10_000))
    assert len(str(caught.value)) < 500


def test_a_missing_user_folder_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$SIMCLUSTER_HWPROFILES naming no folder is reported, not silently skipped."""
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=f"{ENV_VAR}: value .*nope.*: not a folder"):
        load_hardware("a100-sxm4-80gb")
