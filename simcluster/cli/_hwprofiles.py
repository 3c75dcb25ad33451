"""`--hwprofiles DIR`: a folder of the user's hardware profiles, for commands that load one.

The folders go in front of $SIMCLUSTER_HWPROFILES for the rest of this process, so every
lookup of a profile name (the scenario's `hardware:`, `--hardware`, a sweep's base) sees
them first; the search order is `simcluster.config.profiles`'s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from simcluster.cli._app import fail
from simcluster.config.profiles import ENV_VAR, env_dirs, find_profile, missing_dirs, profiles_dir

if TYPE_CHECKING:
    from simcluster.config.hardware import HardwareProfile

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


def load_profile(reference: str, relative_to: Path | None = None) -> HardwareProfile:
    """`load_hardware(reference, relative_to)`, saying on stderr which file was read when
    the profile's `name:` is a shipped profile's but the file is not that shipped file (a
    user's copy in --hwprofiles, say): the results name the profile by `name:` only.
    Raises ConfigError like `load_hardware`."""
    from simcluster.config.hardware import load_hardware

    path = find_profile(reference, relative_to)
    profile = load_hardware(reference, relative_to)
    shipped = profiles_dir() / f"{profile.name}.yaml"
    if shipped.is_file() and not _same(shipped, path):
        typer.echo(
            f"note: hardware profile {profile.name!r} is read from {path}, not the shipped {shipped.name}",
            err=True,
        )
    return profile


def _same(first: Path, second: Path) -> bool:
    try:
        return first.resolve() == second.resolve()
    except OSError:
        return False
