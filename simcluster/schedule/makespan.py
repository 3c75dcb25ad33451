"""A tiny list-scheduling evaluator: the ideal iteration time of a schedule.

Each stage runs its tasks in the given order; a task starts when its stage is free and
its upstream task (`dependencies.upstream`) has finished; communication is free. It is
the textbook model behind the bubble fractions (p − 1)/m (1F1B, GPipe; Narayanan et al.
SC'21 §2.2) and (p − 1)/(v·m) (interleaved, §2.2.2), and a cross-check for the SimPy engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from simcluster.schedule.dependencies import upstream_virtual, virtual_stage
from simcluster.schedule.tasks import Phase, Task
from simcluster.schedule.validation import require_chunk, require_positive

_Key = tuple[int, int, bool]
"""(virtual stage, microbatch, is forward): a task placed on the layer chain."""


class ScheduleDeadlockError(RuntimeError):
    """No stage can start its next task although some tasks have not run."""


def _keys(task: Task, stage: int, num_stages: int, num_chunks: int) -> tuple[_Key, _Key | None]:
    """The task's own key and its upstream task's key (None when it needs nothing)."""
    require_chunk(task.chunk, num_chunks)
    vs = virtual_stage(stage, task.chunk, num_stages)
    is_forward = task.phase is Phase.FORWARD
    dep = upstream_virtual(task.phase, vs, num_stages * num_chunks)
    dep_key = None if dep is None else (dep[1], task.microbatch, dep[0] is Phase.FORWARD)
    return (vs, task.microbatch, is_forward), dep_key


def ideal_makespan(
    schedule: Sequence[Sequence[Task]], forward_s: float, backward_s: float, num_chunks: int
) -> float:
    """Finish time of the last task when every stage follows its order.

    `forward_s` / `backward_s` are one microbatch through all of a stage's layers; each
    chunk-task takes a 1/num_chunks share. Runs in O(total tasks): a stage blocked on an
    unfinished upstream task parks until that task finishes, then resumes. Raises
    ScheduleDeadlockError when stages wait on each other or on a task nobody runs.
    """
    require_positive("num_chunks", num_chunks)
    num_stages = len(schedule)
    require_positive("len(schedule)", num_stages)
    task_s = {Phase.FORWARD: forward_s / num_chunks, Phase.BACKWARD: backward_s / num_chunks}
    finish_s: dict[_Key, float] = {}
    parked: dict[_Key, int] = {}  # unfinished upstream task -> the stage waiting for it
    next_index = [0] * num_stages
    free_s = [0.0] * num_stages
    ready = list(range(num_stages))
    while ready:
        stage = ready.pop()
        tasks = schedule[stage]
        while next_index[stage] < len(tasks):
            task = tasks[next_index[stage]]
            key, dep = _keys(task, stage, num_stages, num_chunks)
            if dep is not None and dep not in finish_s:
                parked[dep] = stage
                break
            start_s = free_s[stage] if dep is None else max(free_s[stage], finish_s[dep])
            free_s[stage] = finish_s[key] = start_s + task_s[task.phase]
            next_index[stage] += 1
            if key in parked:
                ready.append(parked.pop(key))
    _raise_if_stuck(schedule, next_index)
    return max(free_s)


def _raise_if_stuck(schedule: Sequence[Sequence[Task]], next_index: list[int]) -> None:
    """Raise ScheduleDeadlockError naming the stuck stages and the tasks they wait at."""
    stuck = [
        f"stage {stage} at {tasks[next_index[stage]]}"
        for stage, tasks in enumerate(schedule)
        if next_index[stage] < len(tasks)
    ]
    if stuck:
        raise ScheduleDeadlockError("schedule deadlocks: " + ", ".join(stuck))
