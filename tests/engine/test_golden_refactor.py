"""Issue 18's engine refactor moves no number: every shipped scenario's `run --json`, its
trace, its steady-state run, its data-parallel variants and `validate --json`, equal (`==`,
floats bit for bit) to what the commit before the refactor gave (tests/engine/golden_refactor.py
says how they were recorded)."""

import json

import pytest

from tests.engine.golden_refactor import GOLDEN, capture
from tests.golden_compare import kept


@pytest.fixture(scope="module")
def captured():
    return capture()


def test_every_shipped_number_equals_the_golden_capture(captured):
    golden = json.loads(GOLDEN.read_text())
    assert set(golden) <= set(captured)
    differing = [name for name in golden if not kept(golden[name], json.loads(json.dumps(captured[name])))]
    assert not differing, f"changed by the refactor: {differing}"


def test_an_added_key_is_kept_a_changed_or_dropped_one_is_not():
    assert kept({"a": 1.0, "b": {"c": 2}}, {"a": 1.0, "b": {"c": 2, "d": 3}, "e": 4})
    assert kept([{"a": 1}], [{"a": 1, "b": 2}]) and not kept([{"a": 1}], [{"a": 1}, {"a": 1}])
    assert not kept({"a": 1.0}, {"a": 1.0000000000000002})
    assert not kept({"a": 1.0, "b": 2}, {"a": 1.0})


def test_the_golden_capture_covers_every_option_the_engine_branches_on():
    """Overlapped gradient buckets and the overlapped parameter all-gather really ran."""
    golden = json.loads(GOLDEN.read_text())
    ran = [name for name, value in golden.items() if name.endswith("distopt-overlap-gather")]
    assert ran and any(isinstance(golden[name], dict) for name in ran)
