"""`model.moe`, `parallel.ep` / `etp`, `training.moe_token_dispatcher` / `moe_grouped_gemm`:
defaults keep a dense scenario as it was, and each bad input gives one clear error naming
the field, the value and what is allowed (`config.moe_config` rules, Megatron-core's)."""

from __future__ import annotations

import pytest
import yaml

from simcluster.config import ConfigError, parse_scenario
from simcluster.config.moe_choices import TokenDispatcher
from simcluster.config.scenario import load_scenario
from tests.paths import ROOT

QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"
DENSE = ROOT / "scenarios" / "modern" / "llama3-8b-h100.yaml"


def _data(path=QWEN):
    return yaml.safe_load(path.read_text())


def _one_problem(data) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_scenario(data, "bad.yaml")
    text = str(caught.value)
    assert "bad.yaml" in text
    assert text.count("\n  - ") == 1, text  # one problem, one line
    return text


def test_dense_scenarios_default_to_no_experts():
    scenario = load_scenario(DENSE)
    assert scenario.model.moe is None
    assert scenario.parallel.ep == 1 and scenario.parallel.etp is None
    assert scenario.training.moe_token_dispatcher is TokenDispatcher.ALLTOALL
    assert scenario.training.moe_grouped_gemm is True


def test_the_shipped_moe_scenarios_load():
    for path in sorted((ROOT / "scenarios" / "moe").glob("*.yaml")):
        scenario = load_scenario(path)
        assert scenario.model.moe is not None and scenario.parallel.ep > 1


def _set(data, dotted, value):
    *parents, key = dotted.split(".")
    target = data
    for parent in parents:
        target = target[parent]
    target[key] = value
    return data


@pytest.mark.parametrize(
    ("dotted", "value", "expected"),
    [
        ("model.moe.router_topk", 129, ["model.moe.router_topk=129", "num_experts=128"]),
        ("parallel.ep", 3, ["parallel.ep=3", "must divide tp·cp·dp=32"]),
        ("parallel.ep", 64, ["parallel.ep=64", "must divide tp·cp·dp=32"]),
        ("parallel.etp", 8, ["etp=8", "must divide tp·cp·dp"]),
        ("model.moe.load_imbalance", 9.0, ["model.moe.load_imbalance=9.0", "1 <= load_imbalance <= ep"]),
        ("model.moe.load_imbalance", 0.5, ["load_imbalance", "greater than or equal to 1"]),
        (
            "model.moe.first_k_dense_layers",
            48,
            ["model.moe.first_k_dense_layers: value 48", "below num_layers"],
        ),
        ("training.moe_token_dispatcher", "deepep", ["moe_token_dispatcher", "alltoall"]),
        ("model.activation", "gelu", ["model.activation: value gelu", "not modelled"]),
        ("model.moe.router_score", "relu", ["router_score", "softmax"]),
    ],
)
def test_each_bad_input_gives_one_clear_error(dotted, value, expected):
    data = _set(_data(), dotted, value)
    text = _one_problem(data)
    for fragment in expected:
        assert fragment in text, (fragment, text)


def test_flex_needs_etp_ep_above_one_and_etp_one():
    """Megatron's DeepEP dispatcher asserts tp·ep > 1; the simulator's DeepEP model covers
    etp = 1 and says so."""
    data = _set(_data(), "training.moe_token_dispatcher", "flex")
    _set(data, "parallel.ep", 1)
    assert "DeepEP needs etp·ep > 1" in _one_problem(data)
    data = _set(_data(), "training.moe_token_dispatcher", "flex")
    data["parallel"].update(tp=2, dp=16, sequence_parallel=True, ep=8, etp=2)
    text = _one_problem(data)
    assert "training.moe_token_dispatcher: value flex with parallel.etp 2" in text and "not modelled" in text
    data["parallel"]["etp"] = 1
    assert parse_scenario(data, "s.yaml").training.moe_token_dispatcher.value == "flex"


def test_experts_not_divisible_by_ep():
    data = _set(_data(), "model.moe.num_experts", 100)  # ep 8 divides 32 ranks but not 100 experts
    text = _one_problem(data)
    assert "model.moe.num_experts=100" in text and "ep must divide num_experts" in text


def test_expert_parallelism_needs_experts():
    data = _set(_data(DENSE), "parallel.ep", 2)
    text = _one_problem(data)
    assert "parallel.ep: value 2: needs model.moe" in text
    data = _set(_data(DENSE), "parallel.etp", 1)
    assert "parallel.etp: value 1: needs model.moe" in _one_problem(data)


def test_moe_with_tp_needs_sequence_parallel():
    data = _data()
    data["parallel"].update(tp=2, dp=16, sequence_parallel=False)
    assert "parallel.sequence_parallel=false is not allowed" in _one_problem(data)
    data["parallel"]["sequence_parallel"] = True
    assert parse_scenario(data, "ok.yaml").parallel.tp == 2


def test_unknown_moe_key_is_refused():
    data = _set(_data(), "model.moe.q_lora_rank", 1536)
    assert "q_lora_rank" in _one_problem(data)
