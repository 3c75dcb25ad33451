"""What the engine runs: tasks with durations, messages and collectives on typed links,
memory deltas.

The engine knows nothing of transformers. A `PipelinePlan` says, for every stage, the order
of its tasks (from `simcluster.schedule`), how long each (chunk, phase) keeps the stage
busy and under which labels, the bytes a forward allocates and its backward frees, the
links its pipeline messages travel on, and its collectives: each a `Collective` on a typed
`Link`, issued at a point of the stage's life (`Issue`) and gating what waits for it.
Megatron's data-parallel traffic (gradient reduction, in buckets or not, the tied-embedding
all-reduce, the distributed optimizer's parameter all-gather) is declared on a `StagePlan`
as before and compiled into such collectives (`data_parallel_collectives`); anything else
(an MoE layer's all-to-all) is added as one more `Collective`, with no engine code of its
own. docs/architecture_engine.md describes the structure.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from simcluster.engine.links import Link, LinkScope, as_link
from simcluster.schedule.tasks import Phase, Task


class TimeCategory(str, enum.Enum):
    """Where a stage's time goes: the labels of a task's busy parts in the plan, the engine's
    busy time, and the result's time breakdown (in this order; the keys of `run --json`'s
    `time_breakdown_s`, a public contract). IDLE is what is left of the iteration."""

    COMPUTE = "compute"
    RECOMPUTE = "recompute"
    TP_COMM = "tp_comm"
    EP_COMM = "ep_comm"  # a MoE layer's token-dispatcher collectives (all-to-all, all-gather, DeepEP)
    PP_COMM = "pp_comm"
    DP_COMM = "dp_comm"
    OPTIMIZER = "optimizer"
    HOST_WAIT = "host_wait"  # the GPU waiting for the host to issue a task's kernels
    IDLE = "idle"


@dataclass(frozen=True, slots=True)
class TaskWork:
    """One (chunk, phase) on a stage. `parts` label the busy time (they sum to busy_s);
    a forward allocates `stored_bytes` when it starts and its backward frees them when it
    ends; `transient_bytes` are held only while the task runs (recomputed activations).
    A forward paired with the backward after it (the EP overlap) allocates `stored_bytes`
    at its start and `deferred_bytes` more when that backward ends, which frees its own
    chunk's: the two run layer by layer together, the backward freeing as the forward
    allocates (`StagePlan.unpaired`)."""

    busy_s: float
    parts: tuple[tuple[TimeCategory, float], ...]
    stored_bytes: float = 0.0
    transient_bytes: float = 0.0
    deferred_bytes: float = 0.0


@dataclass(frozen=True, slots=True, init=False)
class Transfer:
    """A message or collective occupying `link` for `seconds` (FIFO on the link). `link`
    may be given in the earlier string spelling (`"nvlink:3"`): it is parsed into a `Link`.
    A pipeline send whose chunks send messages of different sizes (standalone MTP) gives
    each chunk's seconds (`chunk_seconds`; `seconds` is then the least of them)."""

    link: Link
    seconds: float
    chunk_seconds: tuple[float, ...] | None

    def __init__(
        self, link: Link | str, seconds: float, chunk_seconds: tuple[float, ...] | None = None
    ) -> None:
        object.__setattr__(self, "link", as_link(link))
        object.__setattr__(self, "seconds", seconds)
        object.__setattr__(self, "chunk_seconds", chunk_seconds)

    def seconds_by_chunk(self, num_chunks: int) -> tuple[float, ...]:
        """The seconds of the send each chunk makes."""
        return self.chunk_seconds or (self.seconds,) * num_chunks


@dataclass(frozen=True, slots=True, init=False)
class ParamGather:
    """The distributed optimizer's all-gather of updated parameters, per chunk in buckets
    (seconds of each bucket's all-gather on `link`, in the order the forward needs them).
    `overlapped` (Megatron `--overlap-param-gather`): every stage issues the buckets when
    the iteration starts (`align_param_gather`), and a chunk's first forward runs its
    bucket-sized slices only as their buckets arrive. Otherwise the all-gather follows the
    optimizer step, exposed."""

    link: Link  # may be given as the earlier string spelling (`"dp:3"`), parsed
    buckets: tuple[tuple[float, ...], ...]  # per chunk
    overlapped: bool

    def __init__(self, link: Link | str, buckets: tuple[tuple[float, ...], ...], overlapped: bool) -> None:
        object.__setattr__(self, "link", as_link(link))
        object.__setattr__(self, "buckets", buckets)
        object.__setattr__(self, "overlapped", overlapped)

    @property
    def total_s(self) -> float:
        return sum(sum(chunk) for chunk in self.buckets)


