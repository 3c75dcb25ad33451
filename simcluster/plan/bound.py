"""A lower bound on a layout's simulated iteration time, computed without the engine.

The engine (`simcluster.engine.simulator`) runs each stage's tasks one after another, and
a stage blocks after each task until the messages it sent are delivered (Megatron's p2p is
synchronous). So, whatever the task order, on stage r (p stages, v chunks, m microbatches):

  busy_r     = m · Σ_c (forward_s[c] + backward_s[c])         every task, back to back;
  blocked_r  = one transfer per position that sends            ≥ its link time each; with the
               (interleaved 1F1B pairs two sends on one        interleaved pairing at most two
               position, so at least ⌈sends / 2⌉ positions)    sends share a position;
  fill S_r   = Σ_{j<r} (forward_s_j[0] + send_forward_s_j)     its first task, F(0, chunk 0),
                                                               needs that microbatch's forward
                                                               on every earlier stage;
  drain      = Σ_{j<r} backward_s_j[0] (+ sends)               its last task, B(x, chunk 0), is
                                                               followed by B(x, chunk 0) on
                                                               every earlier stage.

L_r = S_r + busy_r + blocked_r bounds when stage r's pipeline work ends, L_r + drain when
stage 0's does; then each stage's (non-overlapped) DP gradient reduction, the tied
embedding all-reduce and the slowest optimizer step follow, as in the engine. Every term
is a duration the engine really spends in sequence: the bound credits no bubble beyond the
fill and drain of one microbatch, no link contention and no waiting, so it never exceeds the
simulated time (a hypothesis test checks bound ≤ simulated on random small layouts). All
three schedules start every stage with F(0, chunk 0) and end it with B(x, chunk 0) of one
microbatch x (1F1B and interleaved: x = m − 1; GPipe: x = 0).

`stage_seconds` prices a layout from its workload with `costs.stage_pricing.StagePricing`
(one per search: its caches serve every layout), the pricing `build_plan` uses;
`stage_seconds_from_plan` reads the same numbers from an engine plan (a test checks they
agree).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simcluster.config.choices import ScheduleKind
from simcluster.config.hardware import HardwareProfile
from simcluster.config.scenario import Scenario
from simcluster.costs.stage_pricing import PricedGather, PricedStage, PricedTransfer, StagePricing
from simcluster.engine.plan import ParamGather, PipelinePlan, Transfer
from simcluster.workload.model import Workload


@dataclass(frozen=True, slots=True)
class StageSeconds:
    """One stage's durations as the engine spends them (seconds; per microbatch for tasks)."""

    forward_s: tuple[float, ...]  # per chunk
    backward_s: tuple[float, ...]  # per chunk, recompute included
    send_forward_s: float  # 0 without a pipeline
    send_backward_s: float
    grad_reduce_s: float  # DP reduction (0 when dp = 1)
    tied_reduce_s: float  # first <-> last stage embedding all-reduce (0 elsewhere)
    optimizer_s: float
    param_gather_s: float = 0.0  # distributed optimizer's all-gather after the step (not overlapped)


@dataclass(frozen=True, slots=True)
class BoundInputs:
    """A layout's stages and what the bound needs to know of its schedule."""

    stages: tuple[StageSeconds, ...]
    num_microbatches: int
    paired_sends: bool  # interleaved 1F1B: a forward's send waits for the next backward's
    overlap_grad_reduce: bool


def _seconds(transfer: Transfer | PricedTransfer | None) -> float:
    return 0.0 if transfer is None else transfer.seconds


def stage_seconds_from_plan(plan: PipelinePlan) -> tuple[StageSeconds, ...]:
    """The durations of an engine plan (the reference `stage_seconds` must agree with)."""
    return tuple(
        StageSeconds(
            forward_s=tuple(work.busy_s for work in stage.forward),
            backward_s=tuple(work.busy_s for work in stage.backward),
            send_forward_s=_seconds(stage.send_forward),
            send_backward_s=_seconds(stage.send_backward),
            grad_reduce_s=_seconds(stage.grad_reduce),
            tied_reduce_s=_seconds(stage.tied_grad_reduce),
            optimizer_s=stage.optimizer_s,
            param_gather_s=_exposed_gather_s(stage.param_gather),
        )
        for stage in plan.stages
    )


