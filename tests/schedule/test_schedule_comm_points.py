"""Megatron's communication points: the interleaved steady state pairs a forward with the
backward after it (one combined p2p call), 1F1B sends and receives around every task."""

from simcluster.config.choices import ScheduleKind
from simcluster.schedule import (
    build_schedule,
    default_comm_points,
    interleaved_comm_points,
    warmup_microbatches,
)


def test_interleaved_steady_state_pairs_forward_with_next_backward():
    """p=2, v=2, m=4, stage 0: W = 4; F2.0|B0.1, F3.0|B1.1, F2.1|B0.0, F3.1|B1.0 are pairs."""
    tasks = build_schedule(ScheduleKind.ONE_F_ONE_B, 2, 4, 2)[0]
    assert [str(t) for t in tasks[4:12]] == ["F2.0", "B0.1", "F3.0", "B1.1", "F2.1", "B0.0", "F3.1", "B1.0"]
    points = interleaved_comm_points(tasks, warmup_microbatches(ScheduleKind.ONE_F_ONE_B, 2, 0, 4, 2))
    assert points.send_after == (0, 1, 2, 3, 5, 5, 7, 7, 9, 9, 11, 11, 12, 13, 14, 15)
    assert points.extra_waits[4] == (5,) and points.extra_waits[10] == (11,)
    assert all(points.extra_waits[i] == () for i in (0, 1, 2, 3, 5, 12, 13, 14, 15))


def test_no_sends_are_lost_or_moved_backwards():
    """Every task's output leaves at or after the task, never before."""
    for p, m, v in [(2, 4, 2), (4, 8, 3), (3, 6, 2)]:
        for stage, tasks in enumerate(build_schedule(ScheduleKind.ONE_F_ONE_B, p, m, v)):
            warmup = warmup_microbatches(ScheduleKind.ONE_F_ONE_B, p, stage, m, v)
            points = interleaved_comm_points(tasks, warmup)
            assert len(points.send_after) == len(tasks)
            assert all(after >= position for position, after in enumerate(points.send_after))


def test_default_points_send_after_each_task():
    """1F1B (Megatron's schedules.py): send right after the task, receive right before it."""
    tasks = build_schedule(ScheduleKind.ONE_F_ONE_B, 4, 8, 1)[1]
    points = default_comm_points(tasks)
    assert points.send_after == tuple(range(len(tasks)))
    assert all(waits == () for waits in points.extra_waits)
