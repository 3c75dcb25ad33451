"""`training.overlap_moe_expert_parallel_comm` (`costs.ep_overlap`): a MoE layer's pass cut at
its dispatch and combine, the combined 1F1B pair's saving from Megatron-core's stream
schedule, the saving taken off the dispatcher's seconds only, and Megatron-core's rules."""

from __future__ import annotations

import shlex

import pytest
import yaml

from simcluster.config import ConfigError
from simcluster.config.hardware import load_hardware
from simcluster.config.megatron_export import to_megatron_args
from simcluster.config.megatron_import import parse_megatron_args
from simcluster.config.scenario import parse_scenario
from simcluster.costs.chunk import ChunkCost, OpsCost, is_expert_collective, price_ops
from simcluster.costs.ep_overlap import overlapped_cost, paired_saving_s, pass_phases
from simcluster.costs.stage_pricing import StagePricing, pricing_layout
from simcluster.simulation import run_simulation
from simcluster.workload.layer import LayerOps
from simcluster.workload.model import build_workload
from simcluster.workload.ops import (
    CollectiveKind,
    CommGroup,
    Module,
    Op,
    OpKind,
    Pass,
    collective,
    elementwise,
)
from tests.paths import ROOT

H100 = load_hardware("h100-sxm5-80gb")
QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"


def _data(overlap=True, **parallel):
    data = yaml.safe_load(QWEN.read_text())
    data["parallel"].update({"pp": 2, "vpp": 2, "dp": 32, "ep": 8} | parallel)
    data["training"]["overlap_moe_expert_parallel_comm"] = overlap
    return data


def _work(name: str, pass_: Pass = Pass.FORWARD) -> Op:
    return elementwise(name, 1.0, module=Module.LAYERNORM, pass_=pass_)


def _a2a(name: str, pass_: Pass = Pass.FORWARD) -> Op:
    return collective(
        name, CollectiveKind.ALL_TO_ALL, 1.0, module=Module.MOE_PERMUTE, pass_=pass_, group=CommGroup.EP
    )


def _pass(before: int, between: int, after: int, tag: str, pass_: Pass) -> tuple[Op, ...]:
    ops = [_work(f"{tag}.a{i}", pass_) for i in range(before)]
    ops.append(_a2a(f"{tag}.first", pass_))
    ops += [_work(f"{tag}.m{i}", pass_) for i in range(between)]
    ops.append(_a2a(f"{tag}.last", pass_))
    return tuple(ops + [_work(f"{tag}.p{i}", pass_) for i in range(after)])


# forward: attention 3, dispatch, experts 2, combine, unpermute 1;
# backward: unpermute grad 1, combine grad, experts grad 4, dispatch grad, attention grad 6
LAYER = LayerOps(_pass(3, 2, 1, "f", Pass.FORWARD), _pass(1, 4, 6, "b", Pass.INPUT_GRAD), ())


def _seconds(weights: dict[str, float]):
    def price(ops: tuple[Op, ...]) -> OpsCost:
        return OpsCost(compute_s=sum(weights.get(op.name, 1.0) for op in ops))

    return price


def test_a_pass_is_cut_at_its_first_and_last_dispatcher_collectives():
    phases = pass_phases(LAYER.forward)
    assert phases is not None
    parts = (phases.before, phases.first_comm, phases.between, phases.last_comm, phases.after)
    assert [len(part) for part in parts] == [3, 1, 2, 1, 1]
    assert pass_phases(tuple(_work(f"x{i}") for i in range(4))) is None  # a dense pass


def test_short_collectives_are_hidden_whole():
    """Every op 1 s: separate 21 s; paired 1 + max(1, 3) + max(1, 4) + max(1, 2) + max(1, 6) + 1
    = 17 s: the four 1-s collectives are all hidden."""
    assert paired_saving_s(LAYER, _seconds({})) == pytest.approx(4.0)


def test_a_long_dispatch_is_hidden_only_under_the_backward_experts():
    """The forward dispatch 10 s: paired 1 + 3 + max(10, 4) + 2 + 6 + 1 = 23 s against 30 s."""
    assert paired_saving_s(LAYER, _seconds({"f.first": 10.0})) == pytest.approx(7.0)


