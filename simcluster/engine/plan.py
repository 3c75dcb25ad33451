"""What the engine runs: tasks with durations, messages on links, memory deltas.

The engine knows nothing of transformers. A `PipelinePlan` says, for every stage, the order
of its tasks (from `simcluster.schedule`), how long each (chunk, phase) keeps the stage
busy and under which labels, the bytes a forward allocates and its backward frees, and
the links its messages and gradient reductions travel on.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from simcluster.schedule.tasks import Task


class TimeCategory(str, enum.Enum):
    """Where a stage's time goes: the labels of a task's busy parts in the plan, the engine's
    busy time, and the result's time breakdown (in this order; the keys of `run --json`'s
    `time_breakdown_s`, a public contract). IDLE is what is left of the iteration."""

    COMPUTE = "compute"
    RECOMPUTE = "recompute"
    TP_COMM = "tp_comm"
    PP_COMM = "pp_comm"
    DP_COMM = "dp_comm"
    OPTIMIZER = "optimizer"
    HOST_WAIT = "host_wait"  # the GPU waiting for the host to issue a task's kernels
    IDLE = "idle"


@dataclass(frozen=True, slots=True)
class TaskWork:
    """One (chunk, phase) on a stage. `parts` label the busy time (they sum to busy_s);
    a forward allocates `stored_bytes` when it starts and its backward frees them when it
    ends; `transient_bytes` are held only while the task runs (recomputed activations)."""

    busy_s: float
    parts: tuple[tuple[TimeCategory, float], ...]
    stored_bytes: float = 0.0
    transient_bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class Transfer:
    """A message or collective occupying `link` for `seconds` (FIFO on the link)."""

    link: str
    seconds: float


@dataclass(frozen=True, slots=True)
class ParamGather:
    """The distributed optimizer's all-gather of updated parameters, per chunk in buckets
    (seconds of each bucket's all-gather on `link`, in the order the forward needs them).
    `overlapped` (Megatron `--overlap-param-gather`): every stage issues the buckets when
    the iteration starts (`align_param_gather`), and a chunk's first forward runs its
    bucket-sized slices only as their buckets arrive. Otherwise the all-gather follows the
    optimizer step, exposed."""

    link: str
    buckets: tuple[tuple[float, ...], ...]  # per chunk
    overlapped: bool

    @property
    def total_s(self) -> float:
        return sum(sum(chunk) for chunk in self.buckets)


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


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    stages: tuple[StagePlan, ...]
    num_chunks: int
    blocking_p2p: bool = True
    overlap_grad_reduce: bool = False

    @property
    def num_stages(self) -> int:
        return len(self.stages)
