"""Scenario loading: shipped files load; bad input names file, field, value, allowed."""

from pathlib import Path

import pytest

from simcluster.config import ConfigError, Recompute, load_scenario, parse_scenario
from simcluster.config.hardware import load_hardware
from tests.config.scenario_cases import BASE
from tests.config.scenario_cases import with_changes as _with

ROOT = Path(__file__).resolve().parents[2]
# scenarios/modern/ sets keys not priced yet: tests/config/test_modern_scenarios.py holds them.
SHIPPED = sorted(p for p in (ROOT / "scenarios").rglob("*.yaml") if p.parent.name != "modern")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_scenario_loads(path):
    """Every scenario in scenarios/ validates and names a known profile."""
    scenario = load_scenario(path)
    load_hardware(scenario.hardware, relative_to=path.parent)


def test_defaults_follow_the_contract():
    """name from the file stem, dp = vpp = 1, no SP, ffn = 4h, recompute none."""
    scenario = parse_scenario(BASE, "x.yaml", default_name="x")
    assert scenario.name == "x"
    assert (scenario.parallel.dp, scenario.parallel.vpp) == (1, 1)
    assert scenario.parallel.sequence_parallel is False
    assert scenario.model.ffn_size == 4 * 256
    assert scenario.training.recompute is Recompute.NONE
    assert scenario.num_gpus == 4 and scenario.num_microbatches == 8


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({**BASE, "modell": {}}, "modell: unknown key"),
        (_with("model", hidden_size=-4), "model.hidden_size: value -4"),
        (_with("model", hidden_size=250), "must be divisible by num_attention_heads (8)"),
        (
            _with("parallel", tp=3),
            "parallel.tp: value 3: must divide num_attention_heads (8); allowed: 1, 2, 4, 8",
        ),
        (_with("parallel", pp=3), "model.num_layers: value 8: must be divisible by pp * vpp"),
        (
            _with("training", micro_batch_size=2, global_batch_size=7),
            "training.global_batch_size: value 7: must be a multiple of micro_batch_size * dp (2 * 1 = 2)",
        ),
        (
            _with("parallel", vpp=2, pp=2) | {"training": {"micro_batch_size": 1, "global_batch_size": 3}},
            "interleaved 1F1B needs the number of microbatches (3) to be a multiple of pp (2)",
        ),
        (_with("parallel", tp=1, sequence_parallel=True), "sequence_parallel: value True: needs tp > 1"),
        (_with("training", recompute="some"), "training.recompute: value 'some'"),
    ],
)
def test_bad_input_is_reported_with_field_and_value(data, expected):
    """Each rule's message names the field, the value and what is allowed."""
    with pytest.raises(ConfigError) as caught:
        parse_scenario(data, "bad.yaml")
    assert "bad.yaml" in str(caught.value)
    assert expected in str(caught.value)


def test_unknown_hardware_lists_known_profiles():
    """An unknown profile stem lists the profiles that exist."""
    with pytest.raises(ConfigError) as caught:
        load_hardware("a100-typo")
    assert "a100-sxm4-80gb" in str(caught.value) and "hardware: value 'a100-typo'" in str(caught.value)
