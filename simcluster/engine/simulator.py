"""The SimPy engine: one process per pipeline stage runs its task list.

Life cycle of a task on stage r (virtual stage vs = chunk·p + r):
  1. wait for its input: a forward for the activation from vs − 1, a backward for the
     gradient from vs + 1 (the last virtual stage's backward follows its own forward);
  2. hold the stage for the task's busy time (memory: a forward stores its activations at
     start, a backward holds its transient bytes while it runs and frees at its end);
  3. send its output to the neighbour on the stage's link (FIFO). Megatron's p2p is
     synchronous, so by default the sender waits until the message is delivered. A plan
     may defer a send and add waits (`send_after`, `extra_waits`) to mirror Megatron's
     combined p2p calls (see `simcluster.schedule.comm`).
After its last task a stage reduces its gradients over data parallelism (on its link,
after the last backward, or overlapped with the backwards of the last microbatch: in
buckets issued as the chunk's last backward makes their gradients final, where the plan
gives buckets), the first and last stages all-reduce the tied embedding gradient, and every
stage steps its optimizer after the slowest stage is ready (the gradient-norm all-reduce
joins them). With the distributed optimizer the updated parameters are all-gathered: after
the step, exposed, or (overlapped) from the iteration's start, bucket by bucket, gating each
chunk's first forward (Megatron's forward pre-hooks, `finish_param_sync`); the iteration
seen is the steady state, where these are the gathers of the previous step's update.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import simpy

from simcluster.engine.gc_tuning import simulation_gc
from simcluster.engine.links import Link
from simcluster.engine.memory import MemoryTracker
from simcluster.engine.plan import PipelinePlan, StagePlan, TimeCategory, Transfer
from simcluster.schedule.tasks import Phase

PP_COMM, DP_COMM, OPTIMIZER = TimeCategory.PP_COMM, TimeCategory.DP_COMM, TimeCategory.OPTIMIZER

Span = tuple[int, str, str, float, float]  # stage, name, trace category, start_s, duration_s
Key = tuple[int, int, int]  # a message: (0 forward / 1 backward, microbatch, sending virtual stage)
Send = tuple[Transfer, Key, object]  # route, message key, the task that produced it


@dataclass(slots=True)
class StageOutcome:
    busy_s: dict[TimeCategory, float] = field(default_factory=lambda: defaultdict(float))
    pipeline_end_s: float = 0.0
    grads_ready_s: float = 0.0
    finished: bool = False
    memory: MemoryTracker | None = None


@dataclass(frozen=True, slots=True)
class EngineResult:
    iteration_time_s: float
    stages: tuple[StageOutcome, ...]
    spans: tuple[Span, ...]
    link_spans: dict[str, list[tuple[float, float, str]]]
    num_events: int

    def bubble_fraction(self) -> float:
        """Idle over busy stage-time until the pipeline's last backward ends (textbook
        (p − 1)/(m·v) for uniform tasks and free communication)."""
        span = max(stage.pipeline_end_s for stage in self.stages)
        work = sum(
            sum(v for k, v in stage.busy_s.items() if k not in (DP_COMM, OPTIMIZER)) for stage in self.stages
        )
        return max(0.0, (span * len(self.stages) - work) / work) if work > 0 else 0.0


class _Mailbox:
    """Messages between stages, keyed (phase, microbatch, sending virtual stage)."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.events: dict[Key, simpy.Event] = {}

    def deliver(self, key: Key, delay_s: float) -> simpy.Event:
        arrival = self.env.timeout(delay_s)
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
    def __init__(self, plan: PipelinePlan, record: bool) -> None:
        self.plan = plan
        self.record = record
        self.env = simpy.Environment()
        self.mailbox = _Mailbox(self.env)
        self.links: dict[str, Link] = {}
        self.spans: list[Span] = []
        self.outcomes = tuple(StageOutcome(memory=MemoryTracker(stage.static_bytes)) for stage in plan.stages)

    def link(self, name: str) -> Link:
        if name not in self.links:
            self.links[name] = Link(name, record=self.record)
        return self.links[name]

    def transfer(self, transfer: Transfer, label: object) -> float:
        """Issue a transfer now; return seconds until it is delivered."""
        now = self.env.now
        link = self.links.get(transfer.link) or self.link(transfer.link)
        _, end = link.reserve(now, transfer.seconds, str(label) if self.record else "")
        return end - now

    def transfer_at(self, transfer: Transfer, issue_s: float, label: object) -> float:
        """Issue a transfer at `issue_s` (not later than now, and after everything already
        issued on its link); return when it is delivered."""
        link = self.links.get(transfer.link) or self.link(transfer.link)
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

    def _wiring(self, index: int, stage: StagePlan) -> tuple[list[tuple[Key, ...]], list[list[Send]]]:
        """Per task position: the message keys to await before it, the sends after it.
        Keys use 0/1 for forward/backward: hashing ints is much cheaper than enums."""
        p, last_vs = self.plan.num_stages, self.plan.num_stages * self.plan.num_chunks - 1
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

    def stage_process(self, index: int, stage: StagePlan) -> Generator[simpy.Event, Any, None]:
        env, plan, outcome = self.env, self.plan, self.outcomes[index]
        assert outcome.memory is not None
        memory, busy, mailbox = outcome.memory, outcome.busy_s, self.mailbox
        waits, sends = self._wiring(index, stage)
        last_backward_of_chunk = _last_backward_positions(stage)
        gathered = self._issue_param_gather(stage)
        first_forward_of_chunk = _first_forward_positions(stage) if gathered is not None else set()
        for position, task in enumerate(stage.tasks):
            for key in waits[position]:
                yield mailbox.receive(key)
            forward = task.phase is Phase.FORWARD
            work = stage.forward[task.chunk] if forward else stage.backward[task.chunk]
            duration_s = work.busy_s
            if gathered is not None and position in first_forward_of_chunk:
                arrived = gathered[task.chunk]
                if arrived and arrived[0] > env.now:  # the first bucket is exposed
                    waited_from = env.now
                    yield env.timeout(arrived[0] - env.now)
                    waited_s = env.now - waited_from
                    busy[DP_COMM] += waited_s
                    if self.record:
                        self.spans.append((index, "param gather wait", DP_COMM.value, waited_from, waited_s))
                duration_s = _gated_duration_s(env.now, work.busy_s, arrived)
                busy[DP_COMM] += duration_s - work.busy_s
            start = env.now
            if forward:
                memory.store(work.stored_bytes)
            else:
                memory.hold(work.transient_bytes)
            yield env.timeout(duration_s)
            if not forward:
                memory.drop(work.transient_bytes)
                memory.release(stage.forward[task.chunk].stored_bytes)
            for category, seconds in work.parts:
                busy[category] += seconds
            if self.record:
                self.spans.append(
                    (index, str(task), "forward" if forward else "backward", start, duration_s)
                )
            arrivals = [
                mailbox.deliver(key, self.transfer(route, label)) for route, key, label in sends[position]
            ]
            if plan.overlap_grad_reduce and position in last_backward_of_chunk and stage.grad_reduce:
                if stage.grad_buckets is not None:
                    # each bucket as its gradients become final (uniform progress through
                    # the backward; Megatron's backward hooks, start_grad_sync)
                    buckets, link = stage.grad_buckets[task.chunk], stage.grad_reduce.link
                    n = len(buckets)
                    for j, seconds in enumerate(buckets):
                        issue_s = env.now if j == n - 1 else start + duration_s * (j + 1) / n
                        label = f"dp grads chunk {task.chunk}.{j}"
                        outcome.grads_ready_s = self.transfer_at(Transfer(link, seconds), issue_s, label)
                else:
                    # the chunk's gradients are final: reduce them while later work runs
                    share = Transfer(stage.grad_reduce.link, stage.grad_reduce.seconds / plan.num_chunks)
                    outcome.grads_ready_s = env.now + self.transfer(share, f"dp grads chunk {task.chunk}")
            if plan.blocking_p2p and arrivals:
                sent_at = env.now
                yield from arrivals
                if env.now > sent_at:
                    busy[PP_COMM] += env.now - sent_at
                    if self.record:
                        blocked_s = env.now - sent_at
                        self.spans.append((index, f"send after {task}", PP_COMM.value, sent_at, blocked_s))
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


def _last_backward_positions(stage: StagePlan) -> set[int]:
    last: dict[int, int] = {}
    for position, task in enumerate(stage.tasks):
        if task.phase is Phase.BACKWARD:
            last[task.chunk] = position
    return set(last.values())


def _first_forward_positions(stage: StagePlan) -> set[int]:
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


def simulate(plan: PipelinePlan, record: bool = False) -> EngineResult:
    """Run one training iteration of `plan`. `record` keeps spans for a trace."""
    with simulation_gc():
        return _Run(plan, record).run()
