"""DeepEP's dispatch and combine kernels (Megatron-core's flex token dispatcher) priced
from the links they use and the bandwidth DeepEP's kernels achieve on them.

DeepEP's normal (training) kernels send a token once to each destination rank: inside an
NVLink domain directly over NVLink, across domains once over RDMA to the peer with the
same local index in each destination domain, which forwards it over NVLink; the RDMA and
NVLink stages are pipelined. So a rank's kernel takes

    t = latency + max(NVLink bytes / (DEEPEP_NVLINK_EFFICIENCY · NVLink line rate),
                      RDMA bytes / (rdma share(N) · NIC line rate per GPU))

where the NVLink bytes are every copy the rank sends, its own included, as DeepEP's test
counts the bytes behind its NVLink figure (tests/legacy/test_intranode.py:
`dispatch_bf16_nvl_recv_bytes = recv_x.numel() * 2`, the received tokens, the rank's own among
them; until 2026-11-27 the own copy was left out, send·(1 − 1/ep), pricing the kernel 1/ep
short of the time the figure was measured on), and the RDMA bytes the copies to other domains
(`DeepEPMessage.bytes_across`).

Achieved bandwidth, DeepEP's own measurement
(github.com/deepseek-ai/DeepEP/blob/0297fc801788b14b338a46554faca28d419e518a/docs/legacy.md,
"Normal kernels with NVLink and RDMA forwarding": H800, CX7 InfiniBand 400 Gb/s per GPU,
DeepSeek-V3 pretraining shape, 4096 tokens, hidden 7168, top-8): intranode EP 8 dispatch
153 GB/s, combine 158 GB/s (NVLink); internode dispatch 43 / 58 / 51 GB/s and combine
43 / 57 / 50 GB/s (RDMA) at EP 16 / 32 / 64. As shares of the line rates: NVLink 153 / 200
GB/s (H800: 400 GB/s NVLink, 200 each way) = 0.765, the dispatch's, the lower of the two.

RDMA: the test that prints those figures (tests/legacy/test_internode.py, `num_rdma_token_sent`:
the distinct nodes of each token's experts, "RDMA send bytes" = that count × hidden × 2) counts a
token once per destination node *its own node included*, so only (N − 1)/N of the bytes it
divides by the time cross a NIC (N nodes, 8 GPUs each; the test's routing picks
min(N, 4) nodes at random per token, so each node is hit equally often, the sender's own as
well). That is why 58 and 51 GB/s pass the 50 GB/s line. What crosses: 43 · 1/2, 57 · 3/4,
50 · 7/8 GB/s of 50 at N = 2 / 4 / 8: 0.43 / 0.855 / 0.875 of the line, the combine's (the
lower at each count), interpolated in N and held flat outside 2–8 (`rdma_share_of_line`).
Two nodes run at half the share of four or eight; Hybrid-EP's H100 table shows the same
(`costs.hybridep`).
DeepEP V2's README (same commit) gives 643-740 GB/s NVLink at EP 8 on SM100 (B200, 900
GB/s each way: 0.71-0.82), consistent with the NVLink share. These are
applied to each profile's line rates (`network.nvlink_bandwidth_gb_per_s`,
`network.nic_bandwidth_gbit_per_s`): derived, not measured on that GPU.
"""

from __future__ import annotations

import numpy as np

from simcluster import units
from simcluster.config.hardware import HardwareProfile
from simcluster.costs.network import GroupPlacement
from simcluster.workload.ops import DeepEPMessage

DEEPEP_NVLINK_EFFICIENCY = 153.0 / 200.0
"""DeepEP's intranode dispatch on H800 over its NVLink line rate each way (module docstring)."""
DEEPEP_RDMA_LOGICAL_GB_PER_S = ((2, 43.0), (4, 57.0), (8, 50.0))
"""(nodes the EP group spans, GB/s): DeepEP's internode combine on H800 at EP 16 / 32 / 64 as its
test counts the bytes, the token's own node included (module docstring)."""
BENCHMARK_NIC_GB_PER_S = 50.0  # CX7 400 Gb/s: the NIC both EP libraries' tables ran on


def rdma_share_of_line(logical_gb_per_s: tuple[tuple[int, float], ...], domains: int) -> float:
    """The share of its NIC's line rate an EP kernel's RDMA stage reaches with its group over
    `domains` NVLink domains, from a table of "logical" bandwidths by domain count that, as
    DeepEP's and Hybrid-EP's tests do, count each token once per destination domain with the
    sender's own domain among them: (N − 1)/N of those bytes cross a NIC (module docstring).
    Interpolated in N between the measured counts, held flat outside them."""
    counts = [n for n, _ in logical_gb_per_s]
    shares = [gb * (1.0 - 1.0 / n) / BENCHMARK_NIC_GB_PER_S for n, gb in logical_gb_per_s]
    return float(np.interp(domains, counts, shares))


def deepep_rdma_share(domains: int) -> float:
    """DeepEP's achieved share of the NIC line rate across `domains` nodes."""
    return rdma_share_of_line(DEEPEP_RDMA_LOGICAL_GB_PER_S, domains)


def deepep_nvlink_bytes_per_s(hw: HardwareProfile) -> float:
    return DEEPEP_NVLINK_EFFICIENCY * hw.nvlink_bytes_per_s


def rdma_bytes_per_s(hw: HardwareProfile, efficiency: float) -> float:
    """The GPU's share of its node's NICs at an EP kernel's achieved share (`efficiency`) of
    the line rate: DeepEP's here, Hybrid-EP's in `costs.hybridep`."""
    net = hw.network
    line = units.gbit_per_s_to_bytes_per_s(net.nic_bandwidth_gbit_per_s)
    return efficiency * line * net.nics_per_node / net.gpus_per_node


def deepep_time_s(message: DeepEPMessage, group: GroupPlacement, hw: HardwareProfile) -> float:
    """One DeepEP kernel of `message` over the EP group `group` (module docstring)."""
    ep = group.num_ranks
    if ep <= 1 or message.send_bytes <= 0:
        return 0.0
    net = hw.network
    nvlink_s = message.send_bytes / deepep_nvlink_bytes_per_s(hw)
    if not group.crosses_nodes:
        return units.us_to_s(net.collective_base_latency_us + net.nvlink_latency_us) + nvlink_s
    domains = -(-ep // group.ranks_per_node)
    rdma_s = message.bytes_across(domains) / rdma_bytes_per_s(hw, deepep_rdma_share(domains))
    latency_s = units.us_to_s(net.collective_base_latency_us + net.ib_latency_per_step_us)
    return latency_s + max(nvlink_s, rdma_s)
