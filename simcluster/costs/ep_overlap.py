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

Only the pipeline's steady state pairs a forward with a backward: the warm-up forwards and
the cooldown backwards run alone, at the price without the saving (`StagePricing` prices
both, `schedule.unpaired_positions` says which tasks run alone), and the combined schedule
runs one more warm-up forward (`schedule.ep_overlap_extra_warmup`).

`--delay-wgrad-compute` (`training.delay_wgrad_compute`) splits the experts' weight
gradients from their input gradients, so the backward's dispatch starts after the input
gradients alone (`delayed_mlp_phase_s`). The attention's (and shared experts') weight
gradients it also delays run on the compute stream at the layer's end, where they were:
the same time per layer (only the chunk's last one moves under the pipeline send, not
priced).

The flex dispatcher's kernels hold SMs while they run: DeepEP's and Hybrid-EP's dispatch and
combine are launched on a fixed number of SMs (Megatron-core `moe_deepep_num_sms` = 20, the
TransformerConfig default; `moe_hybridep_num_sms` = 32, what Megatron-Bridge's performance
scripts set for every hybridep recipe, scripts/performance/utils/overrides.py @0fbfe7d3, and
what `costs.hybridep`'s bandwidth table was measured at). Under the overlap the compute stream
runs on the rest, so a phase whose communication D (of which `stolen_s` = D_kernel · sms / SMs
in SM-seconds) overlaps compute M lasts

    max(D, M + stolen_s)

(the compute runs at (SMs − sms) / SMs while the kernel holds its SMs, at full rate after;
`overlap_phase_s`). NCCL's collectives (the alltoall dispatcher, the routing map's all-gather)
also run on SMs, as many as NCCL's channels: not priced (no figure for Megatron's streams).

