"""The context-parallel K/V ring priced on the context-parallel group's links.

TE's `AttnFuncWithCPAndKVP2P` (`attention/dot_product_attention/context_parallel.py`)
posts the send/recv of the next step's K/V before computing the current step, on the same
ring: step i's attention and the transfer that step i + 1 waits for run together, so a
step costs the longer of the two. Step 0 uses
the rank's own K/V (TE's `p2p_comm_buffers[0]` is the local K/V: nothing to wait for, and a
send is posted only while i < c − 1); the last step has no transfer beside it, and the
backward ends with the accumulated dK/dV sent back to its owner:

    forward  = Σ_{i < c−1} max(attn_i, send_i) + attn_{c−1} + merges
    backward = Σ_{i < c−1} max(attn_i, send_i) + attn_{c−1} + send(dK, dV) + merges

where the merges are the element-wise kernels that fold each step's partial output (or dQ,
dK/dV) into the result (`ring_merge_time_s`).

Every step after the first waits for the slower of the two tile kinds that ranks compute at
that step (`RingAttention.lower` / `upper`), since the ring advances in lock-step. A
transfer is a point-to-point message over NVLink when the ring stays in one NVLink domain,
else over the GPU's NIC (`costs.placement.cp_group`).
"""

from __future__ import annotations

from simcluster.config.hardware import HardwareProfile
from simcluster.costs.compute import attention_time_s, elementwise_time_s
from simcluster.costs.network import GroupPlacement, p2p_time_s
from simcluster.workload.ops import RingAttention


def ring_step_times_s(ring: RingAttention, hw: HardwareProfile) -> tuple[float, ...]:
    """The attention seconds of each of the c steps (diagonal first)."""
    later = max(attention_time_s(ring.lower, hw), attention_time_s(ring.upper, hw))
    return (attention_time_s(ring.diagonal, hw),) + (later,) * (ring.cp_size - 1)


def ring_transfer_times_s(ring: RingAttention, hw: HardwareProfile, cp: GroupPlacement) -> tuple[float, ...]:
    """Seconds of the c − 1 transfers that run beside steps 0 … c − 2."""
    nvlink = not cp.crosses_nodes
    first = p2p_time_s(ring.first_message_bytes, nvlink, hw)
    rest = p2p_time_s(ring.message_bytes, nvlink, hw)
    return tuple(first if i == 0 else rest for i in range(ring.cp_size - 1))


def ring_merge_time_s(ring: RingAttention, hw: HardwareProfile) -> float:
    """Seconds of the element-wise kernels merging the steps' partial results
    (`RingAttention.first_merge_bytes`, `merge_bytes`). TE runs them on the compute stream
    after the ring (forward) or after each step once its dK/dV has arrived (backward), so
    they add to the ring's time rather than hide behind a transfer."""
    return elementwise_time_s(ring.first_merge_bytes, hw) + (ring.cp_size - 1) * elementwise_time_s(
        ring.merge_bytes, hw
    )


def ring_attention_cost_s(
    ring: RingAttention, hw: HardwareProfile, cp: GroupPlacement
) -> tuple[float, float]:
    """(attention and merge seconds, exposed transfer seconds) of one direction of the ring."""
    steps = ring_step_times_s(ring, hw)
    transfers = ring_transfer_times_s(ring, hw, cp)
    attention_s = sum(steps)
    overlapped_s = sum(max(step, send) for step, send in zip(steps, transfers)) + steps[-1]
    final_s = p2p_time_s(ring.final_message_bytes, not cp.crosses_nodes, hw)
    return attention_s + ring_merge_time_s(ring, hw), overlapped_s - attention_s + final_s
