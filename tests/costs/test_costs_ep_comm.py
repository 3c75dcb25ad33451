"""The `ep_comm` time category: a MoE layer's token-dispatcher collectives (every collective
over an expert group) are priced as their own part of a layer's cost (`OpsCost.ep_comm_s`),
reported as `ep_comm` in the engine's time breakdown and in the split by kind, and are no
longer part of TP comm; a dense layer has none."""

from __future__ import annotations

import pytest
import yaml

from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import parse_scenario
from simcluster.costs.chunk import OpsCost, op_group, price_ops
from simcluster.costs.network import collective_time_s
from simcluster.costs.stage_pricing import StagePricing, pricing_layout
from simcluster.simulation import run_simulation
from simcluster.workload.model import build_workload
from simcluster.workload.ops import CommGroup, OpKind
from tests.modern_cases import llama3_8b
from tests.paths import ROOT

H100 = load_hardware("h100-sxm5-80gb")
QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"


def _moe(tp=1, sp=False, dispatcher="alltoall", **parallel):
    data = yaml.safe_load(QWEN.read_text())
    data["parallel"].update(tp=tp, sequence_parallel=sp, **parallel)
    data["training"]["moe_token_dispatcher"] = dispatcher
    return parse_scenario(data, "s.yaml")


def _moe_layer(scenario):
    workload = build_workload(scenario)
    segment = next(seg for seg in workload.stages[0].chunks[0].segments if seg.kind.moe)
    layout = pricing_layout(scenario, H100)
    return segment.layer, StagePricing(H100).segment(segment, layout), layout


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
@pytest.mark.parametrize(("tp", "ep", "etp"), [(1, 8, None), (2, 8, 1), (2, 8, 2), (1, 16, None)])
def test_ep_comm_is_the_sum_of_the_expert_group_collectives(tp, ep, etp, dispatcher):
    """Each pass's ep_comm_s is Σ collective_time_s of its ops over EP / ETP / ETP·EP groups
    (they block: nothing hides them), and its comm_s holds none of them."""
    scenario = _moe(tp=tp, sp=tp > 1, ep=ep, etp=etp, dispatcher=dispatcher)
    ops, cost, layout = _moe_layer(scenario)
    for phase_ops, phase in ((ops.forward, cost.forward), (ops.backward, cost.backward)):
        expert = [op for op in phase_ops if op.kind is OpKind.COLLECTIVE and op.group is not CommGroup.TP]
        assert expert, "a MoE layer with ep > 1 has dispatcher collectives"
        want = sum(
            collective_time_s(op.collective, op.message_bytes, op_group(op, layout.tp, layout.experts), H100)
            for op in expert
        )
        assert phase.ep_comm_s == pytest.approx(want, rel=1e-12)
        dense_only = tuple(op for op in phase_ops if op not in expert)
        without = price_ops(dense_only, H100, layout.tp, layout.dtype, experts=layout.experts)
        assert phase.comm_s == pytest.approx(without.comm_s, rel=1e-12, abs=1e-15)
        assert phase.total_s == pytest.approx(without.total_s + want, rel=1e-12)


def test_ops_cost_adds_and_scales_ep_comm_and_keeps_a_dense_total_bit_for_bit():
    a, b = OpsCost(1.0, 0.25, 0.5), OpsCost(2.0, 0.5, 0.125)
    assert (a + b) == OpsCost(3.0, 0.75, 0.625)
    assert a.scaled(2.0) == OpsCost(2.0, 0.5, 1.0)
    assert a.total_s == 1.75
    dense = OpsCost(0.1, 0.2)
    assert dense.total_s == 0.1 + 0.2  # no third term added


def test_run_reports_ep_comm_for_moe_and_nothing_for_dense():
    """The engine's breakdown and the split by kind carry ep_comm: > 0 for a MoE run with
    ep > 1 (and it is no longer in tp_comm: tp = 1 has no TP collective), exactly 0 dense."""
    moe = run_simulation(_moe(ep=8), H100).result
    assert moe.time_breakdown_s["ep_comm"] > 0
    assert moe.time_by_kind_s["ep_comm"] > 0 and moe.layer_time_by_kind_s["ep_comm"] > 0
    assert moe.layer_time_by_kind_s["tp_comm"] == 0.0
    assert sum(moe.time_by_kind_s.values()) == pytest.approx(moe.iteration_time_s, rel=1e-9)
    assert sum(moe.layer_time_by_kind_s.values()) == pytest.approx(moe.layer.combined_s, rel=1e-9)
    assert list(moe.time_breakdown_s)[:4] == ["compute", "recompute", "tp_comm", "ep_comm"]
    dense = run_simulation(parse_scenario(llama3_8b(), "d.yaml"), H100).result
    assert dense.time_breakdown_s["ep_comm"] == 0.0 and dense.time_by_kind_s["ep_comm"] == 0.0


def test_allgather_is_priced_on_the_etp_ep_group_and_slower_once_it_leaves_the_node():
    """The allgather dispatcher's gathers run over etp·ep consecutive ranks: ep 8 stays in an
    8-GPU node (NVLink), ep 16 spans two (NICs), with the same per-rank tokens T: its
    gathered bytes double (T·ep·h) and the link is slower, so ep_comm more than doubles."""
    inside = _moe(ep=8, dispatcher="allgather")
    across = _moe(ep=16, dispatcher="allgather")
    assert not pricing_layout(inside, H100).experts.etp_ep.crosses_nodes
    assert pricing_layout(across, H100).experts.etp_ep.crosses_nodes
    _, cost_in, _ = _moe_layer(inside)
    _, cost_across, _ = _moe_layer(across)
    assert cost_across.forward.ep_comm_s > 2 * cost_in.forward.ep_comm_s
    result = run_simulation(across, H100).result
    assert result.time_breakdown_s["ep_comm"] > 0
