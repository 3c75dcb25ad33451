"""Reproducible installs: `.ci/constraints.txt` pins every dependency the README's set-up installs,
each pin lies inside pyproject.toml's range, and `.ci/run` runs exactly the README's test command."""

from __future__ import annotations

import re

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.paths import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the pins were taken on 3.11

EXTRAS = ("torch", "test", "dask")  # what the README's commands install: -e ".[torch,test,dask]"


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / ".ci" / "constraints.txt").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        key = canonicalize_name(name)
        assert key not in pins, f"constraints.txt pins {name} twice"
        pins[key] = Version(version)
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = list(project["dependencies"])
    for extra in EXTRAS:
        listed += project["optional-dependencies"][extra]
    return [Requirement(text) for text in listed]


def test_every_dependency_is_pinned_inside_its_range():
    pins = _pins()
    for requirement in _requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name}: installed by the README, not pinned in .ci/constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{requirement.name}=={pins[name]} (pinned) is outside pyproject.toml's {requirement.specifier}"
        )
        for extra in requirement.extras:  # dask[distributed]: what the extra pulls in is pinned too
            assert canonicalize_name(extra) in pins or extra == "complete", f"{requirement.name}[{extra}]"


def test_the_build_backend_and_torch_are_pinned():
    """setuptools builds the package (--no-build-isolation), and torch is the 2.13.0 CPU wheel."""
    pins = _pins()
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert "setuptools" in pins and Requirement(build[0]).specifier.contains(pins["setuptools"])
    assert pins["torch"] == Version("2.13.0")


def _readme_test_command() -> str:
    commands = [
        line.strip()
        for line in (ROOT / "README.md").read_text().splitlines()
        if "python -m pytest" in line and "pip install" in line
    ]
    assert len(commands) == 1, f"the README shows {len(commands)} set-up-and-test commands; one expected"
    return commands[0]


def test_ci_runs_the_readme_test_command_from_the_pins():
    command = _readme_test_command()
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in [line.strip() for line in ci_lines]
    installs = re.findall(r"pip install [^&]*", command)
    assert installs and all("-c .ci/constraints.txt" in step for step in installs), installs
