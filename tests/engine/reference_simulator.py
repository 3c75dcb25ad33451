"""The engine as it was before issue 9's speed-up (simcluster/engine/simulator.py at
84be4b8), kept only as the reference test_engine_reference.py compares the engine with:
one SimPy process per stage yielding a timeout per task, a timeout per message (with a
callback that wakes a waiting receiver) and a wait on every blocking send's delivery.
Not used by simcluster itself. Its only change since: plans name links with typed `Link`s
(issue 18), which it reads by name (`str(link)`), as it read the strings before."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from simcluster.engine.gc_tuning import simulation_gc
from simcluster.engine.links import LinkQueue as Link  # the queue, renamed since
from simcluster.engine.memory import MemoryTracker
from simcluster.engine.plan import PipelinePlan, StagePlan, TaskWork, TimeCategory, Transfer
from simcluster.engine.simulator import (  # unchanged by the rewrite: shared, not copied
    EngineResult,
    ProbeState,
    StageOutcome,
    _gated_duration_s,
    first_forward_positions,
    last_backward_positions,
)
from simcluster.schedule.tasks import Phase, Task

PP_COMM, DP_COMM, OPTIMIZER = TimeCategory.PP_COMM, TimeCategory.DP_COMM, TimeCategory.OPTIMIZER

Span = tuple[int, str, str, float, float]  # stage, name, trace category, start_s, duration_s
Key = tuple[int, int, int]  # a message: (0 forward / 1 backward, microbatch, sending virtual stage)
Send = tuple[Transfer, Key, object]  # route, message key, the task that produced it
# a task position: task, keys awaited, is forward, work, bytes its end frees, sends
# (link, seconds, key, label), whether it finishes a chunk's gradients (overlapped reduction),
# whether it is a chunk's first forward (gated by the overlapped parameter all-gather)
_Step = tuple[Task, tuple[Key, ...], bool, TaskWork, float, list[tuple[str, float, Key, object]], bool, bool]
Wiring = tuple[list[tuple[Key, ...]], list[list[Send]]]  # per position: keys awaited, sends after


class _Mailbox:
    """Messages between stages, keyed (phase, microbatch, sending virtual stage)."""

    def __init__(self, env: simpy.Environment, keep_arrivals: bool = False) -> None:
        self.env = env
        self.events: dict[Key, simpy.Event] = {}
        self.arrival_s: dict[Key, float] | None = {} if keep_arrivals else None

    def deliver(self, key: Key, delay_s: float) -> simpy.Event:
        arrival = self.env.timeout(delay_s)
        if self.arrival_s is not None:
            self.arrival_s[key] = self.env.now + delay_s  # the sum SimPy schedules it at
        waiting = self.events.get(key)
        if waiting is None:
            self.events[key] = arrival
        else:

            def wake(_event: simpy.Event) -> None:
                waiting.succeed()

            arrival.callbacks.append(wake)
        return arrival

    def receive(self, key: Key) -> simpy.Event:
        event = self.events.get(key)
        if event is None:
            event = self.events[key] = self.env.event()
        return event


class _Run:
    def __init__(
        self,
        plan: PipelinePlan,
        record: bool,
        probe: tuple[tuple[int, ...], ...] | None = None,
        wires: tuple[Wiring, ...] | None = None,
    ) -> None:
        self.plan = plan
        self.wires = wires
        self.record = record
        self.probe = probe
        self.probes: list[list[ProbeState]] = [[] for _ in plan.stages]
        self.env = simpy.Environment()
        self.mailbox = _Mailbox(self.env, keep_arrivals=probe is not None)
        self.links: dict[str, Link] = {}
        self.spans: list[Span] = []
        self.outcomes = tuple(StageOutcome(memory=MemoryTracker(stage.static_bytes)) for stage in plan.stages)

    def link(self, name: str) -> Link:
        if name not in self.links:
            self.links[name] = Link(name, record=self.record)
        return self.links[name]

    def transfer(self, transfer: Transfer, label: object) -> float:
        """Issue a transfer now; return seconds until it is delivered."""
        now, name = self.env.now, str(transfer.link)
        link = self.links.get(name) or self.link(name)
        _, end = link.reserve(now, transfer.seconds, str(label) if self.record else "")
        return end - now

    def transfer_at(self, transfer: Transfer, issue_s: float, label: object) -> float:
        """Issue a transfer at `issue_s` (not later than now, and after everything already
        issued on its link); return when it is delivered."""
        name = str(transfer.link)
        link = self.links.get(name) or self.link(name)
        _, end = link.reserve(issue_s, transfer.seconds, str(label) if self.record else "")
        return end

    def _issue_param_gather(self, stage: StagePlan) -> list[list[float]] | None:
        """Overlapped parameter all-gather: every bucket issued at the iteration start, in
        forward order; returns when each bucket of each chunk has arrived."""
        gather = stage.param_gather
        if gather is None or not gather.overlapped:
            return None
        return [
            [
                self.transfer_at(Transfer(gather.link, seconds), self.env.now, f"param gather chunk {c}.{j}")
                for j, seconds in enumerate(chunk)
            ]
            for c, chunk in enumerate(gather.buckets)
        ]

    def _steps(self, index: int, stage: StagePlan, gathered: bool) -> list[_Step]:
        """Everything a task position needs, looked up once before the run."""
        waits, sends = self.wires[index] if self.wires is not None else wiring(self.plan, index)
        overlap = self.plan.overlap_grad_reduce and stage.grad_reduce is not None
        last_backward_of_chunk = last_backward_positions(stage) if overlap else set()
        first_forward_of_chunk = first_forward_positions(stage) if gathered else set()
        steps = []
        for position, task in enumerate(stage.tasks):
            forward = task.phase is Phase.FORWARD
            work = stage.forward[task.chunk] if forward else stage.backward[task.chunk]
            freed = 0.0 if forward else stage.forward[task.chunk].stored_bytes
            out = [
                (str(route.link), route.seconds_by_chunk(len(stage.forward))[label.chunk], key, label)
                for route, key, label in sends[position]
            ]
            reduce_chunk = position in last_backward_of_chunk
            gate = position in first_forward_of_chunk
            steps.append((task, waits[position], forward, work, freed, out, reduce_chunk, gate))
        return steps

    def stage_process(self, index: int, stage: StagePlan) -> Generator[simpy.Event, Any, None]:
        env, plan, outcome, record = self.env, self.plan, self.outcomes[index], self.record
        assert outcome.memory is not None
        memory, busy, mailbox = outcome.memory, outcome.busy_s, self.mailbox
        store, hold, drop, release = memory.store, memory.hold, memory.drop, memory.release
        receive, deliver, timeout = mailbox.receive, mailbox.deliver, env.timeout
        blocking = plan.blocking_p2p
        probe_at = set(self.probe[index]) if self.probe is not None else set()
        links = self.links
        gathered = self._issue_param_gather(stage)
        steps = self._steps(index, stage, gathered is not None)
        for position, (task, waits, forward, work, freed, out, reduce_chunk, gate) in enumerate(steps):
            if position in probe_at:
                self._take_probe(index, stage)
            for key in waits:
                yield receive(key)
            duration_s = work.busy_s
            if gate:
                # a chunk's first forward runs its bucket-sized slices as the buckets arrive
                assert gathered is not None
                arrived = gathered[task.chunk]
                if arrived and arrived[0] > env._now:  # the first bucket is exposed
                    waited_from = env._now
                    yield timeout(arrived[0] - env._now)
                    waited_s = env._now - waited_from
                    busy[DP_COMM] += waited_s
                    if record:
                        self.spans.append((index, "param gather wait", DP_COMM.value, waited_from, waited_s))
                duration_s = _gated_duration_s(env._now, work.busy_s, arrived)
                busy[DP_COMM] += duration_s - work.busy_s
            start = env._now
            if forward:
                store(work.stored_bytes)
            else:
                hold(work.transient_bytes)
            yield timeout(duration_s)
            if not forward:
                drop(work.transient_bytes)
                release(freed)
            for category, seconds in work.parts:
                busy[category] += seconds
            now = env._now
            if record:
                kind = "forward" if forward else "backward"
                self.spans.append((index, str(task), kind, start, duration_s))
            arrivals = []
            for name, seconds, key, label in out:
                # FIFO on the sender's own link, issued now (links are made on first use)
                link = links.get(name) or self.link(name)
                _, end = link.reserve(now, seconds, str(label) if record else "")
                arrivals.append(deliver(key, end - now))
            if reduce_chunk:
                assert stage.grad_reduce is not None
                if stage.grad_buckets is not None:
                    # each bucket as its gradients become final (uniform progress through
                    # the backward; Megatron's backward hooks, start_grad_sync)
                    buckets, name = stage.grad_buckets[task.chunk], stage.grad_reduce.link
                    n = len(buckets)
                    for j, seconds in enumerate(buckets):
                        issue_s = now if j == n - 1 else start + duration_s * (j + 1) / n
                        label = f"dp grads chunk {task.chunk}.{j}"
                        outcome.grads_ready_s = self.transfer_at(Transfer(name, seconds), issue_s, label)
                else:
                    # the chunk's gradients are final: reduce them while later work runs
                    share = Transfer(stage.grad_reduce.link, stage.grad_reduce.seconds / plan.num_chunks)
                    outcome.grads_ready_s = now + self.transfer(share, f"dp grads chunk {task.chunk}")
            if blocking and arrivals:
                yield from arrivals
                if env._now > now:
                    busy[PP_COMM] += env._now - now
                    if record:
                        blocked_s = env._now - now
                        self.spans.append((index, f"send after {task}", PP_COMM.value, now, blocked_s))
        if len(stage.tasks) in probe_at:
            self._take_probe(index, stage)
        outcome.pipeline_end_s = env.now
        if not plan.overlap_grad_reduce and stage.grad_reduce is not None:
            start = env.now
            yield env.timeout(self.transfer(stage.grad_reduce, "dp grads"))
            busy[DP_COMM] += env.now - start
            if self.record:
                self.spans.append((index, "dp all-reduce", DP_COMM.value, start, env.now - start))
        if plan.overlap_grad_reduce and outcome.grads_ready_s > env.now:
            busy[DP_COMM] += outcome.grads_ready_s - env.now  # the part not hidden by backwards
        outcome.grads_ready_s = max(outcome.grads_ready_s, env.now)
        outcome.finished = True

    def _take_probe(self, index: int, stage: StagePlan) -> None:
        now, outcome = self.env.now, self.outcomes[index]
        assert outcome.memory is not None
        routes = (stage.send_forward, stage.send_backward, stage.grad_reduce)
        names = sorted({str(route.link) for route in routes if route is not None})
        if stage.param_gather is not None and stage.param_gather.overlapped:
            names.append(str(stage.param_gather.link))  # its own "dp:" link, busy from the start
        links = [max(now, self.links[name].free_at_s) if name in self.links else now for name in names]
        times = (now, max(now, outcome.grads_ready_s), *links)
        self.probes[index].append(ProbeState(times, dict(outcome.busy_s), outcome.memory.stored_bytes))

    def run(self) -> EngineResult:
        for index, stage in enumerate(self.plan.stages):
            self.env.process(self.stage_process(index, stage))
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
            arrival_s=self.mailbox.arrival_s or {},
        )

    def _check_all_ran(self) -> None:
        stuck = [i for i, outcome in enumerate(self.outcomes) if not outcome.finished]
        if stuck:
            raise RuntimeError(f"engine deadlock: stages {stuck} never finished their task lists")

    def _finish_iteration(self) -> float:
        """Tied-embedding all-reduce between first and last stage, then the optimizer step
        of every stage after the slowest stage is ready (gradient-norm all-reduce)."""
        ready = [o.grads_ready_s for o in self.outcomes]
        tied = [i for i, s in enumerate(self.plan.stages) if s.tied_grad_reduce is not None]
        if tied:
            start = max(ready[i] for i in tied)
            for i in tied:
                seconds = self.plan.stages[i].tied_grad_reduce.seconds  # type: ignore[union-attr]
                self.outcomes[i].busy_s[DP_COMM] += seconds
                ready[i] = start + seconds
                if self.record:
                    self.spans.append((i, "embedding all-reduce", DP_COMM.value, start, seconds))
        step_start = max(ready)
        ends = []
        for i, stage in enumerate(self.plan.stages):
            self.outcomes[i].busy_s[OPTIMIZER] += stage.optimizer_s
            if self.record:
                self.spans.append((i, "optimizer step", OPTIMIZER.value, step_start, stage.optimizer_s))
            gather = stage.param_gather
            if gather is not None and not gather.overlapped:
                # distributed optimizer without --overlap-param-gather: the updated
                # parameters are all-gathered after the step, exposed
                self.outcomes[i].busy_s[DP_COMM] += gather.total_s
                if self.record:
                    self.spans.append(
                        (i, "param all-gather", DP_COMM.value, step_start + stage.optimizer_s, gather.total_s)
                    )
                ends.append(stage.optimizer_s + gather.total_s)
            else:
                ends.append(stage.optimizer_s)
        return step_start + max(ends)


def wiring(plan: PipelinePlan, index: int) -> Wiring:
    """Per task position: the message keys to await before it, the sends after it.
    Keys use 0/1 for forward/backward: hashing ints is much cheaper than enums."""
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
        else:
            inputs.append((1, mb, vs + 1) if vs < last_vs else None)
            route, key, sends_on = stage.send_backward, (1, mb, vs), vs > 0
        outputs.append((route, key, task) if sends_on and route is not None else None)
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
    return waits, sends


def simulate(
    plan: PipelinePlan,
    record: bool = False,
    probe: tuple[tuple[int, ...], ...] | None = None,
    wires: tuple[Wiring, ...] | None = None,
) -> EngineResult:
    """Run one training iteration of `plan`. `record` keeps spans for a trace. `probe` (task
    positions per stage) records each stage's state when it reaches those positions, and
    every message's arrival time (simcluster.periodicity certifies a steady state with
    them); `wires` is `wiring(plan, stage)` of every stage when the caller has it already."""
    with simulation_gc():
        return _Run(plan, record, probe, wires).run()
