"""The SimPy engine: one coroutine per pipeline stage runs its task list, SimPy orders them.

Life cycle of a task on stage r (virtual stage vs = chunk·p + r):
  1. wait for its input: a forward for the activation from vs − 1, a backward for the
     gradient from vs + 1 (the last virtual stage's backward follows its own forward);
  2. hold the stage for the task's busy time (memory: a forward stores its activations at
     start, a backward holds its transient bytes while it runs and frees at its end);
  3. send its output to the neighbour on the stage's link (FIFO). Megatron's p2p is
     synchronous, so by default the sender waits until the message is delivered. A plan
     may defer a send and add waits (`send_after`, `extra_waits`) to mirror Megatron's
     combined p2p calls (see `simcluster.schedule.comm`).
A stage's collectives (`plan.Collective`, each on a typed link, FIFO with the link's other
traffic) enter its life where their `Issue` says: at the iteration start, gating a task's
slices (the distributed optimizer's overlapped parameter all-gather); inside a task,
blocking between its slices; spread through or at the end of a task, the stage's end
waiting for them (overlapped gradient reduction, in buckets or not); when its last task
ends (gradient reduction without overlap); joined with the other stages of a group link
once all are ready (the tied-embedding all-reduce); after the optimizer step (the
parameter all-gather without overlap). Every stage steps its optimizer after the slowest
stage is ready (the gradient-norm all-reduce joins them); the iteration seen is the steady
state, where the gathers issued at its start are those of the previous step's update. The
engine has no code for any one collective: Megatron's data-parallel ones are compiled from
the plan's declarations (`plan.data_parallel_collectives`), any other is plan data.

How it runs (issue 9): each stage is a coroutine that keeps its clock as a float. A task
starts at max(clock, the arrival times of its messages) and ends at one SimPy event, which
the stage schedules and whose callback resumes it: SimPy's queue runs every stage's task
ends in time order, one event per task, plus one per piece of a collective inside a task
(the earlier engine took ~2.2 per task: a timeout per task,
per message and per blocked send). A message is its arrival time, posted when the sender's
task ends (its link is reserved then, so the time is final): a receiver that reaches the
task later reads it; one that reached it first is waiting for it and is resumed by the post
to compute the same start. Every time is the same float sum or maximum, taken in the same
order per stage, as in the earlier engine (tests/engine/test_engine_reference.py compares
them bit for bit); `num_events` counts the events this engine schedules.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from heapq import heappush

import simpy
from simpy.events import NORMAL

from simcluster.engine.gc_tuning import simulation_gc
from simcluster.engine.links import Link, LinkQueue
from simcluster.engine.memory import MemoryTracker
from simcluster.engine.plan import (
    Collective,
    Issue,
    Occurrence,
    PipelinePlan,
    StagePlan,
    TaskRef,
    TimeCategory,
)
from simcluster.schedule.tasks import Phase, Task

PP_COMM, DP_COMM, OPTIMIZER = TimeCategory.PP_COMM, TimeCategory.DP_COMM, TimeCategory.OPTIMIZER

Span = tuple[int, str, str, float, float]  # stage, name, trace category, start_s, duration_s
Key = tuple[int, int, int]  # a message: (0 forward / 1 backward, microbatch, sending virtual stage)
Send = tuple[int, Key, Task]  # route (0 the stage's send_forward, 1 its send_backward), key, producer
Wiring = tuple[tuple[tuple[Key, ...], ...], tuple[tuple[Send, ...], ...]]  # per position: awaits, sends


@dataclass(slots=True)
class StageOutcome:
    busy_s: dict[TimeCategory, float] = field(default_factory=lambda: defaultdict(float))
    pipeline_end_s: float = 0.0
    grads_ready_s: float = 0.0
    finished: bool = False
    memory: MemoryTracker | None = None


@dataclass(frozen=True, slots=True)
class ProbeState:
    """A stage's state when it reaches a probed task position: what its later work depends
    on besides later messages (`times_s`: its clock, then — no earlier than the clock, since
    later work only starts from it — when its gradient reduction and each of its links are
    free), and its running busy times and stored activation bytes."""

    times_s: tuple[float, ...]
    busy_s: dict[TimeCategory, float]
    stored_bytes: float


@dataclass(frozen=True, slots=True)
class EngineResult:
    iteration_time_s: float
    stages: tuple[StageOutcome, ...]
    spans: tuple[Span, ...]
    link_spans: dict[str, list[tuple[float, float, str]]]
    num_events: int
    probes: tuple[tuple[ProbeState, ...], ...] = ()  # per stage, at each probed position
    arrival_s: dict[Key, float] = field(default_factory=dict)  # every message, when probing

    def bubble_fraction(self) -> float:
        """Idle over busy stage-time until the pipeline's last backward ends (textbook
        (p − 1)/(m·v) for uniform tasks and free communication)."""
        span = max(stage.pipeline_end_s for stage in self.stages)
        work = sum(
            sum(v for k, v in stage.busy_s.items() if k not in (DP_COMM, OPTIMIZER)) for stage in self.stages
        )
        return max(0.0, (span * len(self.stages) - work) / work) if work > 0 else 0.0


@dataclass(frozen=True, slots=True, eq=False)
class StageShape:
    """What a stage's task order implies, whatever the tasks cost: per position the message
    keys it awaits and the sends that leave after it, which backwards are a chunk's last
    (they finish its gradients) and which forwards a chunk's first (the parameter all-gather
    gates them). Built once per task order (`stage_shape`): a sweep's layouts share a few."""

    waits: tuple[tuple[Key, ...], ...]
    sends: tuple[tuple[Send, ...], ...]
    last_backward: frozenset[int]
    first_forward: frozenset[int]
    runs: dict[tuple[bool, int], tuple[int, ...]]  # (is forward, chunk) -> its positions, in order
    # per position what the engine's loop unpacks: task, keys awaited, is forward, chunk, sends
    program: tuple[tuple[Task, tuple[Key, ...], bool, int, tuple[Send, ...]], ...]

    @property
    def wiring(self) -> Wiring:
        return self.waits, self.sends


