"""The Typer application every command module registers on, and shared helpers."""

from __future__ import annotations

from typing import NoReturn

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Simulate Megatron-style transformer training: time, MFU and memory per stage.",
)


def fail(error: Exception | str, code: int = 2) -> NoReturn:
    """Print an error for people and exit non-zero (2 = bad input)."""
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(code=code)
