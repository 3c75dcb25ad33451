"""A command's expensive step made to fail loudly, so a test proves the output check came
first (tests/cli/test_cli_never_overwrite.py, test_cli_output_targets.py)."""

from __future__ import annotations

import importlib
import sys

import pytest

# modules that bind `run_simulation` by name: imported before any patch, so that a lazy first
# import during a patched test cannot keep the stand-in once the test is over
BINDERS = ("simcluster.validation", "simcluster.plan.search", "simcluster.cli.compare", "simcluster.cli.plot",
           "simcluster.cli.run")  # fmt: skip


def no_work(monkeypatch: pytest.MonkeyPatch, target: str) -> None:
    """`target` (dotted) raises wherever a simcluster module bound it; undone after the test."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{target} ran before the output was checked")

    for name in BINDERS:
        importlib.import_module(name)
    module_name, attr = target.rsplit(".", 1)
    real = getattr(importlib.import_module(module_name), attr)
    for module in [m for name, m in sys.modules.items() if name.startswith("simcluster")]:
        if getattr(module, attr, None) is real:
            monkeypatch.setattr(module, attr, forbidden)