_Parts = tuple[tuple[int, float], ...]
_Forward = tuple[float, float, float, _Parts]
_Backward = tuple[float, float, float, _Parts]


class _Busy:
    """A stage's busy seconds per category, in a list by slot, and the slots in the order
    they first get time (the outcome's dict keeps that order, as the earlier engine's did:
    sums over it follow it). PP_COMM and DP_COMM take slots 0 and 1, then the categories of
    the stage's works and collectives."""

    __slots__ = ("categories", "order", "seconds", "slot")

    def __init__(self, stage: StagePlan, collectives: tuple[Collective, ...]) -> None:
        self.categories: list[TimeCategory] = [PP_COMM, DP_COMM]
        self.slot: dict[TimeCategory, int] = {PP_COMM: 0, DP_COMM: 1}
        for category in (
            *(
                c
                for work in (
                    *stage.forward,
                    *stage.backward,
                    *(stage.unpaired_forward or ()),
                    *(stage.unpaired_backward or ()),
                )
                for c, _ in work.parts
            ),
            *(collective.category for collective in collectives),
        ):
            if category not in self.slot:
                self.slot[category] = len(self.categories)
                self.categories.append(category)
        self.seconds = [0.0] * len(self.categories)
        self.order: dict[int, None] = {}  # an ordered set

    def works(self, stage: StagePlan) -> tuple[list[_Forward], list[_Backward]]:
        """Per chunk what the engine's loop unpacks: a forward's busy seconds, stored bytes
        and parts by slot; a backward's busy seconds, transient bytes, the bytes it frees
        (its forward's stored bytes) and parts by slot."""
        slot = self.slot
        forward_works, backward_works = stage.forward, stage.backward
        # what a chunk's forward stores in all (a paired forward: at its start and deferred)
        whole = stage.unpaired_forward or stage.forward
        if stage.unpaired:  # chunk c's unpaired works at index chunks + c (`_build_shape`)
            assert stage.unpaired_forward is not None and stage.unpaired_backward is not None
            forward_works = (*forward_works, *stage.unpaired_forward)
            backward_works = (*backward_works, *stage.unpaired_backward)
        forwards = [
            (work.busy_s, work.stored_bytes, work.deferred_bytes, tuple((slot[c], x) for c, x in work.parts))
            for work in forward_works
        ]
        chunks = len(stage.forward)
        backwards = [
            (work.busy_s, work.transient_bytes, whole[c % chunks].stored_bytes,
             tuple((slot[c], x) for c, x in work.parts))
            for c, work in enumerate(backward_works)
        ]  # fmt: skip
        return forwards, backwards

    def add(self, i: int, seconds: float) -> None:
        self.order.setdefault(i)
        self.seconds[i] += seconds

    def as_dict(self) -> defaultdict[TimeCategory, float]:
        return defaultdict(float, {self.categories[i]: self.seconds[i] for i in self.order})


