"""Fixtures of the sweep tests (the world itself is in sweep_cases.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sweep_cases import SweepWriter, write_sweep_files


@pytest.fixture
def write_sweep(tmp_path: Path) -> SweepWriter:
    """write_sweep(axes=None, num_gpus=4, memory_gb=80.0) -> the spec's path under tmp_path."""
    return lambda *args, **kwargs: write_sweep_files(tmp_path, *args, **kwargs)
