"""Stage pricing's refactor changed no number: every result captured at the base commit
(`golden_stage_pricing.py`) is recomputed and compared with exact `==`."""

import json

import pytest

from tests.costs import golden_stage_pricing as golden


@pytest.fixture(scope="module")
def recorded():
    return golden.decode(json.loads(golden.GOLDEN.read_text()))


@pytest.mark.parametrize("key", sorted(golden.scenario_cases()))
def test_run_bound_and_stage_seconds_equal(recorded, key):
    """`run --json` (full and --steady-state), the bound's stages and the bound: `==`."""
    scenario = golden.scenario_cases()[key]
    assert golden.decode(golden._encode(golden.capture_case(key, scenario))) == recorded["cases"][key]


def test_every_case_was_recorded(recorded):
    """No shipped scenario is missing from the golden file (a new one needs a re-capture)."""
    assert sorted(recorded["cases"]) == sorted(golden.scenario_cases())


def test_validate_tables_equal(recorded):
    """`validate`'s Tables 4 and 5, predicted and measured: `==`."""
    assert golden.decode(golden._encode(golden.capture_validation())) == recorded["validation"]


def test_plan_bounds_equal(recorded):
    """Every layout's bound and static memory in a plan search: `==`."""
    for path, num_gpus in golden.PLAN_SEARCHES:
        captured = golden.decode(golden._encode(golden.capture_plan(path, num_gpus)))
        assert captured == recorded["plans"][f"{path}@{num_gpus}"]