class _Run:
    def __init__(
        self,
        plan: PipelinePlan,
        record: bool,
        probe: tuple[tuple[int, ...], ...] | None = None,
        shapes: tuple[StageShape, ...] | None = None,
    ) -> None:
        self.plan = plan
        self.shapes = shapes or tuple(stage_shape(plan, index) for index in range(plan.num_stages))
        self.record = record
        self.probe = probe
        self.probes: list[list[ProbeState]] = [[] for _ in plan.stages]
        self.env = simpy.Environment()
        # Messages: key -> arrival time, posted when the sender's task ends; `waiting` holds
        # the resume of a stage that needs a message not yet posted (called by the post).
        self.arrival_s: dict[Key, float] = {}
        self.waiting: dict[Key, Callable[[object], None]] = {}
        self.resumers: list[Callable[[object], None]] = []
        self.links: dict[str, LinkQueue] = {}
        self.spans: list[Span] = []
        self.outcomes = tuple(StageOutcome(memory=MemoryTracker(stage.static_bytes)) for stage in plan.stages)

    def link(self, name: str) -> LinkQueue:
        if name not in self.links:
            self.links[name] = LinkQueue(name, record=self.record)
        return self.links[name]

    def _schedule(self, event: simpy.Event, time_s: float) -> simpy.Event:
        """Trigger `event` at the absolute time `time_s` (not before now). SimPy's
        `timeout(delay)` fires at now + delay, which can differ from `time_s` in the last
        bit; the engine's times are sums taken in each stage's own order, so the event is
        queued at exactly that time (SimPy's own queue entry: time, priority, id, event)."""
        event._ok, event._value = True, None
        heappush(self.env._queue, (time_s, NORMAL, next(self.env._eid), event))
        return event

    def reserve(self, link: Link, issue_s: float, seconds: float, label: str) -> float:
        """Queue `seconds` on `link`, issued at `issue_s` (not later than now, and after
        everything already issued on it); return when it is delivered."""
        queue = self.links.get(link.name) or self.link(link.name)
        _, end = queue.reserve(issue_s, seconds, label if self.record else "")
        return end

    def stage_process(self, index: int, stage: StagePlan) -> Generator[None, object, None]:
        """The stage's task list and collectives (see the module docstring for how time
        advances). Every yield waits to be resumed: by its event's callback, or by the post
        it waits for. The running sums — busy time per category, stored and transient bytes
        and their peaks — are kept in locals and written to the stage's outcome at probes and
        at the end, in the order and with the operations of `MemoryTracker`,
        `LinkQueue.reserve` and a per-category dict."""
        env, plan, outcome, record = self.env, self.plan, self.outcomes[index], self.record
        memory = outcome.memory
        assert memory is not None
        shape = self.shapes[index]
        arrival_s, waiting, schedule, links = self.arrival_s, self.waiting, self._schedule, self.links
        resume = self.resumers[index]
        arrival_of, waiting_pop = arrival_s.get, waiting.pop
        queue, event_ids = env._queue, env._eid
        # this stage's one event, re-armed for each task: a stage has one task running at a
        # time, and SimPy is done with an event once it has run its callbacks (re-arming =
        # giving it back its callback list, which SimPy only reads; it stays ok, value None)
        event = simpy.Event(env)
        event._ok, event._value = True, None
        armed = [resume]
        blocking = plan.blocking_p2p
        probe_at = set(self.probe[index]) if self.probe is not None else set()
        hooks = stage_hooks(plan.collectives[index], shape)
        tally = _Busy(stage, plan.collectives[index])
        slot, busy, order = tally.slot, tally.seconds, tally.order
        # works (is forward, chunk) not run yet
        forwards, backwards = tally.works(stage)
        unseen = {(phase, c) for phase in (True, False) for c in range(len(forwards))}
        pp_seen = False
        # each route's link and the seconds of the send each chunk makes on it
        chunks = len(stage.forward)
        routes = [(route.link.name, route.seconds_by_chunk(chunks)) if route is not None else ("", ())
                  for route in (stage.send_forward, stage.send_backward)]  # fmt: skip
        route_links: list[LinkQueue | None] = [None, None]  # made on first use, as `link` does
        static, stored, transient = memory.static_bytes, memory.stored_bytes, memory.transient_bytes
        pending = 0.0  # a paired forward's deferred bytes (`TaskWork.deferred_bytes`)
        peak_stored, peak_total = memory.peak_stored_bytes, memory.peak_total_bytes
        gates = self._issue_at_start(hooks, slot)
        inside = {pos: (c, slot[c.category]) for pos, c in hooks.inside.items()}
        after = {pos: [(c, slot[c.category]) for c in cs] for pos, cs in hooks.after.items()}
        special = probe_at | gates.keys() | inside.keys() | after.keys()  # more to do than the usual
        ready_slot = 1  # the category of the wait for the stage's last-issued collective

        def write_back() -> None:
            outcome.busy_s = tally.as_dict()
            memory.stored_bytes, memory.transient_bytes = stored, transient
            memory.peak_stored_bytes, memory.peak_total_bytes = peak_stored, peak_total

        clock = env.now
        position = -1
        for position, (task, waits, forward, chunk, sends) in enumerate(shape.program):
            is_special = position in special
            if is_special and position in probe_at:
                write_back()
                self._take_probe(index, clock)
            start = clock
            for key in waits:
                arrived = arrival_of(key)
                if arrived is None:
                    waiting[key] = resume
                    yield  # resumed by the post, which has the arrival time
                    arrived = arrival_s[key]
                if arrived > start:
                    start = arrived
            if forward:
                duration_s, stored_bytes, deferred, parts = forwards[chunk]
            else:
                duration_s, held, freed, parts = backwards[chunk]
            if is_special and position in gates:
                start, duration_s = self._gated(index, gates[position], start, duration_s, tally)
            if forward:
                stored += stored_bytes  # MemoryTracker.store
                if deferred:
                    pending += deferred  # stored when the backward paired with it ends
                if stored > peak_stored:
                    peak_stored = stored
                total = static + stored + transient
                if total > peak_total:
                    peak_total = total
            else:
                transient += held  # MemoryTracker.hold (stored has not grown since the last store)
                total = static + stored + transient
                if total > peak_total:
                    peak_total = total
            if is_special and position in inside:
                now = yield from self._inside(index, task, inside[position], start, duration_s, tally, event)
                duration_s = now - start
            else:
                now = start + duration_s
            event.callbacks = armed
            heappush(queue, (now, NORMAL, next(event_ids), event))
            yield  # the task's end
            if not forward:
                transient -= held  # MemoryTracker.drop, then .release
                stored -= freed
                if pending:  # the paired forward's rest, as this backward has freed its own
                    stored += pending
                    pending = 0.0
                    if stored > peak_stored:
                        peak_stored = stored
                    total = static + stored + transient
                    if total > peak_total:
                        peak_total = total
                if stored < 0.0 and stored < -1e-6 * max(1.0, freed):
                    raise RuntimeError("memory tracker: freed more activation bytes than were stored")
            if unseen and (forward, chunk) in unseen:  # the work's first run: enter its parts
                unseen.discard((forward, chunk))
                for i, _ in parts:
                    order.setdefault(i)
            for i, seconds in parts:
                busy[i] += seconds
            if record:
                self.spans.append((index, str(task), "forward" if forward else "backward", start, duration_s))
            clock = now
            for route, key, producer in sends:
                # LinkQueue.reserve: FIFO on the sender's own link, issued now
                link = route_links[route]
                if link is None:
                    name = routes[route][0]
                    link = route_links[route] = links.get(name) or self.link(name)
                seconds = routes[route][1][producer.chunk]
                free_s = link.free_at_s
                end = (free_s if free_s > now else now) + seconds
                link.free_at_s = end
                link.busy_s += seconds
                if record:
                    link.spans.append((free_s if free_s > now else now, seconds, str(producer)))
                arrives = now + (end - now)  # as a timeout of the difference
                arrival_s[key] = arrives
                receiver = waiting_pop(key, None)
                if receiver is not None:
                    receiver(None)  # it starts the task it waited for, at its clock or the arrival
                if blocking and arrives > clock:
                    clock = arrives  # Megatron's p2p returns when the message is delivered
            if is_special and position in after:
                ready_slot = self._issue_after(outcome, after[position], start, duration_s, now)
            if clock > now:
                if not pp_seen:
                    order.setdefault(0)
                    pp_seen = True
                busy[0] += clock - now
                if record:
                    self.spans.append((index, f"send after {task}", PP_COMM.value, now, clock - now))
        if position + 1 in probe_at:
            write_back()
            self._take_probe(index, clock)
        outcome.pipeline_end_s = clock
        if clock > env.now:
            event.callbacks = armed
            schedule(event, clock)
            yield  # the collectives below are issued then (a link may be shared)
        clock = self._issue_tasks_done(index, hooks.tasks_done, clock, tally)
        if outcome.grads_ready_s > clock:
            tally.add(ready_slot, outcome.grads_ready_s - clock)  # not hidden by the tasks
        outcome.grads_ready_s = max(outcome.grads_ready_s, clock)
        write_back()
        outcome.finished = True
        yield  # parked for good: nothing resumes a finished stage (so its send never raises)

    def _issue_at_start(
        self, hooks: StageHooks, slot: dict[TimeCategory, int]
    ) -> dict[int, tuple[Collective, int, list[float]]]:
        """Issue the collectives of the iteration start, piece by piece in plan order; per
        position they gate: the collective, its category's slot, when each piece arrives."""
        gates: dict[int, tuple[Collective, int, list[float]]] = {}
        for collective, positions in hooks.start:
            arrivals = [
                self.reserve(collective.link, self.env.now, seconds, _piece_label(collective, j))
                for j, seconds in enumerate(collective.pieces_s)
            ]
            for gated_at in positions:
                gates[gated_at] = (collective, slot[collective.category], arrivals)
        return gates

    def _gated(
        self, index: int, gate: tuple[Collective, int, list[float]], start: float, busy_s: float, tally: _Busy
    ) -> tuple[float, float]:
        """A task gated by pieces issued at the start runs one equal slice per piece, each
        once its piece has arrived; returns its start and duration (waits included)."""
        collective, i, arrived_s = gate
        if arrived_s and arrived_s[0] > start:  # the first piece is exposed
            waited_from = start
            start = start + (arrived_s[0] - start)  # as a timeout of the difference
            tally.add(i, start - waited_from)
            if self.record:
                label, category = collective.wait_span, collective.category.value
                self.spans.append((index, label, category, waited_from, start - waited_from))
        duration_s = _gated_duration_s(start, busy_s, arrived_s)
        tally.add(i, duration_s - busy_s)
        return start, duration_s

    def _inside(
        self, index: int, task: Task, inside: tuple[Collective, int], start: float, busy_s: float,
        tally: _Busy, event: simpy.Event,
    ) -> Generator[None, object, float]:  # fmt: skip
        """Blocking pieces inside a task: its work in n + 1 equal slices, piece j issued when
        slice j ends (on its link, at that time: the stage's event is scheduled then), slice
        j + 1 once it has arrived; returns the task's end (without scheduling it)."""
        collective, i = inside
        slice_s = busy_s / (len(collective.pieces_s) + 1)
        armed = [self.resumers[index]]  # the stage resumes at each slice end
        at = start
        for j, seconds in enumerate(collective.pieces_s):
            at = at + slice_s
            event.callbacks = armed
            self._schedule(event, at)
            yield  # the slice's end
            end = self.reserve(collective.link, at, seconds, f"{_piece_label(collective, j)} {task}")
            if end > at:
                tally.add(i, end - at)
                if self.record:
                    self.spans.append((index, collective.wait_span, collective.category.value, at, end - at))
                at = end
        return at + slice_s

    def _issue_after(
        self, outcome: StageOutcome, issued: list[tuple[Collective, int]], start: float, duration_s: float,
        now: float,
    ) -> int:  # fmt: skip
        """Issue the collectives a task's end (AFTER) or progress (SPREAD) issues; the
        stage's end waits for the last one issued: returns its category's slot."""
        ready_slot = 1
        for collective, i in issued:
            ready_slot = i
            pieces = collective.pieces_s
            n = len(pieces)
            for j, seconds in enumerate(pieces):
                label = _piece_label(collective, j)
                if collective.issue is Issue.SPREAD:
                    # piece j once the task has done (j + 1)/n of its work (uniform progress;
                    # Megatron's backward hooks, start_grad_sync)
                    issue_s = now if j == n - 1 else start + duration_s * (j + 1) / n
                    outcome.grads_ready_s = self.reserve(collective.link, issue_s, seconds, label)
                else:
                    end = self.reserve(collective.link, now, seconds, label)
                    outcome.grads_ready_s = now + (end - now)  # as a timeout of the difference
        return ready_slot

    def _issue_tasks_done(
        self, index: int, collectives: tuple[Collective, ...], clock: float, tally: _Busy
    ) -> float:
        """Collectives issued when the stage's last task ends: the stage waits for each;
        returns its clock after them."""
        for collective in collectives:
            end = clock
            for j, seconds in enumerate(collective.pieces_s):
                end = self.reserve(collective.link, clock, seconds, _piece_label(collective, j))
            done = clock + (end - clock)  # as a timeout of the difference
            tally.add(tally.slot[collective.category], done - clock)
            if self.record:
                label, category = collective.wait_span, collective.category.value
                self.spans.append((index, label, category, clock, done - clock))
            clock = done
        return clock

    def _take_probe(self, index: int, now: float) -> None:
        """The stage's state: its clock, when its gradients are ready, and when each link
        its later work issues on is free (those of the iteration-start collectives last)."""
        outcome = self.outcomes[index]
        assert outcome.memory is not None
        links = [max(now, self.links[name].free_at_s) if name in self.links else now
                 for name in probed_links(self.plan, index)]  # fmt: skip
        times = (now, max(now, outcome.grads_ready_s), *links)
        self.probes[index].append(ProbeState(times, dict(outcome.busy_s), outcome.memory.stored_bytes))

    def run(self) -> EngineResult:
        stages = [self.stage_process(index, stage) for index, stage in enumerate(self.plan.stages)]
        # a stage is resumed by its generator's `send`: as its event's callback (SimPy passes
        # the event, which the stage ignores) or by the post it waits for
        self.resumers.extend(steps.send for steps in stages)
        for resume in self.resumers:
            resume(None)  # every stage starts at time 0, in order (as SimPy starts processes)
        self.env.run()
        self._check_all_ran()
        iteration_s = self._finish_iteration()
        return EngineResult(
            iteration_time_s=iteration_s,
            stages=self.outcomes,
            spans=tuple(self.spans),
            link_spans={name: link.spans for name, link in self.links.items()},
            num_events=next(self.env._eid),  # SimPy's running event id: events scheduled
            probes=tuple(tuple(states) for states in self.probes) if self.probe is not None else (),
            arrival_s=self.arrival_s if self.probe is not None else {},
        )

    def _check_all_ran(self) -> None:
        stuck = [i for i, outcome in enumerate(self.outcomes) if not outcome.finished]
        if stuck:
            raise RuntimeError(f"engine deadlock: stages {stuck} never finished their task lists")

    def _finish_iteration(self) -> float:
        """The collectives joined across stages once each is ready (the tied-embedding
        all-reduce of the first and last stages: it starts when every stage of its group
        link is ready), then the optimizer step of every stage after the slowest stage is
        ready (the gradient-norm all-reduce joins them), then what follows the step."""
        ready = [o.grads_ready_s for o in self.outcomes]
        groups: dict[str, dict[int, list[Collective]]] = {}
        for i, collectives in enumerate(self.plan.collectives):
            for collective in collectives:
                if collective.issue is Issue.READY:
                    groups.setdefault(collective.link.name, {}).setdefault(i, []).append(collective)
        for members in groups.values():
            start = max(ready[i] for i in members)
            for i, joined in members.items():
                at = start
                for collective in joined:
                    seconds = collective.total_s
                    self.outcomes[i].busy_s[collective.category] += seconds
                    if self.record:
                        self.spans.append((i, collective.wait_span, collective.category.value, at, seconds))
                    at = at + seconds
                ready[i] = at
        step_start = max(ready)
        ends = []
        for i, stage in enumerate(self.plan.stages):
            self.outcomes[i].busy_s[OPTIMIZER] += stage.optimizer_s
            if self.record:
                self.spans.append((i, "optimizer step", OPTIMIZER.value, step_start, stage.optimizer_s))
            end = stage.optimizer_s
            for collective in self.plan.collectives[i]:
                if collective.issue is Issue.STEP:
                    # after the step, exposed (the distributed optimizer's parameter
                    # all-gather without --overlap-param-gather)
                    seconds = collective.total_s
                    self.outcomes[i].busy_s[collective.category] += seconds
                    if self.record:
                        span = (i, collective.wait_span, collective.category.value, step_start + end, seconds)
                        self.spans.append(span)
                    end = end + seconds
            ends.append(end)
        return step_start + max(ends)


