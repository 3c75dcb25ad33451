"""The small scenario the config tests vary: 8 layers of h 256 on tp 2 × pp 2 (A100)."""

import pytest
import yaml

from simcluster.config import ConfigError, parse_scenario

BASE = {
    "hardware": "a100-sxm4-80gb",
    "model": {
        "num_layers": 8,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "seq_length": 128,
        "vocab_size": 1000,
    },
    "parallel": {"tp": 2, "pp": 2},
    "training": {"micro_batch_size": 1, "global_batch_size": 8},
}


def with_changes(section: str, **changes) -> dict:
    """A deep copy of BASE with `changes` applied to one section."""
    data = yaml.safe_load(yaml.safe_dump(BASE))
    data[section].update(changes)
    return data


def refusal(data: dict) -> str:
    """The text of the ConfigError `parse_scenario` raises for `data` (fails the test if the
    scenario loads)."""
    with pytest.raises(ConfigError) as caught:
        parse_scenario(data, "s.yaml")
    return str(caught.value)
