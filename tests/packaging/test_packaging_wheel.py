"""A plain install works: the wheel carries the profiles and the paper's scenarios, and runs a
shipped scenario by name from a folder that is not the repository."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.paths import ROOT

SOURCES = ("simcluster", "hwprofiles", "scenarios", "setup.py", "pyproject.toml", "README.md")


def _pip(*args: str, cwd: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel, target folder): built from a copy of the sources (the checkout stays clean),
    offline, and installed with `pip install --no-deps --target`."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "reports")
            )
        else:
            source.mkdir(exist_ok=True)
            shutil.copy(ROOT / name, source / name)
    _pip(
        "wheel",
        str(source),
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-q",
        "-w",
        str(root),
        cwd=root,
    )
    (wheel,) = root.glob("simcluster-*.whl")
    target = root / "target"
    _pip("install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel), cwd=root)
    return wheel, target


def _simcluster(target: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m simcluster ARGS` seeing the installed copy and this venv's dependencies only."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("SIMCLUSTER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(target), sysconfig.get_paths()["purelib"]])
    return subprocess.run(
        [sys.executable, "-m", "simcluster", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_wheel_carries_the_profiles_and_scenarios(installed: tuple[Path, Path]) -> None:
    """Every top-level profile and scenario is in the wheel under simcluster/, once."""
    names = zipfile.ZipFile(installed[0]).namelist()
    profiles = {f"simcluster/hwprofiles/{p.name}" for p in (ROOT / "hwprofiles").glob("*.yaml")}
    scenarios = {
        f"simcluster/scenarios/{p.relative_to(ROOT / 'scenarios')}"
        for p in (ROOT / "scenarios").rglob("*.yaml")
    }
    assert profiles and scenarios and (profiles | scenarios) <= set(names)
    assert not [name for name in names if name.startswith(("hwprofiles/", "scenarios/"))]


def test_the_installed_copy_runs_from_another_folder(installed: tuple[Path, Path], tmp_path: Path) -> None:
    """From an empty folder: a shipped scenario by name, and the user's scenario naming a shipped
    profile by stem, both simulate with the installed copy; --version names the version."""
    target = installed[1]
    where = _simcluster(target, tmp_path, "run", "gpt3-175b-sp-selective", "--json")
    assert where.returncode == 0, where.stderr
    result = json.loads(where.stdout)
    assert result["scenario"] == "gpt3-175b-sp-selective" and result["num_gpus"] == 64
    scenario = (ROOT / "scenarios/paper/gpt-22b-sp-selective.yaml").read_text()
    (tmp_path / "mine.yaml").write_text(scenario.replace("name:", "# name:"))
    mine = _simcluster(target, tmp_path, "run", "mine.yaml", "--json")
    assert mine.returncode == 0, mine.stderr
    assert json.loads(mine.stdout)["iteration_time_s"] > 0
    version = _simcluster(target, tmp_path, "--version")
    declared = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert declared and version.stdout.strip() == f"simcluster {declared.group(1)}"
    origin = subprocess.run(
        [sys.executable, "-c", "import simcluster; print(simcluster.__file__)"],
        cwd=tmp_path,
        env={"PYTHONPATH": os.pathsep.join([str(target), sysconfig.get_paths()["purelib"]])},
        capture_output=True,
        text=True,
    )
    assert Path(origin.stdout.strip()).is_relative_to(target)


SHIPPED = "gpt-22b-sp-selective"
EVERY_COMMAND = {
    "export-megatron": ["export-megatron", SHIPPED, "--json"],
    "plan": ["plan", SHIPPED, "--gpus", "8", "--top", "1", "--no-progress", "--json"],
    "memory": ["memory", SHIPPED, "--json"],
    "compare": ["compare", SHIPPED, "gpt-22b-full-recompute", "--json"],
    "plot timeline": ["plot", "timeline", SHIPPED, "-o", "timeline.png"],
}


@pytest.mark.parametrize("command", EVERY_COMMAND.values(), ids=EVERY_COMMAND.keys())
def test_every_command_takes_a_shipped_name_from_an_empty_folder(
    installed: tuple[Path, Path], tmp_path: Path, command: list[str]
) -> None:
    """What `run` takes, every command that reads a scenario takes, with the installed copy
    (the wheel is built once for the module): each answers, and the figure is written."""
    done = _simcluster(installed[1], tmp_path, *command)
    assert done.returncode == 0, done.stderr
    if command[0] == "plot":
        assert (tmp_path / "timeline.png").stat().st_size > 0
    else:
        assert json.loads(done.stdout)


def test_a_sweep_base_may_be_a_shipped_name(installed: tuple[Path, Path], tmp_path: Path) -> None:
    """A spec in an empty folder whose base is a shipped scenario's name sweeps it."""
    (tmp_path / "spec.yaml").write_text(f"base: {SHIPPED}\naxes:\n  recompute: [selective, full]\n")
    done = _simcluster(installed[1], tmp_path, "sweep", "spec.yaml", "--out", "t.parquet", "--workers", "1",
                       "--no-progress", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) and (tmp_path / "t.parquet").is_file()