_SHAPES: dict[tuple[object, ...], tuple[tuple[object, ...], StageShape]] = {}
# The cache is emptied when it holds this many task positions (~400 bytes each): a sweep's
# distinct task orders fit many times over (issue 9's spec: ~40k), a run of huge plans
# cannot grow it without bound.
_MAX_CACHED_POSITIONS = 250_000
_cached_positions = 0


def stage_shape(plan: PipelinePlan, index: int) -> StageShape:
    """Stage `index`'s `StageShape`, cached by the identity of its (immutable) task order,
    send points, extra waits and unpaired positions, which the cache keeps alive so an
    identity is never reused while its entry exists. Plans built for the same (schedule, p,
    m, v) share those tuples (`simcluster.simulation.schedule_plan`), so a sweep builds each
    shape once."""
    stage = plan.stages[index]
    parts = (stage.tasks, stage.send_after, stage.extra_waits, stage.unpaired or None)  # (empty sets differ)
    key = (*map(id, parts), index, plan.num_stages, plan.num_chunks,
           stage.send_forward is None, stage.send_backward is None)  # fmt: skip
    hit = _SHAPES.get(key)
    if hit is not None:
        return hit[1]
    global _cached_positions
    shape = _build_shape(plan, index)
    if _cached_positions + len(stage.tasks) > _MAX_CACHED_POSITIONS:
        _SHAPES.clear()
        _cached_positions = 0
    _SHAPES[key] = (parts, shape)
    _cached_positions += len(stage.tasks)
    return shape


