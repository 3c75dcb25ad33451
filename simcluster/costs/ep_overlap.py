"""A MoE layer under Megatron-core's EP all-to-all overlap
(`training.overlap_moe_expert_parallel_comm`, `--overlap-moe-expert-parallel-comm`).

The combined 1F1B schedule (megatron/core/pipeline_parallel/combined_1f1b.py) runs one
microbatch's forward and another's backward together, layer by layer
(`TransformerLayerSchedulePlan.run` in megatron/core/models/common/model_chunk_schedule_plan.py,
Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553). Each layer is cut into four nodes:
`pre_dispatch_computation` (attention, router, permute), `moe_dispatch`, `mlp` (the experts)
and `moe_combine`, the two communication nodes on a communication stream. Per layer pair
(forward f, backward b) the streams run

    comm:    combine_bwd(b)     | dispatch_fwd(f) -> dispatch_bwd(b)   | combine_fwd(f)
    compute: pre_dispatch_fwd(f)| mlp_bwd(b) -> mlp_fwd(f)            | pre_dispatch_bwd(b)

so, with each phase as long as its longer stream, the pair costs

    T_pair = pre_b + max(K_b, A_f) + max(D_f, M_b) + max(D_b, M_f) + max(K_f, A_b) + post_f

where A is the pre-dispatch part, D the dispatch collectives, M the experts between them,
K the combine collectives; pre_b is the backward's work before its combine (the unpermute's
gradient) and post_f the forward's after its combine (the unpermute), kept serial. The pair
saves S = T_f + T_b − T_pair ≤ the two passes' dispatcher seconds, which `overlapped_cost`
takes off the layer's `ep_comm_s`, shared between its forward and backward in proportion to
each pass's own.

Approximations, declared: every forward and backward task of the layer is priced as if
paired, though the pipeline's warm-up and cool-down run single passes (their share is
about (pp − 1) / (microbatches · vpp) of a stage's tasks); the two streams share the SMs
without slowing each other; the recompute (which Megatron restricts here) is not paired.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simcluster.costs.chunk import ChunkCost, OpsCost, is_expert_collective
from simcluster.workload.layer import LayerOps
from simcluster.workload.ops import Op

PriceOps = Callable[[tuple[Op, ...]], OpsCost]


@dataclass(frozen=True, slots=True)
class PassPhases:
    """One pass of a MoE layer cut at its dispatcher collectives: the work before the first
    run of expert collectives, that run, the work between, the last run, the work after."""

    before: tuple[Op, ...]
    first_comm: tuple[Op, ...]
    between: tuple[Op, ...]
    last_comm: tuple[Op, ...]
    after: tuple[Op, ...]


def pass_phases(ops: tuple[Op, ...]) -> PassPhases | None:
    """`ops` cut at its first and last runs of expert collectives (None without two runs:
    a pass with no dispatcher, or one whose collectives are not split by expert work)."""
    where = [i for i, op in enumerate(ops) if is_expert_collective(op)]
    if not where:
        return None
    first_end = where[0]
    while first_end + 1 < len(ops) and is_expert_collective(ops[first_end + 1]):
        first_end += 1
    last_start = where[-1]
    while last_start - 1 > first_end and is_expert_collective(ops[last_start - 1]):
        last_start -= 1
    if last_start <= first_end:
        return None
    return PassPhases(
        before=ops[: where[0]],
        first_comm=ops[where[0] : first_end + 1],
        between=ops[first_end + 1 : last_start],
        last_comm=ops[last_start : where[-1] + 1],
        after=ops[where[-1] + 1 :],
    )


def paired_saving_s(layer: LayerOps, price: PriceOps) -> float:
    """S = T_f + T_b − T_pair (module docstring) for one layer, ≥ 0; 0 where a pass has no
    dispatch and combine."""
    forward, backward = pass_phases(layer.forward), pass_phases(layer.backward)
    if forward is None or backward is None:
        return 0.0

    def s(ops: tuple[Op, ...]) -> float:
        return price(ops).total_s if ops else 0.0

    a_f, d_f, m_f, k_f, post_f = (
        s(forward.before), s(forward.first_comm), s(forward.between), s(forward.last_comm), s(forward.after)
    )  # fmt: skip
    pre_b, k_b, m_b, d_b, a_b = (
        s(backward.before), s(backward.first_comm), s(backward.between), s(backward.last_comm),
        s(backward.after),
    )  # fmt: skip
    separate = a_f + d_f + m_f + k_f + post_f + pre_b + k_b + m_b + d_b + a_b
    paired = pre_b + max(k_b, a_f) + max(d_f, m_b) + max(d_b, m_f) + max(k_f, a_b) + post_f
    return max(0.0, separate - paired)


def overlapped_cost(cost: ChunkCost, saving_s: float) -> ChunkCost:
    """`cost` with `saving_s` taken off its dispatcher seconds, forward and backward in
    proportion to their own (never below zero: the saving cannot exceed them)."""
    ep_f, ep_b = cost.forward.ep_comm_s, cost.backward.ep_comm_s
    total = ep_f + ep_b
    if saving_s <= 0 or total <= 0:
        return cost
    hidden = min(saving_s, total)
    forward = OpsCost(cost.forward.compute_s, cost.forward.comm_s, ep_f - hidden * ep_f / total)
    backward = OpsCost(cost.backward.compute_s, cost.backward.comm_s, ep_b - hidden * ep_b / total)
    return ChunkCost(forward=forward, backward=backward, recompute=cost.recompute)
