"""Hybrid-EP's dispatch and combine kernels (Megatron-core's flex token dispatcher with
`--moe-flex-dispatcher-backend hybridep`) priced from the links they use and the bandwidth
Hybrid-EP's own benchmarks report.

Hybrid-EP (NVIDIA, in DeepEP's hybrid-ep branch, github.com/deepseek-ai/DeepEP @
94a9f8f6b146c07d97ec58f67cd6d303296d6098, DeepEP/docs/README_Hybrid-EP.md and
DeepEP/docs/Hybrid-EP_Implementation.md) is hierarchical like DeepEP's normal kernels: inside an
NVLink domain (`num_of_nodes` counts NVLink domains, not hosts, so a GB200 NVL72 rack is one)
it moves tokens over NVLink with TMA copies; across domains it sends a token once over RDMA
to each destination domain, which forwards it over NVLink, the stages pipelined within one
kernel. So a rank's kernel takes

    t = latency + max(NVLink bytes / (share(r) · NVLink line rate),
                      RDMA bytes / (rdma share(N) · NIC line rate per GPU))
        + its own HBM work (the routing-map scan, the RDMA staging copy) at the
          profile's element-wise rate

with r the group's ranks in one NVLink domain. The NVLink bytes are every copy the rank
sends, its own included: the README's "algorithm bandwidth" divides the received tokens,
the rank's own among them (tests/test_hybrid_ep.py: `nvl_dispatch =
dispatched_hidden.numel() * 2`), by the kernel time, so the share divides the same bytes
(`costs.deepep` counts them the same way, as its source does). The RDMA bytes are
the copies to other domains, once per destination domain, as the test's
`count_rdma_send_from_routing_map`.

Achieved bandwidth, the README's "Kernel Only" columns (4096 tokens, hidden 7168, top-8,
uniform random routing, 8 local experts, BF16), at 32 SMs where measured: Megatron-Bridge's
performance scripts set `moe_hybridep_num_sms = 32` for every hybridep recipe
(NVIDIA-NeMo/Megatron-Bridge @0fbfe7d3e970fbd75c1281d71cee586ce1f3df5e, v0.4.0,
scripts/performance/utils/overrides.py).

* NVLink, GB200 (NVLink 5, 900 GB/s each way), 32 SMs: combine 737.13 / 666.26 / 639.80 /
  605.15 / 596.99 GB/s at 8 / 16 / 24 / 32 / 36 ranks in the domain; dispatch (BF16) is
  higher at every count (764 / 707 / 666 / 642 / 632), so the combine, the lower, sets the
  share: `HYBRIDEP_NVLINK_SHARE`, interpolated in r and held flat outside 8-36 (EP 64 in an
  NVL72 rack takes the 36-rank share; fewer than 8 ranks the 8-rank one). The README's B200
  row (8 ranks, 16 SMs: combine 673.84 of 900) agrees with GB200's at 16 SMs (684.27) within
  2 %, so the table serves every NVLink generation as a share of its line rate (H100 / H200:
  450 GB/s each way; no Hopper NVLink row is published): derived, not measured there.
* RDMA, H100 with 400 Gb/s InfiniBand per GPU (the README names H100, not the NIC; DGX
  H100's ConnectX-7 assumed), 16 SMs (32 not measured): combine 62.95 / 57.46 / 49.77 GB/s at
  EP 16 / 32 / 64 (2 / 4 / 8 nodes of 8), dispatch (BF16) 71.71 / 57.69 / 49.97. The test
  divides `count_rdma_send_from_routing_map`'s bytes, a token once per destination node with
  the sender's own node left in ("To align with the implementation in the DeepEP, we do not
  set the local node map to zeros", tests/utils.py), which is why the EP 16 figures pass the
  50 GB/s line: with uniform routing (N − 1)/N of them cross a NIC. What crosses, the
  combine's (the lower at each count): 62.95 · 1/2, 57.46 · 3/4, 49.77 · 7/8 GB/s of 50 =
  0.630 / 0.862 / 0.871 of the line, interpolated in the node count and flat outside 2–8
  (`costs.deepep.rdma_share_of_line`, as for DeepEP's table). Until 2026-11-27 the lowest
  figure was read as 49.77 GB/s crossing (0.9954 at every count).

What the kernels cost besides the transfer (docs/hybridep.md): the routing map's NCCL
all-gather is an op of its own (`workload.moe_layer._hybridep_dispatch_ops`), and the host
waits once per forward dispatch for the token counts (`costs.moe_host`).
"""

