"""Which ranks form each parallel group of a MoE model under Megatron-core's parallel
folding, and how many NVLink domains (or nodes) each group spans.

megatron/core/parallel_state.py (Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553)
builds two `RankGenerator`s over the same world, default order "tp-cp-ep-dp-pp": the
attention grid tp-cp-dp-pp (ep = 1) and the expert grid tp-ep-dp-pp with tp = etp, cp = 1
and dp = edp (the expert order drops cp). The first-named dimension varies fastest, so a
group of a dimension is `size` ranks `stride` apart, the stride the product of the sizes
named before it:

    tp    tp ranks, stride 1              etp   etp ranks, stride 1
    cp    cp ranks, stride tp             ep    ep ranks, stride etp
    dp    dp ranks, stride tp·cp          edp   edp ranks, stride etp·ep
    dp_cp dp·cp ranks, stride tp (dense gradients)
                                          etp_ep (allgather dispatcher) etp·ep consecutive

With pp last, a pipeline stage is the block of tp·cp·dp consecutive ranks starting at
stage·tp·cp·dp. A domain is a block of `domain_size` consecutive ranks (a node's GPUs, or
an NVLink domain such as GB200 NVL72's 72).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from simcluster.workload.moe_config import ExpertLayout


@dataclass(frozen=True, slots=True)
class GroupSpan:
    """One kind of group: its size and stride, and over the groups of one stage the fewest
    and most domains a group touches and the largest share of a rank's peers outside its
    own domain (what an all-to-all sends over the slower fabric)."""

    name: str
    size: int
    stride: int
    min_domains: int
    max_domains: int
    max_remote_peer_fraction: float

    @property
    def crosses_domain(self) -> bool:
        return self.max_domains > 1


def _strided_groups(size: int, stride: int, block: int, offset: int) -> list[list[int]]:
    """All groups of `size` ranks `stride` apart tiling `block` ranks from `offset`."""
    groups = []
    for start in range(offset, offset + block):
        local = start - offset
        if (local // stride) % size == 0:  # the first member of its group
            groups.append([start + i * stride for i in range(size)])
    return groups


def _span(name: str, size: int, stride: int, block: int, offset: int, domain_size: int) -> GroupSpan:
    domains, remote = [], 0.0
    for group in _strided_groups(size, stride, block, offset):
        members = Counter(rank // domain_size for rank in group)
        domains.append(len(members))
        if size > 1:  # a rank's peers outside its domain, at the rank whose domain holds fewest
            remote = max(remote, (size - min(members.values())) / (size - 1))
    return GroupSpan(name, size, stride, min(domains), max(domains), remote)


def group_spans(layout: ExpertLayout, domain_size: int, stage: int = 0) -> tuple[GroupSpan, ...]:
    """The table of the module docstring for pipeline stage `stage`, each group checked rank
    by rank (a stage of tp·cp·dp ranks has at most a few thousand)."""
    if domain_size < 1:
        raise ValueError(f"domain_size={domain_size} is not allowed: it must be >= 1 GPUs")
    tp, cp, dp, ep, etp = layout.tp, layout.cp, layout.dp, layout.ep, layout.expert_tp
    block, offset = layout.attention_ranks, stage * layout.attention_ranks
    rows = (
        ("tp", tp, 1),
        ("cp", cp, tp),
        ("dp", dp, tp * cp),
        ("dp_cp", dp * cp, tp),
        ("etp", etp, 1),
        ("ep", ep, etp),
        ("edp", layout.expert_dp, etp * ep),
        ("etp_ep", etp * ep, 1),
    )
    return tuple(_span(name, size, stride, block, offset, domain_size) for name, size, stride in rows)
