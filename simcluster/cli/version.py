"""`simcluster --version`: the installed distribution's version."""

from __future__ import annotations

from importlib import metadata
from typing import Annotated

import typer

from simcluster.cli._app import app


def installed_version() -> str:
    """The version pip recorded for the `simcluster` distribution (pyproject.toml's)."""
    try:
        return metadata.version("simcluster")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"simcluster {installed_version()}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="print the version and exit"),
    ] = False,
) -> None:
    """Simulate Megatron-style transformer training: time, MFU and memory per stage."""