class Issue(str, enum.Enum):
    """When a collective's pieces are issued on its link, and what waits for them."""

    START = "start"  # when the iteration starts; they gate `task` (its slices wait for them)
    INSIDE = "inside"  # inside each `task`, blocking: its work runs in n + 1 equal slices,
    #   piece j is issued when slice j ends and slice j + 1 starts when it has arrived
    SPREAD = "spread"  # through each `task`, evenly: piece j at start + duration·(j + 1)/n
    #   (the last at its end); the stage's end waits for them
    AFTER = "after"  # when each `task` ends; the stage's end waits for them
    TASKS_DONE = "tasks_done"  # when the stage's last task ends; the stage waits for them
    READY = "ready"  # when the stage's end has passed every wait above: joined by the
    #   stages holding the same group link (it starts when all are ready); the step waits
    STEP = "step"  # after the optimizer step, exposed: the iteration ends after them


class Occurrence(str, enum.Enum):
    FIRST = "first"
    LAST = "last"
    EVERY = "every"


@dataclass(frozen=True, slots=True)
class TaskRef:
    """The stage's tasks a collective is issued in or gates: the first, the last or every
    task of `phase` on `chunk` in the stage's task order."""

    phase: Phase
    chunk: int
    occurrence: Occurrence = Occurrence.EVERY


@dataclass(frozen=True, slots=True)
class Collective:
    """A collective (or any transfer) a stage issues on `link`: `pieces_s` are the seconds
    of its pieces (buckets), issued in order as `issue` says, FIFO on the link with
    everything else on it. Time a stage waits for them counts as `category`. `label` names
    the pieces on the link's trace row (piece j as `label.j` when `numbered`), `span` the
    stage's trace span for its wait (default `label wait`; where the engine draws one)."""

    label: str
    link: Link
    pieces_s: tuple[float, ...]
    category: TimeCategory
    issue: Issue
    task: TaskRef | None = None  # for START, INSIDE, SPREAD and AFTER
    numbered: bool = False
    span: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.link, Link):
            object.__setattr__(self, "link", as_link(self.link))
        needs_task = self.issue in (Issue.START, Issue.INSIDE, Issue.SPREAD, Issue.AFTER)
        if needs_task != (self.task is not None):
            verb = "needs" if needs_task else "takes no"
            raise ValueError(f"collective {self.label!r}: issue {self.issue.value} {verb} task")
        if self.issue is Issue.READY and self.link.scope is not LinkScope.GROUP:
            raise ValueError(f"collective {self.label!r}: issue ready joins a group: needs a group link")
        if any(not seconds >= 0.0 for seconds in self.pieces_s):
            raise ValueError(f"collective {self.label!r}: pieces_s must be >= 0 seconds, got {self.pieces_s}")

    @property
    def total_s(self) -> float:
        return sum(self.pieces_s)

    @property
    def wait_span(self) -> str:
        """The stage's trace span for time it waits for this collective."""
        return self.span or f"{self.label} wait"


