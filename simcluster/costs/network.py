"""Collectives and point-to-point messages priced with bandwidth and latency terms.

Ring algorithms (NCCL): an all-reduce moves 2(n−1)/n of the buffer through each rank's
link, all-gather and reduce-scatter (n−1)/n. nccl-tests reports "bus bandwidth" on exactly
this scale, so a measured busbw prices every ring collective of the same buffer size:
    t = max(factor · S / busbw(S),   (inside an NVLink domain, busbw(S) interpolated in log S
            latency)                  from the profile's measured NVLink sweep, which already
                                      contains the small-message latency)
    t = latency + factor · S / min(k · NIC, busbw_nvlink(S))   (across domains; k ranks of
                                      the group per domain each drive their own NIC, as one
                                      NIC per GPU allows)
with latency = base + steps · per-step network latency (NCCL tuning.cc, ring).
The NVLink domain is a node (DGX: 8 GPUs), or a rack of compute trays on one NVLink fabric
(GB200 NVL72: 72 GPUs, 4 per tray). All-reduce reads the profile's all-reduce sweep (NVLS
where the system uses it; capped by the ring sweep over at most 4 ranks, where NCCL runs a
ring: `NVLS_MAX_RING_RANKS`); all-gather and reduce-scatter read its ring sweep where it gives
one (`nvlink_allgather_busbw`; NVLink SHARP accelerates all-reduce only), else the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simcluster import units
from simcluster.config.hardware import HardwareProfile
from simcluster.workload.ops import CollectiveKind


@dataclass(frozen=True, slots=True)
class GroupPlacement:
    """A communicator: its size and how many of its ranks share a node, where "node" is
    the NVLink domain (`HardwareProfile.nvlink_domain_size`): ranks in one reach each other
    over NVLink even across compute trays."""

    num_ranks: int
    ranks_per_node: int

    @property
    def crosses_nodes(self) -> bool:
        return self.num_ranks > self.ranks_per_node


def ring_factor(kind: CollectiveKind, num_ranks: int) -> float:
    """Bytes through each rank's link per buffer byte (nccl-tests busbw factor)."""
    share = (num_ranks - 1) / num_ranks
    return 2 * share if kind is CollectiveKind.ALL_REDUCE else share


def ring_steps(kind: CollectiveKind, num_ranks: int) -> int:
    return 2 * (num_ranks - 1) if kind is CollectiveKind.ALL_REDUCE else num_ranks - 1


NVLS_MAX_RING_RANKS = 4
"""The largest all-reduce group NCCL still runs as a ring on an NVSwitch node: with 4 GPUs of
8×H200 it picks Ring (363.3 GB/s busbw at 8 GiB, the same with NVLS disabled), NVLS from 5;
on 8×B200 Ring through 5 (673.2 at 4), NVLS from 6 (stas00/ml-engineering @744d01e
network/README.md, "SHARP"). An NVLS busbw is not a rate on the wire (sjeaugey,
NVIDIA/nccl-tests#212: "With NVLink SHARP neither the algbw nor busbw correspond to the
bandwidth on the wire"): the profiles' NVLS sweeps, measured on 8 GPUs, price only the time of
an all-reduce of that width, not 2(n − 1)/n · S of a smaller ring over the same busbw."""


def _sweep_gb_per_s(table: list[tuple[float, float]], message_bytes: float) -> float:
    sizes = np.log([units.BYTES_PER_MB * mb for mb, _ in table])
    rates = [gb for _, gb in table]
    return float(np.interp(math.log(max(message_bytes, 1.0)), sizes, rates))


def nvlink_busbw_bytes_per_s(
    message_bytes: float,
    hw: HardwareProfile,
    kind: CollectiveKind = CollectiveKind.ALL_REDUCE,
    num_ranks: int | None = None,
) -> float:
    """busbw from the profile's sweep for `kind` (module docstring). An all-reduce over at
    most `NVLS_MAX_RING_RANKS` ranks runs as a ring: where the profile has a ring sweep
    (`nvlink_allgather_busbw`), its busbw caps the all-reduce sweep's (whose small sizes keep
    their latency ramp, the ring table being one large-message point on most profiles)."""
    net = hw.network
    if kind is not CollectiveKind.ALL_REDUCE and net.nvlink_allgather_busbw:
        return units.gb_per_s_to_bytes_per_s(_sweep_gb_per_s(net.nvlink_allgather_busbw, message_bytes))
    gb_per_s = _sweep_gb_per_s(net.nvlink_allreduce_busbw, message_bytes)
    if num_ranks is not None and num_ranks <= NVLS_MAX_RING_RANKS and net.nvlink_allgather_busbw:
        gb_per_s = min(gb_per_s, _sweep_gb_per_s(net.nvlink_allgather_busbw, message_bytes))
    return units.gb_per_s_to_bytes_per_s(gb_per_s)