def _build_shape(plan: PipelinePlan, index: int) -> StageShape:
    """Keys use 0/1 for forward/backward: hashing ints is much cheaper than enums."""
    stage = plan.stages[index]
    p, last_vs = plan.num_stages, plan.num_stages * plan.num_chunks - 1
    inputs: list[Key | None] = []
    outputs: list[Send | None] = []
    for task in stage.tasks:
        vs = task.chunk * p + index
        mb = task.microbatch
        if task.phase is Phase.FORWARD:
            inputs.append((0, mb, vs - 1) if vs > 0 else None)
            route, key, sends_on = stage.send_forward, (0, mb, vs), vs < last_vs
            direction = 0
        else:
            inputs.append((1, mb, vs + 1) if vs < last_vs else None)
            route, key, sends_on = stage.send_backward, (1, mb, vs), vs > 0
            direction = 1
        outputs.append((direction, key, task) if sends_on and route is not None else None)
    n = len(stage.tasks)
    waits: list[tuple[Key, ...]] = []
    for position in range(n):
        keys = [inputs[position]]
        if stage.extra_waits is not None:
            keys += [inputs[j] for j in stage.extra_waits[position]]
        waits.append(tuple(k for k in keys if k is not None))
    sends: list[list[Send]] = [[] for _ in range(n)]
    for position, output in enumerate(outputs):
        if output is not None:
            after = stage.send_after[position] if stage.send_after is not None else position
            sends[after].append(output)
    sent = tuple(map(tuple, sends))
    # an unpaired task runs its chunk's unpaired work, at index chunks + chunk (`_Busy.works`)
    chunks, unpaired = len(stage.forward), stage.unpaired
    program = tuple(
        (task, keys, task.phase is Phase.FORWARD, task.chunk + (chunks if position in unpaired else 0), out)
        for position, (task, keys, out) in enumerate(zip(stage.tasks, waits, sent, strict=True))
    )
    runs: dict[tuple[bool, int], list[int]] = {}
    for position, task in enumerate(stage.tasks):
        runs.setdefault((task.phase is Phase.FORWARD, task.chunk), []).append(position)
    return StageShape(
        tuple(waits),
        sent,
        frozenset(last_backward_positions(stage)),
        frozenset(first_forward_positions(stage)),
        {key: tuple(positions) for key, positions in runs.items()},
        program,
    )