@dataclass(frozen=True, slots=True)
class StagePlan:
    tasks: tuple[Task, ...]
    forward: tuple[TaskWork, ...]  # indexed by chunk
    backward: tuple[TaskWork, ...]
    static_bytes: float
    send_forward: Transfer | None  # activation to the next virtual stage
    send_backward: Transfer | None  # gradient to the previous virtual stage
    grad_reduce: Transfer | None  # data-parallel gradient reduction after the last backward
    tied_grad_reduce: Transfer | None  # first <-> last stage embedding-grad all-reduce
    optimizer_s: float
    send_after: tuple[int, ...] | None = None  # per task: position after which its output leaves
    extra_waits: tuple[tuple[int, ...], ...] | None = None  # other positions' inputs to await first
    # Overlapped DP reduction in buckets: per chunk, the seconds of each bucket's collective in
    # the order its gradients become final during the chunk's last backward (None: the chunk's
    # share of `grad_reduce` in one piece at that backward's end).
    grad_buckets: tuple[tuple[float, ...], ...] | None = None
    param_gather: ParamGather | None = None
    # every other collective of the stage (an MoE layer's all-to-all, ...), after the
    # data-parallel ones above compile into theirs (`PipelinePlan.collectives`)
    collectives: tuple[Collective, ...] = ()
    # Positions of `tasks` that run alone where the others run in pairs (the EP overlap's
    # warm-up forwards and cooldown backwards, `schedule.unpaired_positions`), and per chunk
    # their works (`forward` and `backward` are then the paired works); empty / None: every
    # task runs its chunk's `forward` or `backward`
    unpaired: frozenset[int] = frozenset()
    unpaired_forward: tuple[TaskWork, ...] | None = None
    unpaired_backward: tuple[TaskWork, ...] | None = None


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    stages: tuple[StagePlan, ...]
    num_chunks: int
    blocking_p2p: bool = True
    overlap_grad_reduce: bool = False
    # per stage, every collective the engine runs: the stage's data-parallel declarations
    # compiled (`data_parallel_collectives`), then its own `collectives`
    collectives: tuple[tuple[Collective, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for index, stage in enumerate(self.stages):
            if stage.unpaired and (stage.unpaired_forward is None or stage.unpaired_backward is None):
                raise ValueError(
                    f"stage {index}: unpaired positions need unpaired_forward and unpaired_backward"
                )
            for collective in stage.collectives:
                task, chunks = collective.task, len(stage.forward)
                if task is not None and not 0 <= task.chunk < chunks:
                    raise ValueError(
                        f"collective {collective.label!r} of stage {index}: task chunk {task.chunk} "
                        f"is not one of the stage's {chunks} chunks"
                    )
        compiled = tuple(
            (*data_parallel_collectives(stage, self.num_chunks, self.overlap_grad_reduce), *stage.collectives)
            for stage in self.stages
        )
        object.__setattr__(self, "collectives", compiled)

    @property
    def num_stages(self) -> int:
        return len(self.stages)


TIED_EMBEDDING_GROUP = "embedding-group"  # the first and last stages' tied-embedding link


def data_parallel_collectives(stage: StagePlan, num_chunks: int, overlap: bool) -> tuple[Collective, ...]:
    """Megatron's data-parallel traffic of `stage` as ordinary collectives (Megatron-LM
    `core/distributed/distributed_data_parallel.py`, `param_and_grad_buffer.py`):
      - the overlapped parameter all-gather (`--overlap-param-gather`): per chunk, its
        buckets issued at the iteration start (`align_param_gather`), gating the chunk's
        first forward (the forward pre-hooks, `finish_param_sync`);
      - the gradient reduction: with `--overlap-grad-reduce`, per chunk after its last
        backward (in buckets, spread through that backward as the backward hooks'
        `start_grad_sync` issues them, where the plan gives buckets; else the chunk's share
        at its end); without, all of it when the stage's last task ends, exposed;
      - the tied-embedding gradient all-reduce of the first and last stages, joined once
        both are ready (`_allreduce_embedding_grads`);
      - without overlap, the parameter all-gather after the optimizer step.
    Each reproduces, float for float, what the engine did with these slots before."""
    out: list[Collective] = []
    gather = stage.param_gather
    if gather is not None and gather.overlapped:
        out += [
            Collective(f"param gather chunk {c}", gather.link, buckets, TimeCategory.DP_COMM, Issue.START,
                       TaskRef(Phase.FORWARD, c, Occurrence.FIRST), numbered=True, span="param gather wait")
            for c, buckets in enumerate(gather.buckets)
        ]  # fmt: skip
    reduce = stage.grad_reduce
    if reduce is not None and overlap:
        last = [TaskRef(Phase.BACKWARD, c, Occurrence.LAST) for c in range(num_chunks)]
        if stage.grad_buckets is not None:
            out += [
                Collective(f"dp grads chunk {c}", reduce.link, stage.grad_buckets[c], TimeCategory.DP_COMM,
                           Issue.SPREAD, ref, numbered=True)
                for c, ref in enumerate(last)
            ]  # fmt: skip
        else:
            share = (reduce.seconds / num_chunks,)
            out += [
                Collective(f"dp grads chunk {c}", reduce.link, share, TimeCategory.DP_COMM, Issue.AFTER, ref)
                for c, ref in enumerate(last)
            ]
    elif reduce is not None:
        out.append(
            Collective("dp grads", reduce.link, (reduce.seconds,), TimeCategory.DP_COMM, Issue.TASKS_DONE,
                       span="dp all-reduce")
        )  # fmt: skip
    tied = stage.tied_grad_reduce
    if tied is not None:
        link = Link.group(tied.link.kind, TIED_EMBEDDING_GROUP)
        out.append(
            Collective("embedding all-reduce", link, (tied.seconds,), TimeCategory.DP_COMM, Issue.READY,
                       span="embedding all-reduce")
        )  # fmt: skip
    if gather is not None and not gather.overlapped:
        out.append(
            Collective("param all-gather", gather.link, (gather.total_s,), TimeCategory.DP_COMM, Issue.STEP,
                       span="param all-gather")
        )  # fmt: skip
    return tuple(out)
