"""MoE communication priced (`costs.network.all_to_all_time_s`, `costs.placement.expert_groups`,
`costs.stage_pricing`): the all-to-all goes over NVLink inside the NVLink domain and the
NICs beyond it, so its time grows when the EP group crosses nodes; the expert groups follow
Megatron-core's folding (`workload.moe_groups`); expert gradients reduce over the
expert-data-parallel group."""

from __future__ import annotations

import pytest
import yaml

from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import parse_scenario
from simcluster.costs.network import GroupPlacement, all_to_all_time_s, collective_time_s
from simcluster.costs.placement import expert_groups
from simcluster.costs.stage_pricing import StagePricing
from simcluster.workload.model import build_workload
from simcluster.workload.moe_config import ExpertLayout
from simcluster.workload.moe_groups import group_spans
from simcluster.workload.ops import CollectiveKind
from tests.paths import ROOT

QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"
H100 = "h100-sxm5-80gb"


def _scenario(**parallel):
    data = yaml.safe_load(QWEN.read_text())
    data["parallel"].update(parallel)
    return parse_scenario(data, "s.yaml")


def test_all_to_all_inside_a_node_is_nvlink_and_slower_across_nodes():
    hw = load_hardware(H100)
    size = 64e6
    inside = all_to_all_time_s(size, GroupPlacement(8, 8), hw)
    across = all_to_all_time_s(size, GroupPlacement(16, 8), hw)
    spread = all_to_all_time_s(size, GroupPlacement(16, 2), hw)
    assert 0 < inside < across < spread
    # inside: 7/8 of the buffer at NVLink speed, never below its latency floor
    assert inside >= 7 / 8 * size / (hw.nvlink_bytes_per_s * 1.01)
    # across: at least the remote half through the GPU's NIC share
    nic = hw.nic_bytes_per_s * hw.network.nics_per_node / hw.network.gpus_per_node
    assert across >= 8 / 16 * size / nic
    assert collective_time_s(CollectiveKind.ALL_TO_ALL, size, GroupPlacement(16, 8), hw) == across
    assert all_to_all_time_s(size, GroupPlacement(1, 1), hw) == 0.0


@pytest.mark.parametrize(
    ("tp", "dp", "ep", "etp"), [(1, 32, 8, None), (1, 32, 16, None), (2, 16, 8, 2), (2, 16, 8, 1)]
)
def test_expert_groups_follow_megatron_folding(tp, dp, ep, etp):
    hw = load_hardware(H100)
    sp = tp > 1
    scenario = _scenario(tp=tp, dp=dp, ep=ep, etp=etp, sequence_parallel=sp)
    groups = expert_groups(scenario, hw)
    spans = {span.name: span for span in group_spans(ExpertLayout(tp, 1, dp, ep, etp), hw.nvlink_domain_size)}
    for name in ("ep", "etp", "edp"):
        placement = getattr(groups, name)
        assert placement.num_ranks == spans[name].size
        assert placement.crosses_nodes == spans[name].crosses_domain, name


def _layer_comm_s(**parallel):
    hw = load_hardware(H100)
    scenario = _scenario(**parallel)
    workload = build_workload(scenario)
    pricing = StagePricing(hw)
    priced = pricing.stages(scenario, workload)[0]
    layer = next(seg for seg in workload.stages[0].chunks[0].segments if seg.kind.moe)
    from simcluster.costs.stage_pricing import pricing_layout

    cost = pricing.segment(layer, pricing_layout(scenario, hw))
    return cost, priced


def test_layer_all_to_all_time_grows_when_ep_crosses_nodes():
    """Same per-rank dispatch bytes (T·k rows whatever ep), ep 8 in one node, ep 16 over two."""
    inside, _ = _layer_comm_s(ep=8)
    across, _ = _layer_comm_s(ep=16)
    assert across.forward.ep_comm_s > 2 * inside.forward.ep_comm_s
    assert across.backward.ep_comm_s > 2 * inside.backward.ep_comm_s
    # experts split further: half the local experts, each with twice the tokens (G·M = T·topk),
    # so the same expert GEMM work per rank, at nearly the same measured grouped rate
    assert across.forward.compute_s == pytest.approx(inside.forward.compute_s, rel=0.01)


def test_expert_gradients_reduce_over_the_expert_data_parallel_group():
    _, priced = _layer_comm_s(ep=8)  # edp = 32 / 8 = 4
    assert priced.expert_grad_reduce is not None and priced.expert_grad_reduce.seconds > 0
    _, full = _layer_comm_s(ep=32, dp=32)  # edp = 1: nothing to reduce
    assert full.expert_grad_reduce is None
    # the expert parameter all-gather (distributed optimizer) rides on the dense gather's pieces
    assert all(len(chunk) >= 2 for chunk in priced.param_gather.buckets)