@dataclass(frozen=True, slots=True)
class StageHooks:
    """Where a stage's collectives enter its life, by kind of issue (`plan.Issue`): those
    issued at the iteration start with the positions they gate; per position, the one
    running inside the task (with its category's slot) and those its end issues; those
    issued when the last task ends."""

    start: tuple[tuple[Collective, tuple[int, ...]], ...]
    inside: dict[int, Collective]
    after: dict[int, list[Collective]]
    tasks_done: tuple[Collective, ...]


def task_positions(ref: TaskRef, shape: StageShape) -> tuple[int, ...]:
    """The positions of the stage's tasks `ref` names."""
    run = shape.runs.get((ref.phase is Phase.FORWARD, ref.chunk), ())
    if not run or ref.occurrence is Occurrence.EVERY:
        return run
    return (run[0],) if ref.occurrence is Occurrence.FIRST else (run[-1],)


def stage_hooks(collectives: tuple[Collective, ...], shape: StageShape) -> StageHooks:
    """`StageHooks` of a stage's collectives. A task position takes at most one collective
    that gates it or runs inside it."""
    start: list[tuple[Collective, tuple[int, ...]]] = []
    inside: dict[int, Collective] = {}
    after: dict[int, list[Collective]] = {}
    gated: set[int] = set()
    for collective in collectives:
        issue = collective.issue
        if issue is Issue.TASKS_DONE or issue is Issue.READY or issue is Issue.STEP:
            continue
        assert collective.task is not None  # Collective checks it
        positions = task_positions(collective.task, shape)
        if issue is Issue.START or issue is Issue.INSIDE:
            taken = gated.intersection(positions)
            if taken:
                raise ValueError(
                    f"collective {collective.label!r}: task position {min(taken)} already runs or "
                    "waits for another collective (at most one per task)"
                )
            gated.update(positions)
            if issue is Issue.START:
                start.append((collective, positions))
            else:
                inside.update((at, collective) for at in positions)
        else:
            for at in positions:
                after.setdefault(at, []).append(collective)
    tasks_done = tuple(c for c in collectives if c.issue is Issue.TASKS_DONE)
    return StageHooks(tuple(start), inside, after, tasks_done)


