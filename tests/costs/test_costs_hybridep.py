"""Hybrid-EP's kernels priced (`costs.hybridep`): NVLink at the share of the line rate
Hybrid-EP's README measures for the group's ranks in one domain (every copy, the rank's own
included), RDMA at its measured share of the NIC, pipelined with the NVLink part, plus its
own HBM work (routing-map scan, RDMA staging copy); a flex op is priced by its backend."""

from __future__ import annotations

import pytest
import yaml

from simcluster.config.hardware import load_hardware
from simcluster.config.moe_choices import FlexBackend
from simcluster.config.scenario import parse_scenario
from simcluster.costs.compute import elementwise_time_s
from simcluster.costs.deepep import deepep_time_s
from simcluster.costs.hybridep import (
    flex_kernel_time_s,
    hybridep_nvlink_share,
    hybridep_rdma_share,
    hybridep_time_s,
)
from simcluster.costs.network import GroupPlacement, collective_time_s
from simcluster.costs.stage_pricing import StagePricing, pricing_layout
from simcluster.workload.model import build_workload
from simcluster.workload.ops import CollectiveKind, DeepEPMessage
from tests.paths import ROOT

H100 = load_hardware("h100-sxm5-80gb")
GB200 = load_hardware("gb200-nvl72")
QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"
LATENCY_NVLINK_S = (8.4 + 3.4) * 1e-6  # the H100 profile's base + NVLink step latency
LATENCY_IB_S = (8.4 + 14) * 1e-6
HEP = FlexBackend.HYBRIDEP


def test_the_shares_are_the_readmes_gb200_combine_figures_over_900_gb_per_s():
    """737.13 GB/s at 8 ranks, 596.99 at 36 (and beyond), linear between the measured counts."""
    assert hybridep_nvlink_share(8) == pytest.approx(737.13 / 900)
    assert hybridep_nvlink_share(4) == pytest.approx(737.13 / 900)
    assert hybridep_nvlink_share(64) == pytest.approx(596.99 / 900)
    assert hybridep_nvlink_share(20) == pytest.approx((666.26 + 639.80) / 2 / 900)


def test_the_rdma_shares_are_the_readmes_h100_combine_figures_less_the_senders_own_node():
    """62.95 / 57.46 / 49.77 GB/s at 2 / 4 / 8 nodes count the sender's own node; (N - 1)/N of
    them cross the 50 GB/s NIC. Two nodes reach 0.63 of the line, four and eight 0.86-0.87."""
    assert hybridep_rdma_share(2) == pytest.approx(62.95 / 2 / 50)
    assert hybridep_rdma_share(4) == pytest.approx(57.46 * 3 / 4 / 50)
    assert hybridep_rdma_share(8) == pytest.approx(49.77 * 7 / 8 / 50)
    assert hybridep_rdma_share(1) == hybridep_rdma_share(2)
    assert hybridep_rdma_share(9) == hybridep_rdma_share(8)


def test_inside_a_domain_every_copy_crosses_nvlink_at_the_share_plus_the_scan():
    message = DeepEPMessage(8, 100e6, ((2, 30e6),), HEP, preprocess_bytes=4e6, staging_bytes=9e6)
    t = hybridep_time_s(message, GroupPlacement(8, 8), H100)
    nvlink_s = 100e6 / (737.13 / 900 * 450e9)
    assert t == pytest.approx(LATENCY_NVLINK_S + nvlink_s + elementwise_time_s(4e6, H100), rel=1e-12)
    assert hybridep_time_s(message, GroupPlacement(1, 1), H100) == 0.0


def test_across_domains_rdma_at_the_measured_share_and_the_staging_copy_are_added():
    """ep 16 over two 8-GPU H100 nodes: 30 MB to the other node at 0.63 × 50 GB/s, slower
    than the NVLink part; the staging copy of the rank's tokens comes on top."""
    message = DeepEPMessage(16, 100e6, ((2, 30e6),), HEP, preprocess_bytes=0.0, staging_bytes=9e6)
    t = hybridep_time_s(message, GroupPlacement(16, 8), H100)
    rdma_s = 30e6 / (62.95 / 2 / 50 * 50e9)
    assert rdma_s > 100e6 / (737.13 / 900 * 450e9)
    assert t == pytest.approx(LATENCY_IB_S + rdma_s + elementwise_time_s(9e6, H100), rel=1e-12)
    # DeepEP's RDMA runs at 0.43 of the line over two nodes: the same bytes take longer there
    deepep = DeepEPMessage(16, 100e6, ((2, 30e6),))
    assert deepep_time_s(deepep, GroupPlacement(16, 8), H100) > LATENCY_IB_S + rdma_s


def test_a_whole_nvl72_rack_is_one_domain_at_the_widest_measured_share():
    """EP 64 in GB200's 72-GPU NVLink domain: no RDMA, the 36-rank share (held flat)."""
    message = DeepEPMessage(64, 500e6, (), HEP)
    t = hybridep_time_s(message, GroupPlacement(64, 72), GB200)
    latency_s = (GB200.network.collective_base_latency_us + GB200.network.nvlink_latency_us) * 1e-6
    assert t == pytest.approx(latency_s + 500e6 / (596.99 / 900 * GB200.nvlink_bytes_per_s), rel=1e-12)


def test_a_flex_kernel_is_priced_by_its_backend():
    deepep = DeepEPMessage(16, 100e6, ((2, 30e6),))
    group = GroupPlacement(16, 8)
    assert flex_kernel_time_s(deepep, group, H100) == deepep_time_s(deepep, group, H100)
    hybrid = DeepEPMessage(16, 100e6, ((2, 30e6),), HEP)
    assert flex_kernel_time_s(hybrid, group, H100) == hybridep_time_s(hybrid, group, H100)
    assert flex_kernel_time_s(hybrid, group, H100) != flex_kernel_time_s(deepep, group, H100)


def test_the_hybridep_layer_prices_its_kernels_and_map_gather_as_ep_comm():
    data = yaml.safe_load(QWEN.read_text())
    data["parallel"]["ep"] = 16
    data["training"]["moe_token_dispatcher"] = "flex"
    data["training"]["moe_flex_dispatcher_backend"] = "hybridep"
    scenario = parse_scenario(data, "s.yaml")
    segment = next(seg for seg in build_workload(scenario).stages[0].chunks[0].segments if seg.kind.moe)
    layout = pricing_layout(scenario, H100)
    cost = StagePricing(H100).segment(segment, layout)
    kernels = [op for op in segment.layer.forward if op.deepep is not None]
    assert [op.deepep.backend for op in kernels] == [HEP, HEP]
    want = sum(hybridep_time_s(op.deepep, layout.experts.ep, H100) for op in kernels)
    (gather,) = [op for op in segment.layer.forward if op.collective is CollectiveKind.ALL_GATHER]
    assert gather.message_bytes == 4096 * 16 * 128  # the [T·ep, E] routing map, one byte each
    want += collective_time_s(CollectiveKind.ALL_GATHER, gather.message_bytes, layout.experts.ep, H100)
    assert cost.forward.ep_comm_s == pytest.approx(want, rel=1e-12)
