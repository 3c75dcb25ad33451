"""`simcluster` command line: one module per command, each a few lines over library calls.

Every module in this package (other than `_`-prefixed ones) registers its command(s) on
`app` when imported; `main` imports them all, so adding a command is adding a file.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

from simcluster.cli._app import app
from simcluster.config.errors import ConfigError

__all__ = ["app", "main"]


def _register_commands() -> None:
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


_register_commands()


def main() -> None:
    try:
        app()
    except ConfigError as error:
        typer.echo(f"error: {error}", err=True)
        sys.exit(2)
