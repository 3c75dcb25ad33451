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

The two streams share the SMs: while a dispatcher kernel runs it holds its CTAs' SMs (NCCL's
all-to-all one per p2p channel, DeepEP and Hybrid-EP the SMs Megatron gives them), so the
GEMMs and attention beside it run on the rest (`sm_shared_phase_s`, `comm_kernel_sms`;
`StagePricing` passes the hardware). Memory-bound kernels keep their pace.

Approximations, declared: the communication kernels run at their own pace beside the
compute (the HBM traffic the two share is not priced); the work of a phase is spread evenly
over it; the recompute (which Megatron restricts here) is not paired; a pair whose forward and backward
chunks hold different layers is priced as if both held the same (Megatron runs the extra
layers alone, `TransformerModelChunkSchedulePlan.run`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simcluster.config.hardware import HardwareProfile
from simcluster.config.moe_choices import FlexBackend
from simcluster.costs.chunk import ChunkCost, OpsCost, is_expert_collective
from simcluster.workload.layer import LayerOps
from simcluster.workload.ops import Module, Op, OpKind, Pass

PriceOps = Callable[[tuple[Op, ...]], OpsCost]


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


def paired_saving_s(
    layer: LayerOps, price: PriceOps, delay_wgrad: bool = False, hw: HardwareProfile | None = None
) -> float:
    """S = T_f + T_b − T_pair (module docstring) for one layer, ≥ 0; 0 where a pass has no
    dispatch and combine. With `delay_wgrad` the experts' weight gradients run after their
    input gradients, under the backward's dispatch (`delayed_mlp_phase_s`). With `hw` the
    compute stream's SM-bound kernels run on the SMs the communication kernels leave while
    both run (`sm_shared_phase_s`); without it, on all of them."""
    forward, backward = pass_phases(layer.forward), pass_phases(layer.backward)
    if forward is None or backward is None:
        return 0.0
    return _paired_saving_shared_sms_s(forward, backward, price, delay_wgrad, hw)


def delayed_mlp_phase_s(d_f: float, m_dgrad: float, m_wgrad: float, d_b: float, m_f: float) -> float:
    """The pair's middle under `--delay-wgrad-compute`: the compute stream runs the backward
    experts' input gradients, their weight gradients (`mlp.backward_dw`), then the forward
    experts (once the forward's dispatch has arrived); the communication stream runs the
    forward's dispatch, then the backward's, which needs only the input gradients
    (`TransformerLayerSchedulePlan.run`, model_chunk_schedule_plan.py; `backward_dw` in
    megatron/core/models/common/utils.py, Megatron-LM @d98e8a64). Both streams from the
    phase's start, the phase ends when both have:

        max(max(M_dgrad + M_wgrad, D_f) + M_f, max(D_f, M_dgrad) + D_b)

    Without the delay the backward's dispatch waits for the weight gradients too, which
    gives max(D_f, M_b) + max(D_b, M_f) (M_b = M_dgrad + M_wgrad); never shorter."""
    compute = max(m_dgrad + m_wgrad, d_f) + m_f
    comm = max(d_f, m_dgrad) + d_b
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


# SMs a communication kernel holds for as long as it runs (one CTA per channel or per SM it
# is given, resident until the transfer ends), taken from the compute stream beside it:
NCCL_P2P_CHANNELS = 32
"""NCCL's all-to-all (grouped ncclSend / ncclRecv) runs one CTA per p2p channel:
p2pnChannels = pow2Up(min(nChannels, NCCL_MAX_P2P_NCHANNELS)) (src/graph/paths.cc
`ncclTopoComputeP2pChannels`, NVIDIA/nccl @04cdb808), the peers of a round spread over all of
them; 32 on 8-GPU nodes with 8 NICs ("32 p2p channels" in NCCL's init log, NVIDIA/nccl#1235).
RCCL caps the same count on multi-node MI350 "so there are more CUs available for computation
for the E2E workload" (ROCm/rocm-systems#2977)."""
DEEPEP_SMS = 20
"""The SMs DeepEP's normal dispatch / combine kernels are given: DeepEP's own default,
`Buffer.num_sms = 20` (deepseek-ai/DeepEP @b306af06 deep_ep/buffers/legacy.py), which
Megatron-core keeps unless `moe_flex_dispatcher_num_sms` (the deprecated
`--moe-deepep-num-sms`, "historical default 20") is set (transformer_config.py @d98e8a64).
DeepEP's published tables ran at 24 (tests/legacy/test_intranode.py `for i in (24, )`)."""
HYBRIDEP_SMS = 32
"""Megatron-Bridge's performance scripts set `moe_hybridep_num_sms = 32` for every hybridep recipe
(NVIDIA-NeMo/Megatron-Bridge @0fbfe7d3, scripts/performance/utils/overrides.py; costs.hybridep)."""

SM_BOUND_KINDS = frozenset({OpKind.GEMM, OpKind.ATTENTION})
"""Kernels whose time scales with the SMs they get (tensor-core GEMMs, flash attention); the
memory-bound kernels keep their time on fewer SMs (HBM, not SMs, sets their pace), declared."""


def comm_kernel_sms(ops: tuple[Op, ...]) -> int:
    """The SMs `ops` (one run of dispatcher collectives on the communication stream) hold:
    the most any of them holds, as they run one after another. NCCL collectives (the
    alltoall and allgather dispatchers): `NCCL_P2P_CHANNELS`; DeepEP: `DEEPEP_SMS`; Hybrid-EP:
    `HYBRIDEP_SMS`."""
    sms = 0
    for op in ops:
        if op.deepep is not None:
            held = HYBRIDEP_SMS if op.deepep.backend is FlexBackend.HYBRIDEP else DEEPEP_SMS
        elif op.kind is OpKind.COLLECTIVE:
            held = NCCL_P2P_CHANNELS
        else:
            continue
        sms = max(sms, held)
    return sms


def sm_shared_phase_s(comm_s: float, bound_s: float, other_s: float, sm_fraction: float) -> float:
    """One phase of the pair: a communication kernel of `comm_s` beside compute of
    `bound_s` SM-bound seconds and `other_s` memory-bound seconds (each on all the SMs).
    While the communication runs the SM-bound work runs on `sm_fraction` of the SMs, so the
    compute stream takes W' = bound_s / sm_fraction + other_s; past the communication's end
    the rest runs at full speed:

        t = comm_s                                  if W' <= comm_s
        t = comm_s + (1 − comm_s / W') · W          otherwise (W = bound_s + other_s)

    (the work spread evenly over the phase). sm_fraction = 1 gives max(comm_s, W)."""
    if not 0.0 < sm_fraction <= 1.0:
        raise ValueError(f"sm_fraction must be in (0, 1], got {sm_fraction}")
    slowed = bound_s / sm_fraction + other_s
    if slowed <= comm_s:
        return comm_s
    work = bound_s + other_s
    return work + comm_s * (1.0 - work / slowed)  # = comm_s + (1 − comm_s / W') · W, exact at 1


def _paired_saving_shared_sms_s(
    forward: PassPhases, backward: PassPhases, price: PriceOps, delay_wgrad: bool, hw: HardwareProfile | None
) -> float:
    """`paired_saving_s` with each overlapped phase priced by `sm_shared_phase_s`, the SMs
    taken by that phase's communication kernels (`comm_kernel_sms`) out of the GPU's (none
    taken without `hw`: every phase is then max(communication, compute))."""

    def s(ops: tuple[Op, ...]) -> float:
        return price(ops).total_s if ops else 0.0

    def split(ops: tuple[Op, ...]) -> tuple[float, float]:
        """(SM-bound seconds, the rest) of a compute phase."""
        bound = s(tuple(op for op in ops if op.kind in SM_BOUND_KINDS))
        return bound, max(0.0, s(ops) - bound)

    def fraction(comm: tuple[Op, ...]) -> float:
        if hw is None:
            return 1.0
        sms = hw.gpu.num_sms
        taken = comm_kernel_sms(comm)
        if taken >= sms:
            raise ValueError(f"hardware {hw.name!r}: {taken} communication SMs leave no SM of {sms}")
        return (sms - taken) / sms

    def phase(comm: tuple[Op, ...], compute: tuple[Op, ...]) -> float:
        bound, other = split(compute)
        return sm_shared_phase_s(s(comm), bound, other, fraction(comm))

    separate = sum(
        s(part)
        for phases in (forward, backward)
        for part in (phases.before, phases.first_comm, phases.between, phases.last_comm, phases.after)
    )
    d_f, d_b = s(forward.first_comm), s(backward.last_comm)
    if delay_wgrad:
        # The middle chains four kernels on two streams (`delayed_mlp_phase_s`): priced with
        # every compute kernel slowed, capped by the plain chain plus what the compute loses
        # while the two dispatches run (what `sm_shared_phase_s` adds when compute leads).
        dgrad = tuple(op for op in backward.between if op.pass_ is not Pass.WEIGHT_GRAD)
        wgrad = tuple(op for op in backward.between if op.pass_ is Pass.WEIGHT_GRAD)
        r = min(fraction(forward.first_comm), fraction(backward.last_comm))
        parts = [split(dgrad), split(wgrad), split(forward.between)]
        plain = [b + o for b, o in parts]
        slowed = [b / r + o for b, o in parts]
        middle_plain = delayed_mlp_phase_s(d_f, plain[0], plain[1], d_b, plain[2])
        middle_slowed = delayed_mlp_phase_s(d_f, slowed[0], slowed[1], d_b, slowed[2])
        lost = (d_f + d_b) * (1.0 - sum(plain) / sum(slowed)) if sum(slowed) > 0 else 0.0
        middle = min(middle_slowed, middle_plain + lost)
    else:
        middle = phase(forward.first_comm, backward.between) + phase(backward.last_comm, forward.between)
    paired = (
        s(backward.before)
        + phase(backward.first_comm, forward.before)
        + middle
        + phase(forward.last_comm, backward.after)
        + s(forward.after)
    )
    return max(0.0, separate - paired)