Approximations, declared: the compute stream and NCCL's collectives share the SMs without
slowing each other; the
recompute (which Megatron restricts here) is not paired; a pair whose forward and backward
chunks hold different layers is priced as if both held the same (Megatron runs the extra
layers alone, `TransformerModelChunkSchedulePlan.run`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simcluster.config.moe_choices import FlexBackend
from simcluster.costs.chunk import ChunkCost, OpsCost, is_expert_collective
from simcluster.workload.layer import LayerOps
from simcluster.workload.ops import Module, Op, Pass

PriceOps = Callable[[tuple[Op, ...]], OpsCost]

DISPATCHER_NUM_SMS = {FlexBackend.DEEPEP: 20, FlexBackend.HYBRIDEP: 32}
"""SMs a flex dispatcher kernel holds (module docstring): Megatron-core's `moe_deepep_num_sms`
default, Megatron-Bridge's `moe_hybridep_num_sms` override."""


@dataclass(frozen=True, slots=True)
class PassPhases:
    """One pass of a MoE layer cut at its dispatcher collectives: the work before the
    dispatch (forward; the combine's gradient in the backward), that run of collectives,
    the work between (the experts), the other run, the work after."""

    before: tuple[Op, ...]
    first_comm: tuple[Op, ...]
    between: tuple[Op, ...]
    last_comm: tuple[Op, ...]
    after: tuple[Op, ...]


EXPERT_MODULES = frozenset({Module.EXPERT_FC1, Module.EXPERT_FC2})


def pass_phases(ops: tuple[Op, ...]) -> PassPhases | None:
    """`ops` cut at the runs of expert collectives next to the experts: the last run before
    the first expert GEMM and the first run after the last (the first and last runs where
    the pass has no expert GEMM). Megatron-core's `moe_dispatch` node is the token
    all-to-all alone: the tokens-per-expert exchange and the permute run in
    `pre_dispatch_computation` (`layer.mlp.preprocess`), the sort by expert in `mlp`
    (megatron/core/models/gpt/fine_grained_callables.py @d98e8a64). None without such two
    runs: a pass with no dispatcher, or one whose collectives are not split by expert work."""
    runs: list[tuple[int, int]] = []  # [start, end) of each maximal run of expert collectives
    for i, op in enumerate(ops):
        if not is_expert_collective(op):
            continue
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    experts = [i for i, op in enumerate(ops) if op.module in EXPERT_MODULES]
    if experts:
        before = [run for run in runs if run[1] <= experts[0]]
        after = [run for run in runs if run[0] > experts[-1]]
        if not before or not after:
            return None
        first, last = before[-1], after[0]
    elif len(runs) >= 2:
        first, last = runs[0], runs[-1]
    else:
        return None
    return PassPhases(
        before=ops[: first[0]],
        first_comm=ops[first[0] : first[1]],
        between=ops[first[1] : last[0]],
        last_comm=ops[last[0] : last[1]],
        after=ops[last[1] :],
    )


def stolen_sm_s(ops: tuple[Op, ...], price: PriceOps, num_sms: int | None) -> float:
    """SM-seconds the flex dispatcher kernels among `ops` take from the compute stream:
    each kernel's time × its SMs (`DISPATCHER_NUM_SMS`) / the GPU's `num_sms`; 0 without
    `num_sms` or such kernels."""
    if num_sms is None:
        return 0.0
    return sum(
        price((op,)).total_s * min(1.0, DISPATCHER_NUM_SMS[op.deepep.backend] / num_sms)
        for op in ops
        if op.deepep is not None
    )


def overlap_phase_s(comm_s: float, compute_s: float, stolen_s: float = 0.0) -> float:
    """A phase whose communication (`comm_s`, holding `stolen_s` SM-seconds) runs beside
    `compute_s` of full-GPU work: max(D, M + stolen) (module docstring)."""
    return max(comm_s, compute_s + stolen_s)


def paired_saving_s(
    layer: LayerOps, price: PriceOps, delay_wgrad: bool = False, num_sms: int | None = None
) -> float:
    """S = T_f + T_b − T_pair (module docstring) for one layer, ≥ 0; 0 where a pass has no
    dispatch and combine. With `delay_wgrad` the experts' weight gradients run after their
    input gradients, under the backward's dispatch (`delayed_mlp_phase_s`). With `num_sms`
    (the GPU's) the flex dispatcher's kernels slow the compute they overlap (`stolen_sm_s`)."""
    forward, backward = pass_phases(layer.forward), pass_phases(layer.backward)
    if forward is None or backward is None:
        return 0.0

    def s(ops: tuple[Op, ...]) -> float:
        return price(ops).total_s if ops else 0.0

    def st(ops: tuple[Op, ...]) -> float:
        return stolen_sm_s(ops, price, num_sms)

    a_f, d_f, m_f, k_f, post_f = (
        s(forward.before), s(forward.first_comm), s(forward.between), s(forward.last_comm), s(forward.after)
    )  # fmt: skip
    pre_b, k_b, m_b, d_b, a_b = (
        s(backward.before), s(backward.first_comm), s(backward.between), s(backward.last_comm),
        s(backward.after),
    )  # fmt: skip
    separate = a_f + d_f + m_f + k_f + post_f + pre_b + k_b + m_b + d_b + a_b
    st_d_f, st_d_b = st(forward.first_comm), st(backward.last_comm)
    if delay_wgrad:
        dgrad = tuple(op for op in backward.between if op.pass_ is not Pass.WEIGHT_GRAD)
        wgrad = tuple(op for op in backward.between if op.pass_ is Pass.WEIGHT_GRAD)
        middle = delayed_mlp_phase_s(d_f, s(dgrad), s(wgrad), d_b, m_f, st_d_f, st_d_b)
    else:
        middle = overlap_phase_s(d_f, m_b, st_d_f) + overlap_phase_s(d_b, m_f, st_d_b)
    paired = (
        pre_b + overlap_phase_s(k_b, a_f, st(backward.first_comm)) + middle
        + overlap_phase_s(k_f, a_b, st(forward.last_comm)) + post_f
    )  # fmt: skip
    return max(0.0, separate - paired)


def delayed_mlp_phase_s(
    d_f: float, m_dgrad: float, m_wgrad: float, d_b: float, m_f: float,
    stolen_f_s: float = 0.0, stolen_b_s: float = 0.0,
) -> float:  # fmt: skip
    """The pair's middle under `--delay-wgrad-compute`: the compute stream runs the backward
    experts' input gradients, their weight gradients (`mlp.backward_dw`), then the forward
    experts (once the forward's dispatch has arrived); the communication stream runs the
    forward's dispatch, then the backward's, which needs only the input gradients
    (`TransformerLayerSchedulePlan.run`, model_chunk_schedule_plan.py; `backward_dw` in
    megatron/core/models/common/utils.py, Megatron-LM @d98e8a64). Both streams from the
    phase's start, the phase ends when both have:

        max(max(M_dgrad + M_wgrad, D_f) + M_f, max(D_f, M_dgrad) + D_b)

    Without the delay the backward's dispatch waits for the weight gradients too, which
    gives max(D_f, M_b) + max(D_b, M_f) (M_b = M_dgrad + M_wgrad); never shorter. The SM-seconds
    the two dispatches' kernels hold (`stolen_f_s`, `stolen_b_s`, `stolen_sm_s`) lengthen the
    compute they overlap: the backward experts under D_f, whatever the compute stream runs
    under D_b (weight gradients or forward experts)."""
    compute = max(m_dgrad + m_wgrad + stolen_f_s, d_f) + m_f + stolen_b_s
    comm = max(d_f, m_dgrad + stolen_f_s) + d_b
    return max(compute, comm)


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
