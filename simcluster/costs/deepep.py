"""DeepEP's dispatch and combine kernels (Megatron-core's flex token dispatcher) priced
from the links they use and the bandwidth DeepEP's kernels achieve on them.

DeepEP's normal (training) kernels send a token once to each destination rank: inside an
NVLink domain directly over NVLink, across domains once over RDMA to the peer with the
same local index in each destination domain, which forwards it over NVLink; the RDMA and
NVLink stages are pipelined. So a rank's kernel takes

    t = latency + max(NVLink bytes / (DEEPEP_NVLINK_EFFICIENCY · NVLink line rate),
                      RDMA bytes / (DEEPEP_RDMA_EFFICIENCY · NIC line rate per GPU))

where the NVLink bytes are every copy to another rank (each crosses NVLink once, on its
last hop), send·(1 − 1/ep), and the RDMA bytes the copies to other domains
(`DeepEPMessage.bytes_across`).

Achieved bandwidth, DeepEP's own measurement
(github.com/deepseek-ai/DeepEP/blob/0297fc801788b14b338a46554faca28d419e518a/docs/legacy.md,
"Normal kernels with NVLink and RDMA forwarding": H800, CX7 InfiniBand 400 Gb/s per GPU,
DeepSeek-V3 pretraining shape, 4096 tokens, hidden 7168, top-8): intranode EP 8 dispatch
153 GB/s, combine 158 GB/s (NVLink); internode dispatch 43 / 58 / 51 GB/s and combine
43 / 57 / 50 GB/s (RDMA) at EP 16 / 32 / 64. As shares of the line rates: NVLink 153 / 200
GB/s (H800: 400 GB/s NVLink, 200 each way) = 0.765, the dispatch's, the lower of the two;
RDMA 43 / 50 GB/s = 0.86, EP 16's, the lowest of the three (58 and 51 reach or pass the
line rate: V2's README calls its figures "logical bandwidth", local traffic included).
DeepEP V2's README (same commit) gives 643-740 GB/s NVLink at EP 8 on SM100 (B200, 900
GB/s each way: 0.71-0.82), consistent with the NVLink share. These are
applied to each profile's line rates (`network.nvlink_bandwidth_gb_per_s`,
`network.nic_bandwidth_gbit_per_s`): derived, not measured on that GPU.
"""

from __future__ import annotations

from simcluster import units
from simcluster.config.hardware import HardwareProfile
from simcluster.costs.network import GroupPlacement
from simcluster.workload.ops import DeepEPMessage

DEEPEP_NVLINK_EFFICIENCY = 153.0 / 200.0
"""DeepEP's intranode dispatch on H800 over its NVLink line rate each way (module docstring)."""
DEEPEP_RDMA_EFFICIENCY = 43.0 / 50.0
"""DeepEP's internode dispatch (EP 16) on H800 over its CX7 400 Gb/s line rate."""


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
    nvlink_s = message.send_bytes * (1.0 - 1.0 / ep) / deepep_nvlink_bytes_per_s(hw)
    if not group.crosses_nodes:
        return units.us_to_s(net.collective_base_latency_us + net.nvlink_latency_us) + nvlink_s
    domains = -(-ep // group.ranks_per_node)
    rdma_s = message.bytes_across(domains) / rdma_bytes_per_s(hw, DEEPEP_RDMA_EFFICIENCY)
    latency_s = units.us_to_s(net.collective_base_latency_us + net.ib_latency_per_step_us)
    return latency_s + max(nvlink_s, rdma_s)
