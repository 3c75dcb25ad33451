"""`training.moe_flex_dispatcher_backend` (Megatron `--moe-flex-dispatcher-backend`):
default deepep; Megatron-core's rules as one clear error each; import, export, round trip."""

from __future__ import annotations

import shlex

import pytest
import yaml

from simcluster.config import ConfigError
from simcluster.config.hardware import load_hardware
from simcluster.config.megatron_args import parse_megatron_args, to_megatron_args
from simcluster.config.megatron_flags import bucket
from simcluster.config.moe_choices import FlexBackend
from simcluster.config.scenario import hardware_problems, parse_scenario
from tests.megatron_line import as_read_back
from tests.paths import ROOT

QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"
MOE_LINE = (
    "--num-layers 8 --hidden-size 512 --num-attention-heads 8 --seq-length 256 --micro-batch-size 1 "
    "--ffn-hidden-size 1024 --swiglu --bf16 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 256 "
    "--world-size 8 --expert-model-parallel-size 4 --moe-token-dispatcher-type flex"
)


def _data(
    dispatcher: str = "flex", backend: str | None = "hybridep", ep: int = 16, hardware: str | None = None
):
    data = yaml.safe_load(QWEN.read_text())
    data["parallel"]["ep"] = ep
    data["training"]["moe_token_dispatcher"] = dispatcher
    if backend is not None:
        data["training"]["moe_flex_dispatcher_backend"] = backend
    if hardware is not None:
        data["hardware"] = hardware
    return data


def test_the_default_is_deepep_and_hybridep_loads():
    assert (
        parse_scenario(_data(backend=None), "s.yaml").training.moe_flex_dispatcher_backend
        is FlexBackend.DEEPEP
    )
    assert parse_scenario(_data(), "s.yaml").training.moe_flex_dispatcher_backend is FlexBackend.HYBRIDEP
    with pytest.raises(ConfigError, match="moe_flex_dispatcher_backend"):
        parse_scenario(_data(backend="ncclep"), "s.yaml")


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
def test_hybridep_needs_the_flex_dispatcher(dispatcher):
    with pytest.raises(
        ConfigError, match="value hybridep: .* needs model.moe and training.moe_token_dispatcher flex"
    ):
        parse_scenario(_data(dispatcher), "s.yaml")


def test_hybridep_runs_at_ep_1_where_deepep_is_refused():
    """Megatron asserts tp·ep > 1 for DeepEP only (`MoEFlexTokenDispatcher.__init__`)."""
    assert parse_scenario(_data(ep=1), "s.yaml").parallel.ep == 1
    with pytest.raises(ConfigError, match="DeepEP needs etp·ep > 1"):
        parse_scenario(_data(backend="deepep", ep=1), "s.yaml")


def test_deepep_across_trays_of_an_nvl72_rack_is_refused_hybridep_is_not():
    """GB200 NVL72: 4 GPUs a tray, 72 a domain. ep 4 stays in a tray: both run; ep 8 spans two
    trays: only hybridep (Megatron-core: "only hybridep backend supports the MNNVL case")."""
    gb200 = load_hardware("gb200-nvl72")
    spans = parse_scenario(_data(backend="deepep", ep=8, hardware="gb200-nvl72"), "s.yaml")
    (problem,) = hardware_problems(spans, gb200)
    assert "value deepep: the EP group (8 ranks) spans compute trays (4 GPUs each)" in problem
    assert "allowed: hybridep, or ep·etp <= 4" in problem
    assert hardware_problems(parse_scenario(_data(ep=8, hardware="gb200-nvl72"), "s.yaml"), gb200) == []
    in_tray = parse_scenario(_data(backend="deepep", ep=4, hardware="gb200-nvl72"), "s.yaml")
    assert hardware_problems(in_tray, gb200) == []
    # an 8-GPU node is its own NVLink domain: DeepEP may span nodes over RDMA there
    assert (
        hardware_problems(parse_scenario(_data(backend="deepep"), "s.yaml"), load_hardware("h100-sxm5-80gb"))
        == []
    )


def test_hybridep_needs_hopper_or_later():
    a100 = load_hardware("a100-sxm4-80gb")
    scenario = parse_scenario(_data(hardware="a100-sxm4-80gb"), "s.yaml")
    problems = [p for p in hardware_problems(scenario, a100) if "moe_flex_dispatcher_backend" in p]
    assert len(problems) == 1 and "compute capability 9.0 (Hopper) or later, not priced before" in problems[0]


def test_import_reads_the_backend_and_megatrons_one_backend_rule():
    assert bucket("moe-flex-dispatcher-backend") == "used"
    line = f"{MOE_LINE} --moe-flex-dispatcher-backend hybridep"
    assert parse_megatron_args(line).requested["training"]["moe_flex_dispatcher_backend"] == "hybridep"
    default = parse_megatron_args(f"{MOE_LINE} --moe-flex-dispatcher-backend deepep").requested["training"]
    assert "moe_flex_dispatcher_backend" not in default  # the scenario's default
    with pytest.raises(ConfigError, match="--moe-enable-deepep with --moe-flex-dispatcher-backend hybridep"):
        parse_megatron_args(f"{line} --moe-enable-deepep")
    with pytest.raises(
        ConfigError, match="--moe-flex-dispatcher-backend: value 'ncclep': allowed: deepep, hybridep"
    ):
        parse_megatron_args(f"{MOE_LINE} --moe-flex-dispatcher-backend ncclep")


def test_export_writes_hybridep_and_round_trips():
    scenario = parse_scenario(_data(), "s.yaml")
    flags = to_megatron_args(scenario, 8)
    words = shlex.split(flags)
    assert words[words.index("--moe-flex-dispatcher-backend") + 1] == "hybridep"
    imported = parse_megatron_args(flags, scenario.hardware, scenario.name)
    assert imported.validated() == as_read_back(scenario)
    deepep = parse_scenario(_data(backend=None), "s.yaml")
    assert "--moe-flex-dispatcher-backend" not in to_megatron_args(deepep, 8)  # Megatron's default