def _exposed_gather_s(gather: ParamGather | PricedGather | None) -> float:
    """The parameter all-gather the engine runs after the step (0 when overlapped: the
    bound credits none of the waits it may cause)."""
    return 0.0 if gather is None or gather.overlapped else gather.total_s


def _stage_seconds(priced: PricedStage) -> StageSeconds:
    """A priced stage's durations, as `simulation.priced_stages` hands them to the engine."""
    return StageSeconds(
        forward_s=tuple(chunk.forward_busy_s for chunk in priced.chunks),
        backward_s=tuple(chunk.backward_busy_s for chunk in priced.chunks),
        send_forward_s=_seconds(priced.send_forward),
        send_backward_s=_seconds(priced.send_backward),
        grad_reduce_s=_seconds(priced.grad_reduce),
        tied_reduce_s=_seconds(priced.tied_grad_reduce),
        optimizer_s=priced.optimizer_s,
        param_gather_s=_exposed_gather_s(priced.param_gather),
    )


def stage_seconds(
    scenario: Scenario, hw: HardwareProfile, workload: Workload, pricing: StagePricing | None = None
) -> tuple[StageSeconds, ...]:
    """Each stage's durations, priced by the same `StagePricing` as `simulation.build_plan`
    (pass one `pricing` of `hw` to share its caches over a search's layouts)."""
    pricing = pricing or StagePricing(hw)
    return tuple(_stage_seconds(priced) for priced in pricing.stages(scenario, workload))


def bound_inputs(
    scenario: Scenario, hw: HardwareProfile, workload: Workload, pricing: StagePricing | None = None
) -> BoundInputs:
    par, training = scenario.parallel, scenario.training
    return BoundInputs(
        stages=stage_seconds(scenario, hw, workload, pricing),
        num_microbatches=scenario.num_microbatches,
        paired_sends=training.schedule is ScheduleKind.ONE_F_ONE_B and par.vpp > 1,
        overlap_grad_reduce=training.overlap_grad_reduce,
    )


def _blocked_s(r: int, stage: StageSeconds, inputs: BoundInputs) -> float:
    """The least time stage r spends blocked on its own sends (see the module docstring)."""
    p, m, v = len(inputs.stages), inputs.num_microbatches, len(stage.forward_s)
    if p == 1:
        return 0.0
    forward_sends = m * (v - (1 if r == p - 1 else 0))  # the last virtual stage sends no activation
    backward_sends = m * (v - (1 if r == 0 else 0))  # the first virtual stage sends no gradient
    if inputs.paired_sends:
        positions = math.ceil((forward_sends + backward_sends) / 2)
        return positions * min(stage.send_forward_s, stage.send_backward_s)
    return forward_sends * stage.send_forward_s + backward_sends * stage.send_backward_s


def lower_bound_s(inputs: BoundInputs) -> float:
    """A duration the engine's iteration time can never be below (module docstring)."""
    stages, m = inputs.stages, inputs.num_microbatches
    fill_s = 0.0
    pipeline_end_s = []
    for r, stage in enumerate(stages):
        busy_s = m * (sum(stage.forward_s) + sum(stage.backward_s))
        pipeline_end_s.append(fill_s + busy_s + _blocked_s(r, stage, inputs))
        fill_s += stage.forward_s[0] + stage.send_forward_s
    # Stage 0 ends after the drain of the last microbatch from every later stage r:
    # pipeline_end[r] + Σ_{j<r} backward_s_j[0] + Σ_{0<j<r} send_backward_s_j.
    drain_s = 0.0
    for r in range(1, len(stages)):
        drain_s += stages[r - 1].backward_s[0] + (stages[r - 1].send_backward_s if r > 1 else 0.0)
        pipeline_end_s[0] = max(pipeline_end_s[0], pipeline_end_s[r] + drain_s)
    ready_s = [
        end_s + (0.0 if inputs.overlap_grad_reduce else stage.grad_reduce_s)
        for end_s, stage in zip(pipeline_end_s, stages)
    ]
    tied = [r for r, stage in enumerate(stages) if stage.tied_reduce_s > 0]
    if tied:
        start_s = max(ready_s[r] for r in tied)
        for r in tied:
            ready_s[r] = start_s + stages[r].tied_reduce_s
    return max(ready_s) + max(stage.optimizer_s + stage.param_gather_s for stage in stages)
