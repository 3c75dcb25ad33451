"""`--hwprofiles DIR`: a folder of the user's hardware profiles, for commands that load one.

The folders go in front of $SIMCLUSTER_HWPROFILES for the rest of this process, so every
lookup of a profile name (the scenario's `hardware:`, `--hardware`, a sweep's base) sees
them first; the search order is `simcluster.config.profiles`'s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from simcluster.cli._app import fail
from simcluster.config.profiles import ENV_VAR, env_dirs, missing_dirs

HwProfiles = Annotated[
    list[Path] | None,
    typer.Option(
        "--hwprofiles",
        metavar="DIR",
        help=f"a folder of hardware profiles searched first (repeatable; then ${ENV_VAR}, "
        "then the shipped ones)",
    ),
]


def use_hwprofiles(folders: list[Path] | None) -> None:
    """Search `folders` first; exit 2 naming any that is not a folder."""
    if not folders:
        return
    if problems := missing_dirs(folders):
        fail("; ".join(problems))
    os.environ[ENV_VAR] = os.pathsep.join(str(folder) for folder in [*folders, *env_dirs()])
