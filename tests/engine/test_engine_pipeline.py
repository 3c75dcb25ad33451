"""The SimPy engine on tiny worlds: timing, bubbles, memory, links, determinism."""

import json

import pytest

from simcluster.config.choices import ScheduleKind
from simcluster.engine.links import LinkQueue
from simcluster.engine.plan import PipelinePlan, StagePlan, TaskWork, Transfer
from simcluster.engine.simulator import simulate
from simcluster.engine.trace import write_trace
from simcluster.schedule import build_schedule, ideal_makespan


def uniform_plan(
    p,
    m,
    v,
    forward_s=1.0,
    backward_s=2.0,
    stored=10.0,
    p2p_s=0.0,
    kind=ScheduleKind.ONE_F_ONE_B,
    **stage_extra,
):
    schedule = build_schedule(kind, p, m, v)
    stages = tuple(
        StagePlan(
            tasks=schedule[r],
            forward=tuple(TaskWork(forward_s / v, (("compute", forward_s / v),), stored) for _ in range(v)),
            backward=tuple(TaskWork(backward_s / v, (("compute", backward_s / v),)) for _ in range(v)),
            static_bytes=100.0,
            send_forward=Transfer(f"nic:{r}", p2p_s) if p > 1 else None,
            send_backward=Transfer(f"nic:{r}", p2p_s) if p > 1 else None,
            grad_reduce=(
                Transfer(stage_extra.get("grad_link", f"nic:{r}"), stage_extra["grad_reduce_s"])
                if "grad_reduce_s" in stage_extra
                else None
            ),
            tied_grad_reduce=None,
            optimizer_s=0.0,
        )
        for r in range(p)
    )
    return PipelinePlan(stages, num_chunks=v, overlap_grad_reduce=stage_extra.get("overlap", False))


@pytest.mark.parametrize(("p", "m", "v"), [(1, 4, 1), (2, 4, 1), (4, 8, 1), (4, 4, 2), (3, 6, 3), (8, 16, 2)])
def test_textbook_bubble_with_free_comms(p, m, v):
    """Uniform tasks, free p2p: bubble = (p − 1)/(m·v), time = ideal makespan."""
    result = simulate(uniform_plan(p, m, v))
    assert result.bubble_fraction() == pytest.approx((p - 1) / (m * v))
    schedule = build_schedule(ScheduleKind.ONE_F_ONE_B, p, m, v)
    assert result.iteration_time_s == pytest.approx(ideal_makespan(schedule, 1.0, 2.0, v))


def test_gpipe_bubble():
    """GPipe with uniform tasks has the same (p − 1)/m bubble."""
    result = simulate(uniform_plan(4, 8, 1, kind=ScheduleKind.GPIPE))
    assert result.bubble_fraction() == pytest.approx(3 / 8)


@pytest.mark.parametrize(("p", "m", "v"), [(4, 8, 1), (4, 8, 2), (8, 16, 3), (8, 4, 1)])
def test_first_stage_peak_activations(p, m, v):
    """1F1B keeps min(p, m) microbatches; interleaved keeps v·p + p − 1 chunks (§4.2.3)."""
    result = simulate(uniform_plan(p, m, v, stored=10.0))
    peak = result.stages[0].memory.peak_stored_bytes
    expected_chunks = min(p, m) if v == 1 else v * p + p - 1
    assert peak == pytest.approx(10.0 * expected_chunks)
    assert all(stage.memory.stored_bytes == pytest.approx(0.0) for stage in result.stages)


def test_p2p_delays_pipeline_by_message_time():
    """Two stages, one microbatch, blocking sends: F0 → msg → F1 → B1 → msg → B0."""
    result = simulate(uniform_plan(2, 1, 1, p2p_s=0.5))
    assert result.iteration_time_s == pytest.approx(1 + 0.5 + 1 + 2 + 0.5 + 2)


def test_link_is_first_come_first_served():
    """A second transfer issued while the link is busy starts when the first ends."""
    link = LinkQueue("nic:0")
    assert link.reserve(0.0, 2.0) == (0.0, 2.0)
    assert link.reserve(1.0, 1.0) == (2.0, 3.0)
    assert link.reserve(5.0, 1.0) == (5.0, 6.0)


def test_dp_reduction_contends_with_p2p_and_can_overlap():
    """Non-overlapped DP reduce adds its full time; overlapping hides part of it; two
    stages reducing over one shared link queue behind each other."""
    base = simulate(uniform_plan(2, 4, 1)).iteration_time_s
    serial = simulate(uniform_plan(2, 4, 1, grad_reduce_s=3.0)).iteration_time_s
    overlapped = simulate(uniform_plan(2, 4, 1, grad_reduce_s=3.0, overlap=True)).iteration_time_s
    serial_v2 = simulate(uniform_plan(2, 4, 2, grad_reduce_s=3.0)).iteration_time_s
    overlapped_v2 = simulate(uniform_plan(2, 4, 2, grad_reduce_s=3.0, overlap=True)).iteration_time_s
    shared = simulate(uniform_plan(2, 4, 1, grad_reduce_s=3.0, grad_link="nic:shared")).iteration_time_s
    assert serial == pytest.approx(base + 3.0)
    assert overlapped == pytest.approx(serial)  # one chunk: its grads are final only at the end
    assert overlapped_v2 < serial_v2  # chunk 1's grads reduce while chunk 0's backwards run
    # stage 1 ends at 13 and holds the link 13–16; stage 0 ends at 15 and waits until 16
    assert shared == pytest.approx(16.0 + 3.0)


def test_deterministic_and_trace_is_valid_json(tmp_path):
    """Same plan, same spans; the trace is Chrome trace-event JSON."""
    plan = uniform_plan(4, 8, 2, p2p_s=0.1)
    first, second = simulate(plan, record=True), simulate(plan, record=True)
    assert first.spans == second.spans and first.iteration_time_s == second.iteration_time_s
    path = tmp_path / "trace.json"
    write_trace(first, path)
    events = json.loads(path.read_text())["traceEvents"]
    assert sum(1 for e in events if e["ph"] == "X" and e["cat"] in ("forward", "backward")) == 4 * 8 * 2 * 2


@pytest.mark.parametrize(("p", "m", "v"), [(3, 6, 2), (4, 8, 2), (8, 16, 3)])
def test_megatron_interleaved_pairing_keeps_the_textbook_bubble(p, m, v):
    """Deferring each steady forward's send behind the next backward (Megatron's combined
    p2p) costs nothing with uniform tasks: the warm-up leaves two slots of slack."""
    from dataclasses import replace

    from simcluster.schedule import interleaved_comm_points, warmup_microbatches

    plan = uniform_plan(p, m, v)
    paired = []
    for r, stage in enumerate(plan.stages):
        points = interleaved_comm_points(
            stage.tasks, warmup_microbatches(ScheduleKind.ONE_F_ONE_B, p, r, m, v)
        )
        assert points.send_after != tuple(range(len(stage.tasks)))  # something is deferred
        paired.append(replace(stage, send_after=points.send_after, extra_waits=points.extra_waits))
    result = simulate(replace(plan, stages=tuple(paired)))
    assert result.bubble_fraction() == pytest.approx((p - 1) / (m * v))