def all_to_all_time_s(message_bytes: float, group: GroupPlacement, hw: HardwareProfile) -> float:
    """One all-to-all (NCCL: n − 1 concurrent sends and receives, `ncclSend`/`ncclRecv` in a
    group) of a `message_bytes` buffer per rank over `group`: 1/n of it stays on the rank,
    (k − 1)/n goes to the peers in its NVLink domain (k = `ranks_per_node`) over NVLink, and
    (n − k)/n to the others through the GPU's share of the node's NICs; the two run at once:

        t = latency + max((k − 1)/n · S / busbw_nvlink(S),  (n − k)/n · S / NIC share)

    with the NVLink rate from the profile's all-gather (else all-reduce) sweep at S, and
    latency = base + one step of the slowest link crossed (the sends are concurrent, not a
    ring). Pass the busiest rank's bytes: the slowest rank sets the pace of the layer."""
    n = group.num_ranks
    if n <= 1 or message_bytes <= 0:
        return 0.0
    net = hw.network
    k = min(group.ranks_per_node, n)
    nvlink = nvlink_busbw_bytes_per_s(message_bytes, hw, CollectiveKind.ALL_GATHER)
    local_s = (k - 1) / n * message_bytes / nvlink
    if not group.crosses_nodes:
        floor_s = units.us_to_s(net.collective_base_latency_us + net.nvlink_latency_us)
        return max(floor_s, local_s)
    nic_share = hw.nic_bytes_per_s * net.nics_per_node / net.gpus_per_node
    remote_s = (n - k) / n * message_bytes / nic_share
    latency_s = units.us_to_s(net.collective_base_latency_us + net.ib_latency_per_step_us)
    return latency_s + max(local_s, remote_s)


def collective_time_s(
    kind: CollectiveKind, message_bytes: float, group: GroupPlacement, hw: HardwareProfile
) -> float:
    """Time of one ring collective over `group` of a `message_bytes` buffer (an all-to-all:
    `all_to_all_time_s`)."""
    if group.num_ranks <= 1 or message_bytes <= 0:
        return 0.0
    if kind is CollectiveKind.ALL_TO_ALL:
        return all_to_all_time_s(message_bytes, group, hw)
    factor = ring_factor(kind, group.num_ranks)
    nvlink = nvlink_busbw_bytes_per_s(message_bytes, hw, kind, min(group.num_ranks, group.ranks_per_node))
    net = hw.network
    if not group.crosses_nodes:
        floor_s = units.us_to_s(
            net.collective_base_latency_us + ring_steps(kind, group.num_ranks) * net.nvlink_latency_us
        )
        return max(floor_s, factor * message_bytes / nvlink)
    latency_s = units.us_to_s(
        net.collective_base_latency_us + ring_steps(kind, group.num_ranks) * net.ib_latency_per_step_us
    )
    nic_share = hw.nic_bytes_per_s * net.nics_per_node / net.gpus_per_node
    busbw = min(group.ranks_per_node * nic_share, nvlink)
    return latency_s + factor * message_bytes / busbw


def small_allreduce_s(group: GroupPlacement, hw: HardwareProfile) -> float:
    """One synchronous all-reduce of a few hundred bytes to a few KB over `group`: latency
    only. NCCL's tree algorithm for small messages crosses about 2·⌈log2 n⌉ hops (up and down
    a tree), at the profile's per-step latency of the slowest link it crosses."""
    if group.num_ranks <= 1:
        return 0.0
    net = hw.network
    step_us = net.ib_latency_per_step_us if group.crosses_nodes else net.nvlink_latency_us
    hops = 2 * math.ceil(math.log2(group.num_ranks))
    return units.us_to_s(net.collective_base_latency_us + hops * step_us)


def p2p_time_s(message_bytes: float, same_node: bool, hw: HardwareProfile) -> float:
    """One send/recv: NVLink inside an NVLink domain, the GPU's own NIC across domains."""
    if message_bytes <= 0:
        return 0.0
    net = hw.network
    if same_node:
        bandwidth = hw.nvlink_bytes_per_s * net.nvlink_p2p_efficiency
        latency_s = units.us_to_s(net.collective_base_latency_us + net.nvlink_latency_us)
        return latency_s + message_bytes / bandwidth
    nic_share = hw.nic_bytes_per_s * net.nics_per_node / net.gpus_per_node
    latency_s = units.us_to_s(net.collective_base_latency_us + net.ib_latency_per_step_us)
    return latency_s + message_bytes / nic_share
