"""Files shipped with simcluster: the hardware profiles and the paper's scenarios.

They live once, in the repository's top-level `hwprofiles/` and `scenarios/` folders; the
build maps those folders into the package (`setup.py`), so an installed wheel carries them
as package data `simcluster/hwprofiles/` and `simcluster/scenarios/`, read through
`importlib.resources`. A source checkout (editable install, PYTHONPATH) reads the top-level
folders themselves.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

SCENARIO_SUFFIX = ".yaml"
# a shipped scenario's name: "gpt3-175b-sp-selective", "paper", "paper/gpt3-175b-sp-selective"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def shipped_dir(name: str) -> Path:
    """The shipped folder `name` (`hwprofiles`, `scenarios`): package data in an install,
    the top-level folder in a source checkout."""
    packaged = _packaged(name)
    return packaged if packaged is not None else Path(__file__).resolve().parents[2] / name


def is_installed_copy(name: str) -> bool:
    """True when `name` is read from an installed package (not from a source checkout)."""
    return _packaged(name) is not None


def _packaged(name: str) -> Path | None:
    packaged = resources.files("simcluster") / name
    # pip unpacks wheels, so package data are real files (a zip import is not supported)
    return packaged if isinstance(packaged, Path) and packaged.is_dir() else None


def shipped_scenario(name: str) -> Path | None:
    """The shipped scenario file or folder `name` names (its stem, a folder such as `paper`,
    or `folder/stem`), or None. Only plain names: never a path out of the shipped folder."""
    if not _NAME.fullmatch(name):
        return None
    root = shipped_dir("scenarios")
    if (root / name).is_dir():
        return root / name
    if (root / f"{name}{SCENARIO_SUFFIX}").is_file():
        return root / f"{name}{SCENARIO_SUFFIX}"
    matches = sorted(root.glob(f"*/{name}{SCENARIO_SUFFIX}")) if "/" not in name else []
    return matches[0] if matches else None
