"""The Typer application every command module registers on, and shared helpers."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import typer

from simcluster.output_files import OutputPathError, check_output_file, check_output_folder

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Simulate Megatron-style transformer training: time, MFU and memory per stage.",
)


def fail(error: Exception | str, code: int = 2) -> NoReturn:
    """Print an error for people and exit non-zero (2 = bad input)."""
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(code=code)


def output_file(path: Path, option: str) -> Path:
    """Exit 2 naming `path` and the problem unless it can be written: called before the work
    that fills it (a simulation, minutes of measuring), never after."""
    try:
        return check_output_file(path, option)
    except OutputPathError as error:
        fail(error)


def output_folder(folder: Path, option: str) -> Path:
    """As `output_file`, for an option that names a folder to write into."""
    try:
        return check_output_folder(folder, option)
    except OutputPathError as error:
        fail(error)
