"""Sweep spec loading: `auto` expands from the model shape; bad specs name file, field, value."""

from __future__ import annotations

import pytest
import yaml

from simcluster.config.errors import ConfigError
from simcluster.sweep import load_sweep_spec


def _problems(path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_sweep_spec(path)
    assert caught.value.source == str(path)
    return "\n".join(caught.value.problems)


def test_auto_lists_candidates_from_the_model_shape(write_sweep):
    """8 layers, 16 heads, 4 GPUs, global batch 8: auto gives the divisors that can work."""
    axes = {
        name: "auto" for name in ("tp", "pp", "vpp", "micro_batch_size", "sequence_parallel", "recompute")
    }
    spec = load_sweep_spec(write_sweep(axes))
    assert spec.axes == {
        "tp": (1, 2, 4),  # divisors of 16 heads that divide 4 GPUs
        "pp": (1, 2, 4),  # divisors of 8 layers that divide 4 GPUs
        "vpp": (1, 2, 4, 8),  # divisors of 8 layers, at most 8
        "micro_batch_size": (1, 2, 4, 8),  # divisors of the global batch 8, at most 16
        "sequence_parallel": (False, True),
        "recompute": ("none", "selective", "full"),
    }
    assert spec.num_gpus == 4
    assert spec.num_combinations == 3 * 3 * 4 * 4 * 2 * 3


def test_axes_not_named_keep_the_base_value_and_num_gpus_defaults_to_the_base(write_sweep, tmp_path):
    """Without num_gpus the base's tp·pp·dp (here 1) is the GPU count."""
    path = write_sweep({"recompute": ["full"]})
    data = yaml.safe_load(path.read_text())
    del data["num_gpus"]
    path.write_text(yaml.safe_dump(data))
    spec = load_sweep_spec(path)
    assert spec.num_gpus == 1 and spec.axes == {"recompute": ("full",)}


@pytest.mark.parametrize(
    ("axes", "expected"),
    [
        ({"tensor": [1]}, "axes.tensor: unknown axis; allowed: tp, pp, vpp"),
        ({"dp": [1, 2]}, "axes.dp: unknown axis (dp follows from num_gpus / (tp * cp * pp))"),
        ({"recompute": ["partial"]}, "axes.recompute: value 'partial': allowed: none, selective, full"),
        ({"tp": [0, 2]}, "axes.tp: value 0: allowed: positive integers"),
        ({"tp": [True]}, "axes.tp: value True: allowed: positive integers"),
        ({"sequence_parallel": ["yes"]}, "axes.sequence_parallel: value 'yes': allowed: true, false"),
        ({"tp": 8}, "axes.tp: value 8: must be a list of values or `auto`"),
        ({"tp": []}, "axes.tp: empty list"),
        ({"pp": [2, 2]}, "axes.pp: value 2: listed twice"),
        ({"global_batch_size": "auto"}, "axes.global_batch_size: value 'auto': not available"),
    ],
)
def test_bad_axes_are_named_with_what_is_allowed(write_sweep, axes, expected):
    """Each mistake is reported with its field, its value and the allowed values."""
    assert expected in _problems(write_sweep(axes))


def test_every_problem_is_reported_at_once(write_sweep):
    """Two bad axes: both problems in one error."""
    problems = _problems(write_sweep({"tensor": [1], "recompute": ["partial"]}))
    assert "axes.tensor" in problems and "axes.recompute" in problems


def test_unknown_top_level_key_and_missing_base(write_sweep, tmp_path):
    """A misspelt key is an error; a base that is not a file is named with its resolved path."""
    path = write_sweep()
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "num_gpu": 8}))
    assert "num_gpu: unknown key" in _problems(path)
    path.write_text(yaml.safe_dump({**data, "base": "nowhere.yaml"}))
    assert f"base: value 'nowhere.yaml': no scenario file at {tmp_path / 'nowhere.yaml'}" in _problems(path)
