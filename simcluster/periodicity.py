"""A certificate that two engine runs, at m1 and m2 = m1 + Δ microbatches, lie on the line
every longer run lies on (used by simcluster/steady_state.py).

The argument. Each stage's links, memory and clock are its own (its links carry only its
sends and gradient reductions, in its task order, and its `dp:` link the overlapped
parameter all-gather issued at the iteration start), so what a stage does after a position
depends only on its state there — its clock and when its links and gradient reduction are
free — and on the arrival times of the messages it still has to receive. Take, for each
stage, the longest prefix of its task order that (a) is the same in both runs (tasks, comm
points, which backward is a chunk's last) and (b) only consumes messages released inside
the other stages' prefixes: the *stable frontier* `f1`. Up to f1 both runs compute the same
thing, so only run m2 is simulated. It has that prefix plus one more period of the steady
state, so its frontier is `f2 = f1 + (len2 − len1)` per stage, and the tasks after `f2` in
run m2 are those after `f1` in run m1 with every microbatch shifted by Δ (both checked on
the plans). If every component of run m2's state at `f2` (clocks, links, gradient
reductions, arrival times of messages crossing the frontier) is its state at `f1` plus one
constant d, and the stored activations are the same, then, since the engine's arithmetic
is max and + (shifting every input by d shifts every output by d):
  - run m2's remainder is run m1's shifted by d, so T(m2) = T(m1) + d;
  - the steady period that carries the state from f1 to f2 carries the state at f2 to the
    frontier of a run at m2 + Δ, shifted by d again (Megatron's steady order repeats every
    Δ microbatches), and so on by induction: T(m1 + kΔ) = T(m1) + k·d for every k ≥ 0.
Likewise every busy-time sum and the stages' end times grow by the same amount per period.
Without that equality (a transient still running: two routes through the pipeline with
nearly equal periods, the slower-growing one still the longest), no line is claimed.
The overlapped parameter all-gather gates each chunk's first forward on absolute bucket
arrival times, which do not shift with the period: a frontier is refused unless every such
gate lies before f1 (in the prefix both runs share, so computed identically in both).
Gradient buckets are issued during a chunk's last backward at affine offsets of its start,
on the probed gradient link, so they shift like everything else.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from itertools import accumulate

from simcluster.engine.plan import Collective, Issue, PipelinePlan, StagePlan
from simcluster.engine.simulator import (
    EngineResult,
    Key,
    StageShape,
    Wiring,
    stage_hooks,
    stage_shape,
    task_positions,
)

RELATIVE_TOLERANCE = 1e-9
"""Equal shifts are compared to this fraction of the iteration time: far above the float
rounding of sums of O(10^5) task durations (~1e-12), far below any modelled effect."""

Signature = tuple[object, ...]
Frontier = tuple[tuple[int, ...], tuple[int, ...]]
Needs = tuple[dict[int, list[int]], ...]  # per stage: producer stage -> running max (see _needs)


def _signatures(
    stage: StagePlan, shape: StageShape, gated: frozenset[int], collectives: tuple[Collective, ...]
) -> tuple[Signature, ...]:
    """Per position what the engine does there, comm points relative to the position
    (whether a chunk's last backward issues its gradient reduction, in buckets or not,
    whether a chunk's first forward is gated by the parameter all-gather, which of the
    stage's collectives run inside the task or are issued by it, and whether the task runs
    unpaired, `StagePlan.unpaired`)."""
    last = shape.last_backward
    n = len(stage.tasks)
    after = stage.send_after if stage.send_after is not None else range(n)
    extra = stage.extra_waits if stage.extra_waits is not None else ((),) * n
    issued: dict[int, list[int]] = {}
    for number, collective in enumerate(collectives):
        if collective.issue in (Issue.INSIDE, Issue.SPREAD, Issue.AFTER):
            assert collective.task is not None
            for at in task_positions(collective.task, shape):
                issued.setdefault(at, []).append(number)
    unpaired = stage.unpaired  # an unpaired task runs other works than a paired one
    return tuple(
        (task.phase, task.microbatch, task.chunk, a - i, tuple(j - i for j in e), i in last, i in gated,
         tuple(issued.get(i, ())), i in unpaired)
        for i, (task, a, e) in enumerate(zip(stage.tasks, after, extra))
    )  # fmt: skip


def _issue_points(collectives: tuple[Collective, ...]) -> tuple[object, ...]:
    """What of a stage's collectives the certificate's signatures depend on."""
    return tuple((collective.issue, collective.task) for collective in collectives)


def _shifted(signatures: tuple[Signature, ...], shift: int) -> list[Signature]:
    return [(s[0], s[1] + shift, *s[2:]) for s in signatures]  # type: ignore[operator]


def _common_prefix(a: tuple[Signature, ...], b: tuple[Signature, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True, slots=True, eq=False)
class PlanShape:
    """What the certificate needs of a plan, whatever its costs: each stage's shape, the
    positions the overlapped parameter all-gather gates (absolute times: `_gated`), the
    signatures, and which stage and position releases each message. Cached (`plan_shape`):
    a sweep's layouts share a few."""

    stages: tuple[StageShape, ...]
    gated: tuple[frozenset[int], ...]
    signatures: tuple[tuple[Signature, ...], ...]
    num_microbatches: int
    producer: dict[Key, tuple[int, int]]  # key -> (stage, position after which it leaves)
    needs: Needs

    @classmethod
    def of(
        cls, plan: PipelinePlan, shapes: tuple[StageShape, ...], gated: tuple[frozenset[int], ...]
    ) -> PlanShape:
        producer = {
            key: (index, after)
            for index, shape in enumerate(shapes)
            for after, out in enumerate(shape.sends)
            for _route, key, _task in out
        }
        signatures = tuple(
            _signatures(stage, shape, g, c)
            for stage, shape, g, c in zip(plan.stages, shapes, gated, plan.collectives, strict=True)
        )
        return cls(shapes, gated, signatures, _num_microbatches(plan), producer, _needs(shapes, producer))


