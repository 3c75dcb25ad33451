"""When each stage sends and receives, as Megatron's schedules do it (`pipeline_parallel/schedules.py`).

Non-interleaved 1F1B sends a task's output right after the task and receives a task's
input right before it (send_forward_recv_backward / send_backward_recv_forward), which is
the engine's default. The interleaved schedule (without --overlap-p2p-comm) runs each
steady-state step as forward(k + W), backward(k), then ONE combined
send_forward_backward_recv_forward_backward: the forward's activation leaves only after
the backward has run, and the next forward cannot start before the next backward's
gradient has also arrived. The last warm-up step already pre-receives the first gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcluster.schedule.ordering import StageTasks
from simcluster.schedule.tasks import Phase


@dataclass(frozen=True, slots=True)
class CommPoints:
    """Per task position: after which position its output is sent, and which other
    positions' inputs must also have arrived before it starts."""

    send_after: tuple[int, ...]
    extra_waits: tuple[tuple[int, ...], ...]


def default_comm_points(tasks: StageTasks) -> CommPoints:
    return CommPoints(tuple(range(len(tasks))), tuple(() for _ in tasks))


def interleaved_comm_points(tasks: StageTasks, num_warmup: int) -> CommPoints:
    """Pair each steady-state forward with the backward that follows it."""
    send_after = list(range(len(tasks)))
    extra_waits: list[tuple[int, ...]] = [() for _ in tasks]
    position = num_warmup
    while position + 1 < len(tasks) and tasks[position].phase is Phase.FORWARD:
        if tasks[position + 1].phase is not Phase.BACKWARD:
            break
        send_after[position] = position + 1
        extra_waits[position] = (position + 1,)
        position += 2
    return CommPoints(tuple(send_after), tuple(extra_waits))
