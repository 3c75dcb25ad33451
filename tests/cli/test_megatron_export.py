"""`to_megatron_args`: a scenario as a Megatron-LM launch line that `import-megatron` reads
back to the same scenario."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcluster.config import ConfigError, load_scenario
from simcluster.config.megatron_args import parse_megatron_args, to_megatron_args
from simcluster.config.scenario import Scenario, parse_scenario
from tests.paths import ROOT

PAPER = sorted((ROOT / "scenarios" / "paper").glob("*.yaml"))


def _read_back(scenario: Scenario, gpus_per_node: int | None = 8) -> Scenario:
    args = to_megatron_args(scenario, gpus_per_node)
    return parse_megatron_args(args, scenario.hardware, scenario.name).validated()


@pytest.mark.parametrize("path", PAPER, ids=lambda p: p.stem)
def test_paper_scenarios_round_trip(path):
    """scenario -> flags -> import -> the same scenario, for every paper scenario."""
    scenario = load_scenario(path)
    assert _read_back(scenario) == scenario


@st.composite
def scenarios(draw):
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 3, 16]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    micro = draw(st.sampled_from([1, 2, 4]))
    data = {
        "name": "random",
        "hardware": "h100-sxm5-80gb",
        "model": {
            "num_layers": 16, "hidden_size": 1024, "num_attention_heads": 16,
            "seq_length": draw(st.sampled_from([512, 2048])),
            "vocab_size": draw(st.sampled_from([32000, 51200])),
            "ffn_hidden_size": draw(st.sampled_from([None, 2816 * 2])),
        },
        "parallel": {
            "tp": tp, "pp": pp, "dp": dp, "vpp": vpp,
            "sequence_parallel": tp > 1 and draw(st.booleans()),
        },
        "training": {
            "micro_batch_size": micro,
            "global_batch_size": micro * dp * pp * draw(st.sampled_from([1, 2])),
            "recompute": draw(st.sampled_from(["none", "selective", "full"])),
            "dtype": draw(st.sampled_from(["bf16", "fp16", "fp32"])),
            "use_distributed_optimizer": draw(st.booleans()),
            "overlap_grad_reduce": draw(st.booleans()),
        },
    }  # fmt: skip
    return parse_scenario(data, "random")


@settings(max_examples=80)
@given(scenarios(), st.sampled_from([None, 4, 8]))
def test_random_scenarios_round_trip(scenario, gpus_per_node):
    """Every field survives the trip (dp via torchrun's world size), for any node size."""
    assert _read_back(scenario, gpus_per_node) == scenario


def test_flags_are_megatrons_and_the_world_size_is_torchruns():
    """Megatron's own flag names; nodes x GPUs per node = tp·pp·dp."""
    scenario = load_scenario(ROOT / "scenarios" / "paper" / "gpt3-175b-sp-selective.yaml")
    words = shlex.split(to_megatron_args(scenario, 8))
    assert words[:6] == ["torchrun", "--nnodes", "8", "--nproc_per_node", "8", "pretrain_gpt.py"]
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--sequence-parallel",
                 "--num-layers-per-virtual-pipeline-stage", "--recompute-granularity", "--bf16"):  # fmt: skip
        assert flag in words
    assert words[words.index("--num-layers-per-virtual-pipeline-stage") + 1] == "4"


def test_gpipe_has_no_megatron_flags():
    """Megatron has no GPipe schedule: exporting one is an error naming the field."""
    scenario = load_scenario(ROOT / "scenarios" / "paper" / "gpt3-175b-sp-selective.yaml")
    data = scenario.model_dump(mode="json")
    data["training"]["schedule"] = "gpipe"
    gpipe = Scenario.model_validate(data)
    with pytest.raises(ConfigError, match="training.schedule"):
        to_megatron_args(gpipe)