def _needs(shapes: tuple[StageShape, ...], producer: dict[Key, tuple[int, int]]) -> Needs:
    """Per stage r and producer stage s: the running max over r's positions of the
    release position on s its waits need (non-decreasing, so bisectable)."""
    out = []
    for shape in shapes:
        waits = shape.waits
        latest: dict[int, list[int]] = {}
        for position, keys in enumerate(waits):
            for key in keys:
                src, after = producer[key]
                row = latest.get(src)
                if row is None:
                    row = latest[src] = [-1] * len(waits)
                if after > row[position]:
                    row[position] = after
        out.append({src: list(accumulate(row, max)) for src, row in latest.items()})
    return tuple(out)


def _gated(collectives: tuple[Collective, ...], shape: StageShape) -> frozenset[int]:
    """Positions whose start waits for a collective issued at the iteration start (the
    overlapped parameter all-gather): the gate compares absolute times, not shifted by the
    period."""
    return frozenset(at for _, positions in stage_hooks(collectives, shape).start for at in positions)


_PLAN_SHAPES: dict[tuple[object, ...], PlanShape] = {}
_CERTIFICATES: dict[tuple[int, int], tuple[PlanShape, PlanShape, Frontier | None, list[tuple[Key, int]]]] = {}
_MAX_CACHED = 128  # plans: a sweep's steady-state runs have a few shapes (issue 9's spec: 12)


def plan_shape(plan: PipelinePlan) -> PlanShape:
    """`PlanShape.of(plan)`, cached by the identity of its stages' shapes (which the entry
    keeps alive, so no identity is reused while the entry exists) and the gated positions."""
    shapes = tuple(stage_shape(plan, index) for index in range(plan.num_stages))
    gated = tuple(_gated(collectives, shape) for collectives, shape in zip(plan.collectives, shapes))
    key = (*map(id, shapes), *(bool(g) for g in gated), *map(_issue_points, plan.collectives))
    cached = _PLAN_SHAPES.get(key)
    if cached is None:
        if len(_PLAN_SHAPES) >= _MAX_CACHED:
            _PLAN_SHAPES.clear()
        cached = _PLAN_SHAPES[key] = PlanShape.of(plan, shapes, gated)
    return cached


@dataclass(frozen=True, slots=True)
class PlanIndex:
    """A plan and its `PlanShape`, built once for the certificate and the engine run."""

    plan: PipelinePlan
    shape: PlanShape

    @classmethod
    def of(cls, plan: PipelinePlan) -> PlanIndex:
        return cls(plan, plan_shape(plan))

    @property
    def shapes(self) -> tuple[StageShape, ...]:
        return self.shape.stages

    @property
    def wires(self) -> tuple[Wiring, ...]:
        return tuple(shape.wiring for shape in self.shape.stages)

    @property
    def producer(self) -> dict[Key, tuple[int, int]]:
        return self.shape.producer


