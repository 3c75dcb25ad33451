"""Stage pricing's refactor changed no number: every result captured at the base commit
(`golden_stage_pricing.py`) is recomputed and compared with exact `==`."""

import json

import pytest

from tests.costs import golden_stage_pricing as golden
from tests.golden_compare import kept

RECORDED = golden.decode(json.loads(golden.GOLDEN.read_text()))


@pytest.fixture(scope="module")
def recorded():
    return RECORDED


# The cases recorded at the capture: a scenario shipped later is not part of the refactor's
# proof (re-capture to add it), but a recorded one may not disappear.
@pytest.mark.parametrize("key", sorted(RECORDED["cases"]))
def test_run_bound_and_stage_seconds_equal(recorded, key):
    """`run --json` (full and --steady-state), the bound's stages and the bound: `==`."""
    cases = golden.scenario_cases()
    assert key in cases, f"{key}: recorded in {golden.GOLDEN.name} but no longer shipped"
    captured = golden.decode(golden._encode(golden.capture_case(key, cases[key])))
    assert kept(recorded["cases"][key], captured)  # every recorded number ==; keys added since pass


def test_validate_tables_equal(recorded):
    """`validate`'s Tables 4 and 5, predicted and measured: `==`."""
    assert golden.decode(golden._encode(golden.capture_validation())) == recorded["validation"]


def test_plan_bounds_equal(recorded):
    """Every layout's bound and static memory in a plan search: `==`."""
    for path, num_gpus in golden.PLAN_SEARCHES:
        captured = golden.decode(golden._encode(golden.capture_plan(path, num_gpus)))
        assert captured == recorded["plans"][f"{path}@{num_gpus}"]
