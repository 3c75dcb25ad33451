"""Message sizes of the flex dispatcher (DeepEP), under uniform random routing.

Megatron-core's `MoEFlexTokenDispatcher` with `--moe-enable-deepep`
(megatron/core/transformer/moe/token_dispatcher.py `_DeepepManager`, fused_a2a.py
`fused_dispatch` / `fused_combine`; Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553)
hands DeepEP each token once with its top-k expert indices (int64, from `torch.topk`) and
fp32 probabilities, over the etp·ep group. DeepEP (github.com/deepseek-ai/DeepEP, README,
"normal kernels") sends a token to each destination rank once however many of its experts
that rank holds, and across nodes once per destination node (RDMA to the peer with the same
local index, then NVLink inside the node); combine returns one partial sum per copy.

So the bytes follow the number of distinct destinations of a token, not k. With k of E
experts drawn uniformly without replacement and m destinations holding E/m experts each,
a destination is missed with probability C(E - E/m, k) / C(E, k), and a token reaches

    D(m) = m · (1 - C(E - E/m, k) / C(E, k))

destinations (k when every expert is its own destination, 1 when one destination holds
all); exact for top-k of i.i.d. scores. Group-limited routing (`--moe-router-num-groups`
G, `--moe-router-group-topk` gk; moe_utils.py `group_limited_topk`) picks the gk groups
with the best top-(k/gk) scores, so each picked group holds about k/gk of the token's
experts (its best ones, which won it the pick), not a hypergeometric share. We take exactly
k/gk per picked group: with a group over r = m/G destinations a token reaches
gk·r·(1 - C(E/G - E/m, k/gk)/C(E/G, k/gk)); with a destination over G/m groups it is
reached when one of them is picked, D = m·(1 - C(G - G/m, gk)/C(G, gk)). Against a
simulation of Megatron's routing on i.i.d. logits (tests/workload/test_moe_flex.py:
E = 256, k = 8, 8 groups, 4 picked) this is within 1 % at m = 4 and 8, 2 % at m = 64 and
6 % high at m = 16; the plain hypergeometric share would be 8 % low at m = 8. Load imbalance is not in
these expectations.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb

from simcluster.config.moe_choices import FlexBackend
from simcluster.workload.moe import RoutedRows
from simcluster.workload.moe_config import ExpertLayout, MoEConfig
from simcluster.workload.ops import DeepEPMessage

INDEX_BYTES = 8  # int64 top-k indices
PROB_BYTES = 4  # DeepEP takes fp32 probabilities (Megatron casts them)


def _missed(pool: int, held: int, k: int) -> float:
    """Probability that k experts drawn from `pool` miss all `held` of them."""
    return comb(pool - held, k) / comb(pool, k)


def expected_destinations(moe: MoEConfig, num_destinations: int) -> float:
    """D: distinct destinations (ranks or nodes) a token's k experts fall on, expected, with
    experts laid out in `num_destinations` equal consecutive blocks (module docstring)."""
    E, k, m = moe.num_experts, moe.router_topk, num_destinations
    if E % m:
        raise ValueError(f"num_experts={E} must divide evenly over {m} destinations")
    groups, group_topk = moe.router_num_groups, moe.router_group_topk
    if not groups or not group_topk:
        return m * (1.0 - _missed(E, E // m, k))
    if m % groups == 0:  # a group spans m/groups destinations and holds k/gk of the experts
        per_group = E // groups
        return group_topk * (m // groups) * (1.0 - _missed(per_group, E // m, k // group_topk))
    if groups % m == 0:  # a destination holds groups/m groups: reached if one is picked
        return m * (1.0 - _missed(groups, groups // m, group_topk))
    raise ValueError(f"router_num_groups={groups} and {m} destinations must divide one another")


@dataclass(frozen=True, slots=True)
class FlexMessages:
    """Per rank and microbatch, forward (DeepEP dispatch + combine); backward mirrors them.
    `dispatch_bytes` / `combine_bytes` leave a rank for all destinations (its own included);
    `internode_*` is the part that crosses nodes (once per destination node)."""

    destinations_per_token: float
    nodes_per_token: float
    dispatch_bytes: float
    combine_bytes: float
    internode_dispatch_bytes: float
    internode_combine_bytes: float


def flex_messages(
    rows: RoutedRows,
    hidden_size: int,
    moe: MoEConfig,
    layout: ExpertLayout,
    gpus_per_node: int,
    element_bytes: int = 2,
) -> FlexMessages:
    """Each of the rank's T tokens goes to D(ep) ranks with its hidden state and its k
    indices and probabilities, and comes back once per copy; across nodes once per
    destination node, D(ep/gpus_per_node) of them, less the rank's own node's share."""
    if layout.expert_tp != 1:
        raise ValueError(f"parallel.etp={layout.expert_tp}: the flex (DeepEP) model covers etp = 1 only")
    ep = layout.ep
    ranks = expected_destinations(moe, ep)
    nodes_in_group = max(ep // gpus_per_node, 1)
    nodes = expected_destinations(moe, nodes_in_group) if nodes_in_group > 1 else 1.0
    token = hidden_size * element_bytes + moe.router_topk * (INDEX_BYTES + PROB_BYTES)
    back = hidden_size * element_bytes
    remote_nodes = nodes * (1.0 - 1.0 / nodes_in_group) if nodes_in_group > 1 else 0.0
    t = rows.tokens
    return FlexMessages(
        ranks, nodes, t * ranks * token, t * ranks * back, t * remote_nodes * token, t * remote_nodes * back
    )


def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(2, n + 1) if n % d == 0)


def deepep_messages(
    rows: RoutedRows, hidden_size: int, moe: MoEConfig, layout: ExpertLayout, element_bytes: int = 2
) -> tuple[DeepEPMessage, DeepEPMessage]:
    """(dispatch, combine) of the flex dispatcher on the busiest expert rank, for every
    number of NVLink domains the EP group could span (the costs pick the hardware's): the
    rank's T tokens, D(ep) copies each (`flex_messages`), scaled by `load_imbalance`: the
    busiest expert rank receives li × the mean rank's copies, and DeepEP's kernels finish
    when it has them (the alltoall dispatcher's busiest-rank convention, `moe.routed_rows`).
    Dispatch sends h·e + k·(8 + 4) bytes a copy (BF16 tokens: Megatron hands DeepEP the
    hidden states as they are, fused_a2a.py `FusedDispatch`; int64 indices and fp32
    probabilities), combine h·e. Domain counts that do not divide the experts are left to
    `DeepEPMessage.bytes_across`'s fallback."""
    ep, li = layout.ep, moe.load_imbalance
    dispatch, combine = [], []
    for domains in _divisors(ep):
        if moe.num_experts % domains:
            continue
        try:
            flex = flex_messages(rows, hidden_size, moe, layout, ep // domains, element_bytes)
        except ValueError:  # group-limited routing whose groups and domains do not nest
            continue
        dispatch.append((domains, li * flex.internode_dispatch_bytes))
        combine.append((domains, li * flex.internode_combine_bytes))
    whole = flex_messages(rows, hidden_size, moe, layout, ep, element_bytes)
    return (
        DeepEPMessage(ep, li * whole.dispatch_bytes, tuple(dispatch)),
        DeepEPMessage(ep, li * whole.combine_bytes, tuple(combine)),
    )


@dataclass(frozen=True, slots=True)
class FlexPermute:
    """HBM bytes of the flex dispatcher's permute and unpermute on the busiest rank, and
    what the permute keeps for backward (unfused path)."""

    received_tokens: float
    permute: float
    unpermute: float
    saved: float


def flex_permute(
    rows: RoutedRows, hidden_size: int, moe: MoEConfig, layout: ExpertLayout, element_bytes: int = 2
) -> FlexPermute:
    """Megatron's `MoEFlexTokenDispatcher.dispatch_postprocess` permutes the N tokens
    DeepEP delivered (N = li·T·D(ep) at the busiest rank: each copy once) into the Re rows
    of its local experts with `moe_utils.permute` over the [N, E/ep] routing map rebuilt
    from the received indices; `combine_preprocess` unpermutes them back to N rows. Bytes
    read once and written once: permute N·h·e + Re·(h·e + 4) (rows and fp32 probs out),
    unpermute (Re + N)·h·e. Saved (the argsort path, `moe_memory.permute_saved_bytes`'s
    reading of `permute`): the int64 argsort of the [E/ep, N] map, (N·E/ep + Re)·8."""
    h, e = hidden_size, element_bytes
    received = moe.load_imbalance * rows.tokens * expected_destinations(moe, layout.ep)
    re = rows.busiest_expert
    local = moe.num_experts // layout.ep
    return FlexPermute(
        received_tokens=received,
        permute=received * h * e + re * (h * e + PROB_BYTES),
        unpermute=(re + received) * h * e,
        saved=(received * local + re) * INDEX_BYTES,
    )


@dataclass(frozen=True, slots=True)
class HybridEPMessages:
    """The four Hybrid-EP kernels of a MoE layer on the busiest rank, each a `DeepEPMessage`
    with `backend` hybridep (`hybridep_messages`)."""

    dispatch: DeepEPMessage  # forward: routing-map scan, staging copy, dispatch
    combine: DeepEPMessage  # forward combine
    combine_backward: DeepEPMessage  # combine's backward: a dispatch of the gradients (cached handle)
    dispatch_backward: DeepEPMessage  # dispatch's backward: a combine of the gradients and probs'


def hybridep_handle_bytes(rows: RoutedRows, moe: MoEConfig, layout: ExpertLayout) -> float:
    """What Hybrid-EP's metadata scan writes into the dispatch handle, which Megatron keeps
    for the backward (`HybridEPDispatch.forward`: `ctx.handle`): `sparse_to_dense_map` int32
    [T·ep] over the group, `local_expert_routing_map` bool and `dense_to_expert_map` int32
    [T·ep, E/ep] (DeepEP hybrid-ep @94a9f8f6b146c07d97ec58f67cd6d303296d6098,
    csrc/hybrid_ep/executor/executor.cu `metadata_preprocess_core`; the per-domain bool maps,
    T bytes per domain, are left out): T·ep·4 + T·E·(1 + 4)."""
    t = moe.load_imbalance * rows.tokens
    return t * layout.ep * HANDLE_INDEX_BYTES + t * moe.num_experts * (1 + HANDLE_INDEX_BYTES)


HANDLE_INDEX_BYTES = 4  # Hybrid-EP's maps are int32


def hybridep_messages(
    rows: RoutedRows, hidden_size: int, moe: MoEConfig, layout: ExpertLayout, element_bytes: int = 2
) -> HybridEPMessages:
    """Hybrid-EP's dispatch and combine (Megatron's `_HybridEPManager`, fused_a2a.py
    `HybridEPDispatch` / `HybridEPCombine`, Megatron-LM @d98e8a64; DeepEP hybrid-ep
    @94a9f8f6b146c07d97ec58f67cd6d303296d6098) on the busiest rank. Like DeepEP it sends a
    token once to each destination rank (inside an NVLink domain) and once to each
    destination domain (RDMA, then NVLink), D(m) destinations (`expected_destinations`);
    unlike it, each copy carries the token with the fp32 probabilities of the destination's
    E/ep experts (Megatron hands it the [T, E] routing map and probs, not top-k indices):
    h·e + 4·E/ep bytes a dispatched copy, h·e a combined one. The forward dispatch also scans
    the all-gathered routing map, [T·ep, E] bools, into the handle
    (`hybridep_handle_bytes`), and across domains first copies the rank's T tokens into its
    RDMA buffer (executor.cu `dispatch_preprocess`: read and write, 2·T·h·e). Combine's
    backward is a dispatch with the cached handle (no scan), dispatch's a combine carrying the
    probs' gradients. `load_imbalance` scales every byte, as in `deepep_messages`."""
    ep, li, h, e = layout.ep, moe.load_imbalance, hidden_size, element_bytes
    if layout.expert_tp != 1:
        raise ValueError(f"parallel.etp={layout.expert_tp}: the flex (Hybrid-EP) model covers etp = 1 only")
    t = li * rows.tokens
    with_probs = h * e + PROB_BYTES * moe.num_experts / ep
    plain = h * e

    def across(per_copy: float) -> tuple[tuple[int, float], ...]:
        out = []
        for domains in _divisors(ep):
            if moe.num_experts % domains:
                continue
            try:
                reached = expected_destinations(moe, domains)
            except ValueError:  # group-limited routing whose groups and domains do not nest
                continue
            out.append((domains, t * reached * (1.0 - 1.0 / domains) * per_copy))
        return tuple(out)

    copies = t * expected_destinations(moe, ep)
    scan = t * ep * moe.num_experts + hybridep_handle_bytes(rows, moe, layout)
    staging = 2.0 * t * h * e
    HEP = FlexBackend.HYBRIDEP
    return HybridEPMessages(
        dispatch=DeepEPMessage(ep, copies * with_probs, across(with_probs), HEP, scan, staging),
        combine=DeepEPMessage(ep, copies * plain, across(plain), HEP),
        combine_backward=DeepEPMessage(ep, copies * plain, across(plain), HEP, 0.0, staging),
        dispatch_backward=DeepEPMessage(ep, copies * with_probs, across(with_probs), HEP),
    )
