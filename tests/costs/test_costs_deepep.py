"""DeepEP's kernels priced (`costs.deepep`): NVLink at DeepEP's achieved share of the line
rate inside an NVLink domain; across domains the RDMA part at its achieved share of the
NIC line rate, pipelined with the NVLink part; the flex dispatcher's layer prices them as
`ep_comm`."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import parse_scenario
from simcluster.costs.deepep import DEEPEP_NVLINK_EFFICIENCY, deepep_rdma_share, deepep_time_s
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
    """153 GB/s over H800's 200 GB/s NVLink each way. RDMA: combine 43 / 57 / 50 "logical" GB/s
    at 2 / 4 / 8 nodes, of which (N - 1)/N cross the 50 GB/s NIC; flat outside, linear between."""
    assert DEEPEP_NVLINK_EFFICIENCY == pytest.approx(0.765)
    assert deepep_rdma_share(2) == pytest.approx(43 / 2 / 50)
    assert deepep_rdma_share(4) == pytest.approx(57 * 3 / 4 / 50)
    assert deepep_rdma_share(8) == pytest.approx(50 * 7 / 8 / 50)
    assert deepep_rdma_share(16) == deepep_rdma_share(8)
    assert deepep_rdma_share(3) == pytest.approx((43 / 2 + 57 * 3 / 4) / 2 / 50)


def test_the_benchmarks_byte_count_keeps_the_senders_own_node():
    """What the (N - 1)/N rests on: DeepEP's test routes each token to min(N, 4) random nodes
    (top groups of random scores) and counts every node hit, its own included; the share of
    those copies that leave the node is (N - 1)/N."""
    rng = np.random.default_rng(0)
    for nodes in (2, 4, 8):
        scores = rng.random((20000, nodes))
        hit = np.argsort(-scores, axis=1)[:, : min(nodes, 4)]
        counted = hit.size
        remote = int((hit != 0).sum())  # the sender is on node 0
        assert remote / counted == pytest.approx((nodes - 1) / nodes, abs=0.01)


def test_inside_a_node_every_copy_counts_at_deepeps_rate_as_its_test_counts_them():
    """DeepEP's 153 GB/s divides every received token, the rank's own included, so the
    kernel takes all the rank's copies over that rate, not only the 7/8 that leave it."""
    message = DeepEPMessage(8, 100e6, ((2, 30e6),))
    t = deepep_time_s(message, GroupPlacement(8, 8), H100)
    assert t == pytest.approx(LATENCY_NVLINK_S + 100e6 / (0.765 * 450e9), rel=1e-12)
    assert deepep_time_s(message, GroupPlacement(1, 1), H100) == 0.0


def test_across_nodes_the_slower_of_rdma_and_nvlink_sets_the_time():
    """ep 16 over two 8-GPU nodes: the RDMA bytes for 2 domains at 0.43 × 400 Gb/s per GPU."""
    message = DeepEPMessage(16, 100e6, ((2, 30e6), (4, 50e6)))
    t = deepep_time_s(message, GroupPlacement(16, 8), H100)
    rdma_s = 30e6 / (0.43 * 50e9)
    nvlink_s = 100e6 / (0.765 * 450e9)
    assert rdma_s > nvlink_s
    assert t == pytest.approx(LATENCY_IB_S + rdma_s, rel=1e-12)
    # four domains (ep 32 over 8-GPU nodes): the bytes for 4 domains
    t4 = deepep_time_s(DeepEPMessage(32, 100e6, ((2, 30e6), (4, 50e6))), GroupPlacement(32, 8), H100)
    assert t4 == pytest.approx(LATENCY_IB_S + 50e6 / (0.855 * 50e9), rel=1e-12)
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