def _close(frontier: list[int], needs: Needs) -> list[int]:
    """Shrink each stage's prefix until every message it awaits is released inside the
    producer's prefix (a fixpoint: frontiers only move down)."""
    changed = True
    while changed:
        changed = False
        for r, running in enumerate(needs):
            for src, need in running.items():
                bad = bisect_left(need, frontier[src], 0, frontier[r])
                if bad < frontier[r]:
                    frontier[r], changed = bad, True
    return frontier


def _num_microbatches(plan: PipelinePlan) -> int:
    return 1 + max(task.microbatch for task in plan.stages[0].tasks)


def stable_frontier(first: PlanIndex, second: PlanIndex) -> Frontier | None:
    """(f1, f2) as in the module docstring, or None when the plans' remainders after them
    differ by more than the microbatch shift (no certificate possible). Depends only on
    the plans' shapes, so it is computed once per pair of shapes."""
    return _certificate(first.shape, second.shape)[2]


def _certificate(
    first: PlanShape, second: PlanShape
) -> tuple[PlanShape, PlanShape, Frontier | None, list[tuple[Key, int]]]:
    key = (id(first), id(second))
    cached = _CERTIFICATES.get(key)
    if cached is None or cached[0] is not first or cached[1] is not second:
        frontier = _stable_frontier(first, second)
        crossing = _crossing(first, frontier[0]) if frontier is not None else []
        if len(_CERTIFICATES) >= _MAX_CACHED:
            _CERTIFICATES.clear()
        cached = _CERTIFICATES[key] = (first, second, frontier, crossing)
    return cached


def _stable_frontier(first: PlanShape, second: PlanShape) -> Frontier | None:
    shift = second.num_microbatches - first.num_microbatches
    sig1, sig2 = first.signatures, second.signatures
    f1 = _close([_common_prefix(a, b) for a, b in zip(sig1, sig2)], first.needs)
    f2 = [f + len(b) - len(a) for f, a, b in zip(f1, sig1, sig2)]
    if _close(list(f2), second.needs) != f2:
        return None  # the longer run's prefix is not closed: no state to compare
    for f, g, a, b, gated in zip(f1, f2, sig1, sig2, first.gated):
        if _shifted(a[f:], shift) != list(b[g:]):
            return None
        if any(position >= f for position in gated):
            # a gate left after the frontier would wait on absolute bucket arrival times,
            # which do not shift with the period: every gate must lie in the shared prefix
            return None
    return tuple(f1), tuple(f2)


def _crossing(shape: PlanShape, frontier: tuple[int, ...]) -> list[tuple[Key, int]]:
    """Messages released before the producer's frontier and awaited after the consumer's:
    (key, consumer stage)."""
    out = []
    for r, stage in enumerate(shape.stages):
        for keys in stage.waits[frontier[r] :]:
            for key in keys:
                src, after = shape.producer[key]
                if after < frontier[src]:
                    out.append((key, r))
    return out


def certify(plans: tuple[PlanIndex, PlanIndex], frontier: Frontier, run: EngineResult) -> float | None:
    """The shift d, when run m2's state at f2 is the state at f1 plus d (else None).

    Only run m2 is simulated: run m1's prefix up to f1 is run m2's (the same tasks, closed
    under their inputs), so run m2 probed at f1 and f2 holds both states, and the messages
    crossing f1 in run m1 are released inside that shared prefix."""
    shift_mb = plans[1].shape.num_microbatches - plans[0].shape.num_microbatches
    first = [states[0] for states in run.probes]
    second = [states[1] for states in run.probes]
    d = second[0].times_s[0] - first[0].times_s[0]
    tolerance = RELATIVE_TOLERANCE * run.iteration_time_s
    for a, b in zip(first, second, strict=True):
        if len(a.times_s) != len(b.times_s):
            return None
        if any(abs(y - x - d) > tolerance for x, y in zip(a.times_s, b.times_s)):
            return None
        if abs(b.stored_bytes - a.stored_bytes) > RELATIVE_TOLERANCE * max(1.0, abs(a.stored_bytes)):
            return None  # activations pile up (GPipe): peaks would not repeat
    cached = _certificate(plans[0].shape, plans[1].shape)
    crossing = cached[3] if cached[2] == frontier else _crossing(plans[0].shape, frontier[0])
    for key, consumer in crossing:
        moved = (key[0], key[1] + shift_mb, key[2])
        if key not in run.arrival_s or moved not in run.arrival_s:
            return None
        # the consumer starts no earlier than its clock at the frontier
        x = max(run.arrival_s[key], first[consumer].times_s[0])
        y = max(run.arrival_s[moved], second[consumer].times_s[0])
        if abs(y - x - d) > tolerance:
            return None
    return d
