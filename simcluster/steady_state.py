"""Long pipelines from two short ones: the engine's iteration is affine in the microbatch count.

Megatron's schedules are warm-up / steady state / cooldown (megatron.md §4.1–4.2). Once m
is large enough that the warm-up is not clipped by m (and, for the interleaved schedule,
m > p so it is not the all-warm-up shape), one more microbatch (one more group of p for
the interleaved schedule, whose order repeats per group) adds one more period of the
steady state and changes nothing else: the warm-up is the same, the cooldown starts from
the same state shifted in time, and every stage's link and memory are its own (a stage's
links carry only its own sends and gradient reductions, in its own task order). So every
quantity the engine reports is affine in m from that point on — the iteration time, each
stage's busy time per category, its pipeline end and gradient-ready times — and the peak
memory is constant (1F1B, interleaved) or affine (GPipe, which stores every microbatch).

`simulate_steady_state` runs the SimPy engine at two reduced counts m1 < m2 and
extrapolates each of those quantities to m along the line through them. The engine still
decides every number; the line only repeats its steady-state period m − m2 more times.
Exactness (to float rounding) is shown by tests/engine/test_steady_state.py, which compares
the extrapolation with the full simulation over random layouts of every schedule, vpp, dp
overlap, distributed optimizer, sequence parallelism and recompute mode, and over the
benchmark's 175B layouts. The per-task trace exists only for full simulations.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from simcluster.config.choices import ScheduleKind
from simcluster.engine.memory import MemoryTracker
from simcluster.engine.plan import PipelinePlan
from simcluster.engine.simulator import EngineResult, StageOutcome, simulate
from simcluster.periodicity import PlanIndex, certify, stable_frontier


@dataclass(frozen=True, slots=True)
class ReducedCounts:
    """The two microbatch counts simulated for a run of `target` microbatches."""

    m1: int
    m2: int
    target: int

    @property
    def simulated_microbatches(self) -> int:
        return self.m1 + self.m2


def reduced_counts(
    kind: ScheduleKind, num_stages: int, num_chunks: int, num_microbatches: int
) -> ReducedCounts | None:
    """(m1, m2) from which the line is exact, or None when simulating m itself is no dearer.

    1F1B: m ≥ p, where every stage's warm-up min(p − r − 1, m) and peak in-flight
    min(p − r, m) stop depending on m; the period is one microbatch. Interleaved: m a
    multiple of p (Megatron's rule) and m ≥ 2p (m = p is the all-warm-up shape); the order
    repeats per group of p microbatches, so m2 = m1 + p. GPipe: m ≥ 2p (with vpp > 1 the
    wrap from the last rank to the first chunk binds, and blocking sends wait, for m ≤ p);
    period one microbatch.
    """
    p = num_stages
    if kind is ScheduleKind.ONE_F_ONE_B and num_chunks > 1:
        m1, m2 = 2 * p, 3 * p
    elif kind is ScheduleKind.GPIPE:
        m1, m2 = 2 * p, 2 * p + 1
    else:
        m1, m2 = p, p + 1
    if m1 + m2 >= num_microbatches:
        return None
    return ReducedCounts(m1, m2, num_microbatches)


def _line(x1: float, x2: float, counts: ReducedCounts) -> float:
    """The value at `target` on the line through (m1, x1) and (m2, x2); exactly x2 when the
    quantity is constant (x1 == x2), e.g. a 1F1B stage's peak memory."""
    if x1 == x2:
        return x2
    return x2 + (x2 - x1) * ((counts.target - counts.m2) / (counts.m2 - counts.m1))


def _stage(first: StageOutcome, second: StageOutcome, counts: ReducedCounts) -> StageOutcome:
    busy: defaultdict[str, float] = defaultdict(float)
    for category in dict.fromkeys([*first.busy_s, *second.busy_s]):
        busy[category] = _line(first.busy_s.get(category, 0.0), second.busy_s.get(category, 0.0), counts)
    a, b = first.memory, second.memory
    assert a is not None and b is not None
    memory = MemoryTracker(b.static_bytes, stored_bytes=b.stored_bytes, transient_bytes=b.transient_bytes)
    memory.peak_stored_bytes = _line(a.peak_stored_bytes, b.peak_stored_bytes, counts)
    memory.peak_total_bytes = _line(a.peak_total_bytes, b.peak_total_bytes, counts)
    return StageOutcome(
        busy_s=busy,
        pipeline_end_s=_line(first.pipeline_end_s, second.pipeline_end_s, counts),
        grads_ready_s=_line(first.grads_ready_s, second.grads_ready_s, counts),
        finished=first.finished and second.finished,
        memory=memory,
    )


def extrapolate(first: EngineResult, second: EngineResult, counts: ReducedCounts) -> EngineResult:
    """The engine result at `counts.target` on the line through the runs at m1 and m2.
    No spans: a trace needs the full simulation. `num_events` counts the events the two
    runs actually processed (the work done), not those a full run would have."""
    return EngineResult(
        iteration_time_s=_line(first.iteration_time_s, second.iteration_time_s, counts),
        stages=tuple(_stage(a, b, counts) for a, b in zip(first.stages, second.stages, strict=True)),
        spans=(),
        link_spans={},
        num_events=first.num_events + second.num_events,
    )


def simulate_steady_state(
    plan_for: Callable[[int], PipelinePlan],
    kind: ScheduleKind,
    num_stages: int,
    num_chunks: int,
    num_microbatches: int,
) -> tuple[PipelinePlan, EngineResult]:
    """The engine's result for `num_microbatches` (`plan_for(m)` builds the plan for m
    microbatches), with the longest plan the engine ran: the line through two reduced runs
    when they are certified periodic (see `certify`), retried once at twice the counts, else
    the full run."""
    counts = reduced_counts(kind, num_stages, num_chunks, num_microbatches)
    for _attempt in range(2):
        if counts is None:
            break
        plans = PlanIndex.of(plan_for(counts.m1)), PlanIndex.of(plan_for(counts.m2))
        frontier = stable_frontier(*plans)
        if frontier is not None:
            runs = tuple(
                simulate(index.plan, probe=probe, wires=index.wires) for index, probe in zip(plans, frontier)
            )
            if certify(plans, frontier, (runs[0], runs[1])):
                return plans[1].plan, extrapolate(runs[0], runs[1], counts)
        counts = _doubled(counts)
    plan = plan_for(num_microbatches)
    return plan, simulate(plan)


def _doubled(counts: ReducedCounts) -> ReducedCounts | None:
    step = counts.m2 - counts.m1
    m1 = 2 * counts.m1
    return ReducedCounts(m1, m1 + step, counts.target) if 2 * m1 + step < counts.target else None
