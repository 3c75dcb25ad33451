"""Numbers are never guessed from other types: booleans are not integers, floats are not
integers, infinities and NaNs are not numbers; an integer is at most 2³¹ - 1."""

import pytest

from simcluster.config import ConfigError, parse_scenario
from simcluster.config.strict import MAX_INT
from tests.config.scenario_cases import BASE


def _with(section: str, key: str, value):
    return {**BASE, section: {**BASE[section], key: value}}


@pytest.mark.parametrize(
    ("section", "key", "value", "expected"),
    [
        ("parallel", "tp", True, "parallel.tp: value True: must be an integer, not a boolean"),
        ("model", "num_layers", 8.0, "num_layers: value 8.0: must be an integer, not a float (write 8)"),
        ("training", "global_batch_size", "8", "batch_size: value '8': must be an integer, not a string"),
        ("model", "ffn_hidden_size", False, "model.ffn_hidden_size: value False: must be an integer"),
        ("parallel", "sequence_parallel", 1, "parallel: value 1: must be true or false, not an integer"),
        ("parallel", "sequence_parallel", "yes please", "must be true or false, not a string"),
        ("model", "vocab_size", MAX_INT + 1, f"must be at most {MAX_INT:,}"),
    ],
)
def test_no_type_guessing(section, key, value, expected):
    """Each mistyped value is one error naming the field, the value and what is allowed."""
    with pytest.raises(ConfigError) as caught:
        parse_scenario(_with(section, key, value), "typed.yaml")
    assert expected in str(caught.value)


def test_true_yaml_types_still_load():
    """Plain integers and booleans load unchanged."""
    scenario = parse_scenario(_with("parallel", "sequence_parallel", True), "ok.yaml")
    assert scenario.parallel.tp == 2 and scenario.parallel.sequence_parallel is True
