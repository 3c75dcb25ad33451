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

from simcluster.engine.plan import PipelinePlan, StagePlan
from simcluster.engine.simulator import (
    EngineResult,
    Key,
    Wiring,
    first_forward_positions,
    last_backward_positions,
    wiring,
)

RELATIVE_TOLERANCE = 1e-9
"""Equal shifts are compared to this fraction of the iteration time: far above the float
rounding of sums of O(10^5) task durations (~1e-12), far below any modelled effect."""

Signature = tuple[object, ...]


def _gated(stage: StagePlan) -> set[int]:
    """Positions whose start waits for the overlapped parameter all-gather, issued at the
    iteration start: the gate compares absolute times, not shifted by the period."""
    gather = stage.param_gather
    return first_forward_positions(stage) if gather is not None and gather.overlapped else set()


def _signatures(stage: StagePlan, shift: int = 0) -> list[Signature]:
    """Per position what the engine does there, comm points relative to the position
    (whether a chunk's last backward issues its gradient reduction, in buckets or not, and
    whether a chunk's first forward is gated by the parameter all-gather)."""
    last, gated = last_backward_positions(stage), _gated(stage)
    n = len(stage.tasks)
    after = stage.send_after if stage.send_after is not None else range(n)
    extra = stage.extra_waits if stage.extra_waits is not None else ((),) * n
    return [
        (task.phase, task.microbatch + shift, task.chunk, a - i, tuple(j - i for j in e), i in last,
         i in gated)
        for i, (task, a, e) in enumerate(zip(stage.tasks, after, extra))
    ]


def _common_prefix(a: list[Signature], b: list[Signature]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class PlanIndex:
    """A plan's message wiring, built once for the certificate and the engine run."""

    plan: PipelinePlan
    wires: tuple[Wiring, ...]
    producer: dict[Key, tuple[int, int]]  # key -> (stage, position after which it leaves)

    @classmethod
    def of(cls, plan: PipelinePlan) -> PlanIndex:
        wires = tuple(wiring(plan, index) for index in range(plan.num_stages))
        producer = {
            key: (index, after)
            for index, (_waits, sends) in enumerate(wires)
            for after, out in enumerate(sends)
            for _route, key, _task in out
        }
        return cls(plan, wires, producer)

    def needs(self) -> list[dict[int, list[int]]]:
        """Per stage r and producer stage s: the running max over r's positions of the
        release position on s its waits need (non-decreasing, so bisectable)."""
        out = []
        for waits, _sends in self.wires:
            latest: dict[int, list[int]] = {}
            for position, keys in enumerate(waits):
                for key in keys:
                    src, after = self.producer[key]
                    row = latest.get(src)
                    if row is None:
                        row = latest[src] = [-1] * len(waits)
                    if after > row[position]:
                        row[position] = after
            out.append({src: list(accumulate(row, max)) for src, row in latest.items()})
        return out


def _close(frontier: list[int], needs: list[dict[int, list[int]]]) -> list[int]:
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


Frontier = tuple[tuple[int, ...], tuple[int, ...]]


def stable_frontier(first: PlanIndex, second: PlanIndex) -> Frontier | None:
    """(f1, f2) as in the module docstring, or None when the plans' remainders after them
    differ by more than the microbatch shift (no certificate possible)."""
    shift = _num_microbatches(second.plan) - _num_microbatches(first.plan)
    sig1 = [_signatures(stage) for stage in first.plan.stages]
    sig2 = [_signatures(stage) for stage in second.plan.stages]
    f1 = _close([_common_prefix(a, b) for a, b in zip(sig1, sig2)], first.needs())
    f2 = [f + len(b) - len(a) for f, a, b in zip(f1, sig1, sig2)]
    if _close(list(f2), second.needs()) != f2:
        return None  # the longer run's prefix is not closed: no state to compare
    for f, g, stage, b in zip(f1, f2, first.plan.stages, sig2):
        if _signatures(stage, shift)[f:] != b[g:]:
            return None
        if any(position >= f for position in _gated(stage)):
            # a gate left after the frontier would wait on absolute bucket arrival times,
            # which do not shift with the period: every gate must lie in the shared prefix
            return None
    return tuple(f1), tuple(f2)


def _crossing(index: PlanIndex, frontier: tuple[int, ...]) -> list[tuple[Key, int]]:
    """Messages released before the producer's frontier and awaited after the consumer's:
    (key, consumer stage)."""
    out = []
    for r, (waits, _sends) in enumerate(index.wires):
        for keys in waits[frontier[r]:]:
            for key in keys:
                src, after = index.producer[key]
                if after < frontier[src]:
                    out.append((key, r))
    return out


def certify(plans: tuple[PlanIndex, PlanIndex], frontier: Frontier, run: EngineResult) -> float | None:
    """The shift d, when run m2's state at f2 is the state at f1 plus d (else None).

    Only run m2 is simulated: run m1's prefix up to f1 is run m2's (the same tasks, closed
    under their inputs), so run m2 probed at f1 and f2 holds both states, and the messages
    crossing f1 in run m1 are released inside that shared prefix."""
    shift_mb = _num_microbatches(plans[1].plan) - _num_microbatches(plans[0].plan)
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
    for key, consumer in _crossing(plans[0], frontier[0]):
        moved = (key[0], key[1] + shift_mb, key[2])
        if key not in run.arrival_s or moved not in run.arrival_s:
            return None
        # the consumer starts no earlier than its clock at the frontier
        x = max(run.arrival_s[key], first[consumer].times_s[0])
        y = max(run.arrival_s[moved], second[consumer].times_s[0])
        if abs(y - x - d) > tolerance:
            return None
    return d
