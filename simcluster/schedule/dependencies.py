"""Which task feeds which: the chain of virtual stages a microbatch travels through.

Layer placement (Megatron-core core_v0.8.0 `TransformerLayer._get_layer_offset`): chunk c on rank r
holds layers [c·L/v + r·L/(p·v), … + L/(p·v)), so the model is a chain of p·v virtual
stages vs = c·p + r. Forward activations flow up the chain (rank p − 1 wraps to rank 0
between chunks); gradients flow down it. The last virtual stage turns its own forward
into the first backward (the loss is computed there).
"""

from __future__ import annotations

from simcluster.schedule.tasks import Phase, Task
from simcluster.schedule.validation import require_chunk, require_stage

StagedTask = tuple[int, Task]
"""A task together with the pipeline stage (rank) that runs it."""


def virtual_stage(stage: int, chunk: int, num_stages: int) -> int:
    """Position of (rank, chunk) in the layer chain: vs = chunk·p + stage."""
    return chunk * num_stages + stage


def _locate(vs: int, num_stages: int) -> tuple[int, int]:
    """Inverse of `virtual_stage`: (stage, chunk) of virtual stage vs."""
    return vs % num_stages, vs // num_stages


def _check(task: Task, stage: int, num_stages: int, num_chunks: int) -> int:
    """Validate the placement and return the task's virtual stage."""
    require_stage(stage, num_stages)
    require_chunk(task.chunk, num_chunks)
    return virtual_stage(stage, task.chunk, num_stages)


def _at(vs: int, phase: Phase, microbatch: int, num_stages: int) -> StagedTask:
    """The `phase` task of `microbatch` at virtual stage vs, with its stage."""
    stage, chunk = _locate(vs, num_stages)
    return stage, Task(phase, microbatch, chunk)


def upstream_virtual(phase: Phase, vs: int, num_virtual_stages: int) -> tuple[Phase, int] | None:
    """The rule on the chain alone: (phase, virtual stage) whose task of the same
    microbatch must finish first. Forward at vs needs forward at vs − 1 (nothing at
    vs = 0); backward needs backward at vs + 1, or its own forward at the last vs."""
    if phase is Phase.FORWARD:
        return None if vs == 0 else (Phase.FORWARD, vs - 1)
    if vs == num_virtual_stages - 1:
        return Phase.FORWARD, vs
    return Phase.BACKWARD, vs + 1


def upstream(task: Task, stage: int, num_stages: int, num_chunks: int) -> StagedTask | None:
    """The (stage, task) that must finish, and whose p2p message must arrive, before
    `task` can start on `stage`.

    Forward at vs needs forward at vs − 1 (None at vs = 0). Backward at vs needs backward
    at vs + 1; at the last virtual stage it needs its own forward on the same stage,
    which the engine treats as a dependency without a message.
    """
    vs = _check(task, stage, num_stages, num_chunks)
    dep = upstream_virtual(task.phase, vs, num_stages * num_chunks)
    return None if dep is None else _at(dep[1], dep[0], task.microbatch, num_stages)


def downstream(task: Task, stage: int, num_stages: int, num_chunks: int) -> StagedTask | None:
    """The (stage, task) that consumes the output of `task` run on `stage`: the next
    virtual stage's forward, or the previous virtual stage's backward. None for the last
    virtual stage's forward (its loss feeds its own backward, no message) and for the
    first virtual stage's backward (the end of the chain)."""
    vs = _check(task, stage, num_stages, num_chunks)
    last_vs = num_stages * num_chunks - 1
    if task.phase is Phase.FORWARD:
        if vs == last_vs:
            return None
        return _at(vs + 1, Phase.FORWARD, task.microbatch, num_stages)
    return None if vs == 0 else _at(vs - 1, Phase.BACKWARD, task.microbatch, num_stages)