def probed_links(plan: PipelinePlan, index: int) -> list[str]:
    """The links whose free times are part of stage `index`'s probed state: those its
    pipeline messages and task-time collectives use (sorted by name), then those of its
    iteration-start collectives (busy from the start), in plan order."""
    stage = plan.stages[index]
    used = {route.link.name for route in (stage.send_forward, stage.send_backward) if route is not None}
    at_start: list[str] = []
    for collective in plan.collectives[index]:
        if collective.issue is Issue.START:
            if collective.link.name not in at_start:
                at_start.append(collective.link.name)
        elif collective.issue is not Issue.READY and collective.issue is not Issue.STEP:
            used.add(collective.link.name)
    return sorted(used) + [name for name in at_start if name not in used]


def _piece_label(collective: Collective, piece: int) -> str:
    return f"{collective.label}.{piece}" if collective.numbered else collective.label


def wiring(plan: PipelinePlan, index: int) -> Wiring:
    """Per task position: the message keys to await before it, the sends after it."""
    return stage_shape(plan, index).wiring


def last_backward_positions(stage: StagePlan) -> set[int]:
    last: dict[int, int] = {}
    for position, task in enumerate(stage.tasks):
        if task.phase is Phase.BACKWARD:
            last[task.chunk] = position
    return set(last.values())


