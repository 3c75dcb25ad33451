"""Issue 18's "make room" for ops changes no number: every `run --json` of the shipped
scenarios (and of variants reaching the FP8, context-parallel and unfused ops), `validate`'s
rows and each layer configuration's op graph and prices equal, `==`, what the commit before
the refactor gave (`room_ops_golden.py` captured them there)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import load_scenario
from tests.workload import room_ops_golden as golden

GOLDEN = json.loads(golden.GOLDEN.read_text())


def as_before(now, before) -> bool:
    """`now` holds every value `before` had, `==` (floats exactly); dicts may have gained keys
    since (the JSON contract adds keys, never drops one), lists keep their length."""
    if isinstance(before, dict):
        return isinstance(now, dict) and all(k in now and as_before(now[k], v) for k, v in before.items())
    if isinstance(before, list):
        return isinstance(now, (list, tuple)) and len(now) == len(before) and all(map(as_before, now, before))
    return now == before and isinstance(now, bool) == isinstance(before, bool)


def test_the_comparison_is_exact():
    """A float one ulp away, a lost key or a shorter list is a difference; a new key is not."""
    assert as_before({"a": [1.0, {"b": 2}], "new": 0}, {"a": [1.0, {"b": 2}]})
    assert not as_before({"a": [1.0000000000000002, {"b": 2}]}, {"a": [1.0, {"b": 2}]})
    assert not as_before({"a": [1.0]}, {"a": [1.0, {"b": 2}]})
    assert not as_before({"c": 1}, {"a": 1})


@pytest.mark.parametrize("path", sorted(GOLDEN["runs"]))
def test_shipped_scenario_runs_are_unchanged(path):
    """Every number of `run --json` for a shipped scenario, exactly."""
    file = golden.REPO / path
    assert as_before(golden._run(load_scenario(file), file), GOLDEN["runs"][path])


def test_every_shipped_scenario_is_in_the_golden_file():
    """A scenario added since the capture is not silently left out of the comparison."""
    shipped = {str(p.relative_to(golden.REPO)) for p in golden._scenario_files()}
    assert shipped == set(GOLDEN["runs"])


@pytest.mark.parametrize(("base", "name", "overrides"), golden.VARIANTS, ids=[v[1] for v in golden.VARIANTS])
def test_variant_runs_are_unchanged(base, name, overrides):
    """FP8 current scaling / MXFP8, CP, unfused GQA, squared ReLU, no dropout: exactly."""
    assert as_before(golden._variant(base, name, overrides), GOLDEN["variants"][name])


def test_validate_rows_are_unchanged():
    """`validate --json`'s Table 4 and 5 rows, exactly."""
    from simcluster.validation import table4_comparisons, table5_comparisons

    rows = table4_comparisons(None) + table5_comparisons(None)
    assert as_before([{**asdict(row), "error": row.error} for row in rows], GOLDEN["validate"])


CONFIGS = golden.layer_configs()
SLICES = 8


@pytest.mark.parametrize("part", range(SLICES))
def test_layer_op_graphs_and_prices_are_unchanged(part):
    """Each grid layer's op graph (the fields it had), per-op and per-phase prices, time split
    by kind, kernel counts and stand-in kinds: the same digest as before."""
    assert len(CONFIGS) == len(GOLDEN["layers"])
    profiles = {name: load_hardware(name) for name in golden.PROFILES}
    changed = [
        CONFIGS[i]
        for i in range(part, len(CONFIGS), SLICES)
        if golden.layer_digest(CONFIGS[i], golden.profiles_for(i, profiles)) != GOLDEN["layers"][i]
    ]
    assert not changed, changed[:3]
