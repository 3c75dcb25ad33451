"""`--disable-bias-linear` <-> `model.add_bias_linear: false` (Megatron-core
TransformerConfig.add_bias_linear, whose argparse name is `--disable-bias-linear`): imported,
exported once, and read back to the same scenario, dense and MoE."""

from __future__ import annotations

import shlex

import yaml

from simcluster.config.megatron_args import parse_megatron_args, to_megatron_args
from simcluster.config.scenario import load_scenario, parse_scenario
from tests.paths import ROOT

LLAMA3_8B = ROOT / "scenarios" / "modern" / "llama3-8b-h100.yaml"
MIXTRAL = ROOT / "scenarios" / "moe" / "mixtral-8x7b-h100.yaml"
DENSE = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 1"


def _without_biases(path):
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["model"]["add_bias_linear"] = False
    return parse_scenario(data, path)


def _read_back(scenario):
    return parse_megatron_args(to_megatron_args(scenario, 8), scenario.hardware, scenario.name)


def test_a_dense_line_imports_the_flag_as_the_key():
    """With the flag the key is false and the flag is used (not listed as not modelled);
    without it the key keeps Megatron's default, true, and is not written."""
    imported = parse_megatron_args(f"{DENSE} --disable-bias-linear", "h100-sxm5-80gb")
    assert imported.requested["model"]["add_bias_linear"] is False
    assert imported.validated().model.add_bias_linear is False
    assert not [line for line in imported.not_modelled + imported.unknown if "bias" in line]
    plain = parse_megatron_args(DENSE, "h100-sxm5-80gb")
    assert "add_bias_linear" not in plain.requested["model"] and plain.validated().model.add_bias_linear


def test_dense_round_trip_both_ways():
    """Llama 3 8B without biases: the line holds --disable-bias-linear once and reads back
    `==`; with biases (the shipped file) the line has no such flag and reads back `==`."""
    scenario = _without_biases(LLAMA3_8B)
    words = shlex.split(to_megatron_args(scenario, 8))
    assert words.count("--disable-bias-linear") == 1
    assert _read_back(scenario).validated() == scenario
    shipped = load_scenario(LLAMA3_8B)
    assert "--disable-bias-linear" not in shlex.split(to_megatron_args(shipped, 8))
    assert _read_back(shipped).validated() == shipped


def test_moe_round_trip_writes_the_flag_once_for_every_bias():
    """A MoE model without biases (dense, router, experts): one --disable-bias-linear, read
    back `==`; a MoE line without the flag builds every bias (Megatron's default)."""
    scenario = _without_biases(MIXTRAL)
    words = shlex.split(to_megatron_args(scenario, 8))
    assert words.count("--disable-bias-linear") == 1
    assert _read_back(scenario).validated() == scenario
    line = to_megatron_args(scenario, 8).replace(" --disable-bias-linear", "")
    model = parse_megatron_args(line, "h100-sxm5-80gb").requested["model"]
    assert "add_bias_linear" not in model and model["moe"]["router_bias"] and model["moe"]["expert_bias"]
