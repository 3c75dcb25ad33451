"""The Typer application every command module registers on, and shared helpers."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from simcluster.config.errors import ConfigError
from simcluster.config.shipped import resolve_scenario
from simcluster.output_files import FORCE_OPTION, OutputPathError, check_output_file, check_output_folder

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Simulate Megatron-style transformer training: time, MFU and memory per stage.",
)


def fail(error: Exception | str, code: int = 2) -> NoReturn:
    """Print an error for people and exit non-zero (2 = bad input)."""
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(code=code)


Force = Annotated[
    bool,
    typer.Option(FORCE_OPTION, help="replace output files that exist (never an input of this command)"),
]


def output_file(path: Path, option: str, force: bool = False, inputs: Iterable[Path] = ()) -> Path:
    """Exit 2 naming `path` and the problem unless it can be written under the rule of
    `simcluster.output_files` (no existing file without --force, never one of `inputs`):
    called before the work that fills it (a simulation, minutes of measuring), never after."""
    try:
        return check_output_file(path, option, force, inputs)
    except OutputPathError as error:
        fail(error)


def scenario_file(target: Path, folders: bool = False) -> Path:
    """The scenario file (or, with `folders`, folder) a SCENARIO argument names: a path, or
    a shipped scenario's name (`simcluster.config.shipped.resolve_scenario`); exit 2 with a
    did-you-mean otherwise."""
    try:
        return resolve_scenario(target, folders)
    except ConfigError as error:
        fail(error)


def output_folder(folder: Path, option: str) -> Path:
    """As `output_file`, for an option that names a folder to write into."""
    try:
        return check_output_folder(folder, option)
    except OutputPathError as error:
        fail(error)