def test_the_saving_comes_off_the_dispatcher_seconds_in_proportion():
    cost = ChunkCost(OpsCost(5.0, 0.5, 11.0), OpsCost(9.0, 0.25, 2.0), OpsCost(1.0))
    out = overlapped_cost(cost, 7.0)
    assert out.forward.ep_comm_s == pytest.approx(11.0 - 7.0 * 11 / 13)
    assert out.backward.ep_comm_s == pytest.approx(2.0 - 7.0 * 2 / 13)
    assert (out.forward.compute_s, out.forward.comm_s, out.recompute) == (5.0, 0.5, cost.recompute)
    assert overlapped_cost(cost, 0.0) == cost
    assert overlapped_cost(cost, 99.0).forward.ep_comm_s == pytest.approx(0.0)


def _moe_segment(scenario):
    workload = build_workload(scenario)
    return next(seg for seg in workload.stages[0].chunks[0].segments if seg.kind.moe)


def test_a_real_moe_layer_hides_some_but_not_more_than_its_dispatcher_seconds():
    scenario = parse_scenario(_data(), "s.yaml")
    segment = _moe_segment(scenario)
    layout = pricing_layout(scenario, H100)
    assert layout.ep_overlap
    plain = StagePricing(H100).segment(segment, pricing_layout(parse_scenario(_data(False), "s.yaml"), H100))
    hidden = StagePricing(H100).segment(segment, layout)
    forward = pass_phases(segment.layer.forward)
    assert forward is not None and all(is_expert_collective(op) for op in forward.first_comm)
    assert any(op.kind is OpKind.ATTENTION for op in forward.before)

    def price(ops):
        return price_ops(
            ops, H100, layout.tp, layout.dtype, layout.cp, False, segment.layer.fp8_recipe, layout.experts
        )

    saving = paired_saving_s(segment.layer, price)
    ep = plain.forward.ep_comm_s + plain.backward.ep_comm_s
    assert 0 < saving <= ep
    assert hidden.forward.ep_comm_s + hidden.backward.ep_comm_s == pytest.approx(ep - saving)
    assert hidden.forward.compute_s == plain.forward.compute_s


def test_the_step_is_faster_and_reports_less_ep_comm():
    on = run_simulation(*_load(True)).result
    off = run_simulation(*_load(False)).result
    assert on.iteration_time_s < off.iteration_time_s
    assert on.time_breakdown_s["ep_comm"] < off.time_breakdown_s["ep_comm"]


def _load(overlap):
    scenario = parse_scenario(_data(overlap), "s.yaml")
    return scenario, H100


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"parallel": {"vpp": 1}}, "parallel.vpp > 1"),
        ({"parallel": {"ep": 1, "dp": 32}}, "parallel.ep > 1"),
        ({"training": {"moe_token_dispatcher": "allgather"}}, "alltoall or flex"),
        ({"training": {"recompute": "full"}}, "recompute full"),
        ({"training": {"recompute": "selective", "recompute_modules": ["moe"]}}, "'moe'"),
    ],
)
def test_megatrons_rules_are_one_clear_error_each(changes, words):
    data = _data()
    for section, values in changes.items():
        data[section].update(values)
    with pytest.raises(ConfigError) as caught:
        parse_scenario(data, "s.yaml")
    message = str(caught.value)
    assert "training.overlap_moe_expert_parallel_comm" in message and words in message


def test_a_dense_model_refuses_it():
    data = yaml.safe_load((ROOT / "scenarios" / "paper" / "gpt3-175b-sp-selective.yaml").read_text())
    data["training"]["overlap_moe_expert_parallel_comm"] = True
    with pytest.raises(ConfigError, match="overlap_moe_expert_parallel_comm"):
        parse_scenario(data, "s.yaml")


def test_import_and_export_carry_the_flag():
    scenario = parse_scenario(_data(), "s.yaml")
    line = to_megatron_args(scenario, 8)
    assert "--overlap-moe-expert-parallel-comm" in shlex.split(line)
    assert parse_megatron_args(line, scenario.hardware, scenario.name).validated() == scenario
