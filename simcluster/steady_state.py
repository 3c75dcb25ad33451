"""A long pipeline from a short one: the engine's steady state, certified and repeated.

Megatron's schedules are warm-up / steady state / cooldown (`pipeline_parallel/schedules.py`). Once m
is large enough that the warm-up is not clipped by m (and, for the interleaved schedule,
m > p so it is not the all-warm-up shape), one more microbatch (one more group of p for
the interleaved schedule, whose order repeats per group) adds one more period of the
steady state. When the pipeline has settled into that period, every quantity the engine
reports — the iteration time, each stage's busy time per category, its pipeline end and
gradient-ready times — grows by the same amount per period, and the peak memory stays.

`simulate_steady_state` runs the SimPy engine once, at a reduced count m2 = m1 + Δ, probed
at two points one period apart, and `simcluster.periodicity.certify` checks that the
state there (clocks, links, messages in flight, stored activations) has shifted by one
constant: the proof, by time-invariance of the engine's max/+ arithmetic, that every run
at m1 + kΔ lies on the same line. Only then is the result extended (`extrapolate`); where
the certificate fails (a transient still running) it tries once at twice m1, then
simulates every microbatch, as it does for GPipe (no steady state). The engine decides every number; the
extension only repeats its certified period. tests/engine/test_steady_state.py compares it
with the full simulation over random layouts of every schedule, vpp, dp overlap,
distributed optimizer, sequence parallelism and recompute mode, and over the benchmark's
175B layouts. The per-task trace exists only for full simulations.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from simcluster.config.choices import ScheduleKind
from simcluster.engine.plan import PipelinePlan, TimeCategory
from simcluster.engine.simulator import EngineResult, StageOutcome, simulate
from simcluster.periodicity import PlanIndex, certify, stable_frontier


@dataclass(frozen=True, slots=True)
class ReducedCounts:
    """The certificate's two microbatch counts (only m2 is simulated) for a run of `target`."""

    m1: int
    m2: int
    target: int


def reduced_counts(
    kind: ScheduleKind, num_stages: int, num_chunks: int, num_microbatches: int
) -> ReducedCounts | None:
    """(m1, m2) to certify a steady state from, or None when simulating m is no dearer.

    1F1B: m ≥ p, where every stage's warm-up min(p − r − 1, m) and peak in-flight
    min(p − r, m) stop depending on m; the period is one microbatch. Interleaved: m a
    multiple of p (Megatron's rule) and m ≥ 2p (m = p is the all-warm-up shape); the order
    repeats per group of p microbatches, so m2 = m1 + p. GPipe: None, it has no steady
    state (all forwards, then all backwards; activations pile up with m).
    """
    p = num_stages
    if kind is ScheduleKind.GPIPE:
        return None
    if num_chunks > 1:
        m1, m2 = 2 * p, 3 * p
    else:
        m1, m2 = p, p + 1
    if m2 >= num_microbatches:
        return None
    return ReducedCounts(m1, m2, num_microbatches)


def extrapolate(run: EngineResult, shift_s: float, counts: ReducedCounts) -> EngineResult:
    """The engine result at `counts.target` from the certified run at m2 (probed at the two
    frontiers, see simcluster.periodicity): each of the k = (m − m2)/(m2 − m1) further steady
    periods adds `shift_s` to every time and the period's busy time (busy at the second
    probe minus busy at the first) to every busy sum; stored activations repeat, so peaks
    stay. No spans: a trace needs the full simulation. `num_events` counts the events the
    run actually processed (the work done), not those a full run would have."""
    periods = (counts.target - counts.m2) // (counts.m2 - counts.m1)
    stages = []
    for outcome, (first, second) in zip(run.stages, run.probes, strict=True):
        busy: defaultdict[TimeCategory, float] = defaultdict(float)
        for category, seconds in outcome.busy_s.items():
            period_s = second.busy_s.get(category, 0.0) - first.busy_s.get(category, 0.0)
            busy[category] = seconds + periods * period_s
        stages.append(
            StageOutcome(
                busy_s=busy,
                pipeline_end_s=outcome.pipeline_end_s + periods * shift_s,
                grads_ready_s=outcome.grads_ready_s + periods * shift_s,
                finished=outcome.finished,
                memory=outcome.memory,
            )
        )
    return EngineResult(
        iteration_time_s=run.iteration_time_s + periods * shift_s,
        stages=tuple(stages),
        spans=(),
        link_spans={},
        num_events=run.num_events,
    )


def simulate_steady_state(
    plan_for: Callable[[int], PipelinePlan],
    kind: ScheduleKind,
    num_stages: int,
    num_chunks: int,
    num_microbatches: int,
) -> tuple[PipelinePlan, EngineResult]:
    """The engine's result for `num_microbatches` (`plan_for(m)` builds the plan for m
    microbatches) and the plan the engine ran: a certified short run extended, else the
    full run."""
    counts = reduced_counts(kind, num_stages, num_chunks, num_microbatches)
    for _attempt in range(2):
        if counts is None:
            break
        plans = PlanIndex.of(plan_for(counts.m1)), PlanIndex.of(plan_for(counts.m2))
        frontier = stable_frontier(*plans)
        if frontier is not None:
            probe = tuple(zip(*frontier, strict=True))
            run = simulate(plans[1].plan, probe=probe, shapes=plans[1].shapes)
            shift_s = certify(plans, frontier, run)
            if shift_s is not None:
                return plans[1].plan, extrapolate(run, shift_s, counts)
        counts = _doubled(counts)
    plan = plan_for(num_microbatches)
    return plan, simulate(plan)


def _doubled(counts: ReducedCounts) -> ReducedCounts | None:
    step = counts.m2 - counts.m1
    m1 = 2 * counts.m1
    return ReducedCounts(m1, m1 + step, counts.target) if m1 + step < counts.target else None
