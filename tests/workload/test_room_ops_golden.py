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
from tests.golden_compare import kept
from tests.workload import room_ops_golden as golden

GOLDEN = json.loads(golden.GOLDEN.read_text())


@pytest.mark.parametrize("path", sorted(GOLDEN["runs"]))
def test_shipped_scenario_runs_are_unchanged(path):
    """Every number of `run --json` for a shipped scenario, exactly."""
    file = golden.REPO / path
    assert kept(GOLDEN["runs"][path], golden._run(load_scenario(file), file))


def test_every_captured_scenario_is_still_shipped():
    """A captured scenario may not vanish from the comparison (scenarios shipped since the
    capture are not part of the refactor's proof)."""
    shipped = {str(p.relative_to(golden.REPO)) for p in golden._scenario_files()}
    assert set(GOLDEN["runs"]) <= shipped


@pytest.mark.parametrize(("base", "name", "overrides"), golden.VARIANTS, ids=[v[1] for v in golden.VARIANTS])
def test_variant_runs_are_unchanged(base, name, overrides):
    """FP8 current scaling / MXFP8, CP, unfused GQA, squared ReLU, no dropout: exactly."""
    assert kept(GOLDEN["variants"][name], golden._variant(base, name, overrides))


def test_validate_rows_are_unchanged():
    """`validate --json`'s Table 4 and 5 rows, exactly."""
    from simcluster.validation import table4_comparisons, table5_comparisons

    rows = table4_comparisons(None) + table5_comparisons(None)
    assert [{**asdict(row), "error": row.error} for row in rows] == GOLDEN["validate"]


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