def first_forward_positions(stage: StagePlan) -> set[int]:
    first: dict[int, int] = {}
    for position, task in enumerate(stage.tasks):
        if task.phase is Phase.FORWARD and task.chunk not in first:
            first[task.chunk] = position
    return set(first.values())


def _gated_duration_s(start_s: float, busy_s: float, arrived_s: list[float]) -> float:
    """A forward split into one equal slice per parameter bucket: slice j starts when the
    previous slice ends and bucket j has arrived (the forward pre-hook waits for it)."""
    if not arrived_s:
        return busy_s
    end_s = start_s
    for arrival_s in arrived_s:
        end_s = max(end_s, arrival_s) + busy_s / len(arrived_s)
    return end_s - start_s


def simulate(
    plan: PipelinePlan,
    record: bool = False,
    probe: tuple[tuple[int, ...], ...] | None = None,
    shapes: tuple[StageShape, ...] | None = None,
) -> EngineResult:
    """Run one training iteration of `plan`. `record` keeps spans for a trace. `probe` (task
    positions per stage) records each stage's state when it reaches those positions, and
    every message's arrival time (simcluster.periodicity certifies a steady state with
    them); `shapes` is `stage_shape(plan, stage)` of every stage when the caller has them."""
    with simulation_gc():
        return _Run(plan, record, probe, shapes).run()