from __future__ import annotations

import numpy as np

from simcluster import units
from simcluster.config.hardware import HardwareProfile
from simcluster.config.moe_choices import FlexBackend
from simcluster.costs.compute import elementwise_time_s
from simcluster.costs.deepep import deepep_time_s, rdma_bytes_per_s, rdma_share_of_line
from simcluster.costs.network import GroupPlacement
from simcluster.workload.ops import DeepEPMessage

HYBRIDEP_NVLINK_COMBINE_GB_PER_S = ((8, 737.13), (16, 666.26), (24, 639.80), (32, 605.15), (36, 596.99))
"""(ranks in the NVLink domain, GB/s): the README's GB200 kernel-only combine at 32 SMs."""
GB200_NVLINK_GB_PER_S = 900.0  # NVLink 5, each way: the line rate those figures ran on
HYBRIDEP_RDMA_LOGICAL_GB_PER_S = ((2, 62.95), (4, 57.46), (8, 49.77))
"""(nodes the EP group spans, GB/s): the README's H100 kernel-only combine at 16 SMs, EP 16 /
32 / 64, as its test counts the bytes, the sender's own node included (module docstring)."""


def hybridep_rdma_share(domains: int) -> float:
    """Hybrid-EP's achieved share of the NIC line rate across `domains` NVLink domains."""
    return rdma_share_of_line(HYBRIDEP_RDMA_LOGICAL_GB_PER_S, domains)


def hybridep_nvlink_share(ranks_in_domain: int) -> float:
    """Hybrid-EP's achieved share of the NVLink line rate with `ranks_in_domain` ranks of
    its group in one domain (module docstring), held flat outside the measured 8-36."""
    ranks = [r for r, _ in HYBRIDEP_NVLINK_COMBINE_GB_PER_S]
    shares = [gb / GB200_NVLINK_GB_PER_S for _, gb in HYBRIDEP_NVLINK_COMBINE_GB_PER_S]
    return float(np.interp(ranks_in_domain, ranks, shares))


def hybridep_time_s(message: DeepEPMessage, group: GroupPlacement, hw: HardwareProfile) -> float:
    """One Hybrid-EP kernel of `message` over the EP group `group` (module docstring)."""
    ep = group.num_ranks
    if ep <= 1 or message.send_bytes <= 0:
        return 0.0
    net = hw.network
    in_domain = min(ep, group.ranks_per_node)
    nvlink_s = message.send_bytes / (hybridep_nvlink_share(in_domain) * hw.nvlink_bytes_per_s)
    scan_s = elementwise_time_s(message.preprocess_bytes, hw)
    if not group.crosses_nodes:
        return units.us_to_s(net.collective_base_latency_us + net.nvlink_latency_us) + nvlink_s + scan_s
    domains = -(-ep // group.ranks_per_node)
    rdma_s = message.bytes_across(domains) / rdma_bytes_per_s(hw, hybridep_rdma_share(domains))
    latency_s = units.us_to_s(net.collective_base_latency_us + net.ib_latency_per_step_us)
    return latency_s + max(nvlink_s, rdma_s) + scan_s + elementwise_time_s(message.staging_bytes, hw)


def flex_kernel_time_s(message: DeepEPMessage, group: GroupPlacement, hw: HardwareProfile) -> float:
    """A flex-dispatcher kernel, priced as its backend's (`DeepEPMessage.backend`)."""
    if message.backend is FlexBackend.HYBRIDEP:
        return hybridep_time_s(message, group, hw)
    return deepep_time_s(message, group, hw)
