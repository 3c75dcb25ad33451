"""DeepEP's kernels priced (`costs.deepep`): NVLink at DeepEP's achieved share of the line
rate inside an NVLink domain; across domains the RDMA part at its achieved share of the
NIC line rate, pipelined with the NVLink part; the flex dispatcher's layer prices them as
`ep_comm`."""

from __future__ import annotations

import pytest
import yaml

from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import parse_scenario
from simcluster.costs.deepep import DEEPEP_NVLINK_EFFICIENCY, DEEPEP_RDMA_EFFICIENCY, deepep_time_s
from simcluster.costs.network import GroupPlacement
from simcluster.costs.stage_pricing import StagePricing, pricing_layout
from simcluster.simulation import run_simulation
from simcluster.workload.model import build_workload
from simcluster.workload.ops import DeepEPMessage
from tests.paths import ROOT

H100 = load_hardware("h100-sxm5-80gb")
QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"
LATENCY_NVLINK_S = (8.4 + 3.4) * 1e-6  # the H100 profile's base + NVLink step latency
LATENCY_IB_S = (8.4 + 14) * 1e-6


def test_the_efficiencies_are_deepeps_published_h800_figures():
    """153 GB/s over H800's 200 GB/s NVLink each way; 43 GB/s over CX7's 50 GB/s."""
    assert DEEPEP_NVLINK_EFFICIENCY == pytest.approx(0.765)
    assert DEEPEP_RDMA_EFFICIENCY == pytest.approx(0.86)


def test_inside_a_node_the_copies_to_other_ranks_cross_nvlink_at_deepeps_rate():
    message = DeepEPMessage(8, 100e6, ((2, 30e6),))
    t = deepep_time_s(message, GroupPlacement(8, 8), H100)
    assert t == pytest.approx(LATENCY_NVLINK_S + 100e6 * 7 / 8 / (0.765 * 450e9), rel=1e-12)
    assert deepep_time_s(message, GroupPlacement(1, 1), H100) == 0.0


def test_across_nodes_the_slower_of_rdma_and_nvlink_sets_the_time():
    """ep 16 over two 8-GPU nodes: the RDMA bytes for 2 domains at 0.86 × 400 Gb/s per GPU."""
    message = DeepEPMessage(16, 100e6, ((2, 30e6), (4, 50e6)))
    t = deepep_time_s(message, GroupPlacement(16, 8), H100)
    rdma_s = 30e6 / (0.86 * 50e9)
    nvlink_s = 100e6 * 15 / 16 / (0.765 * 450e9)
    assert rdma_s > nvlink_s
    assert t == pytest.approx(LATENCY_IB_S + rdma_s, rel=1e-12)
    # four domains (ep 32 over 8-GPU nodes): the bytes for 4 domains
    t4 = deepep_time_s(DeepEPMessage(32, 100e6, ((2, 30e6), (4, 50e6))), GroupPlacement(32, 8), H100)
    assert t4 == pytest.approx(LATENCY_IB_S + 50e6 / (0.86 * 50e9), rel=1e-12)
    # a domain count not computed: every copy to another domain, send·(1 − 1/n)
    assert DeepEPMessage(24, 90e6, ()).bytes_across(3) == pytest.approx(60e6)


def _flex(ep, dispatcher="flex"):
    data = yaml.safe_load(QWEN.read_text())
    data["parallel"]["ep"] = ep
    data["training"]["moe_token_dispatcher"] = dispatcher
    return parse_scenario(data, "s.yaml")


def test_the_flex_layer_prices_its_deepep_kernels_as_ep_comm():
    for ep in (8, 16):
        scenario = _flex(ep)
        workload = build_workload(scenario)
        segment = next(seg for seg in workload.stages[0].chunks[0].segments if seg.kind.moe)
        layout = pricing_layout(scenario, H100)
        cost = StagePricing(H100).segment(segment, layout)
        kernels = [op for op in segment.layer.forward if op.deepep is not None]
        want = sum(deepep_time_s(op.deepep, layout.experts.ep, H100) for op in kernels)
        assert len(kernels) == 2 and cost.forward.ep_comm_s == pytest.approx(want, rel=1e-12)
        assert cost.forward.comm_s == 0.0  # tp 1: nothing else to send
    result = run_simulation(_flex(16), H100).result
    assert result.time_breakdown_s["ep_comm"] > 0
