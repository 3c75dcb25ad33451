"""Fixtures shared by the calibration tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from simcluster.calibration.records import Measurements

FIRST_H100 = Path(__file__).resolve().parents[2] / "docs" / "calibration" / "h100-2026-11-26"


@pytest.fixture(scope="session")
def eager() -> Measurements:
    """The first H100 session's eager microbench (docs/calibration/h100-2026-11-26/), parsed
    once for every module that fits or checks against it (Measurements is frozen)."""
    return Measurements.from_json((FIRST_H100 / "microbench.json").read_text())
