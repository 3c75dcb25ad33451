"""A pipeline send whose chunks send messages of different sizes (`Transfer.chunk_seconds`:
a standalone MTP stage's hops, `Workload.message_bytes`): the engine holds the link for the
sending chunk's seconds, as the reference engine does."""

from __future__ import annotations

from dataclasses import replace

from simcluster.config import load_hardware
from simcluster.engine.plan import Transfer
from simcluster.engine.simulator import simulate
from simcluster.simulation import build_plan
from simcluster.workload.model import build_workload
from tests.engine import reference_simulator
from tests.engine.test_engine_reference import assert_identical
from tests.workload.test_mla_layer import _small

HW = load_hardware("h100-sxm5-80gb")
# pp 2 × vpp 2, the MTP layer on rank 0's chunk 1, the loss on rank 1's chunk 1
INTERLEAVED = {"parallel.pp": 2, "parallel.vpp": 2, "parallel.pipeline_layout": "Ett|ttt|tm|L"}


def _plan():
    scenario = _small(**INTERLEAVED)
    return build_plan(scenario, HW, build_workload(scenario))


def _link_seconds(result) -> dict[str, list[float]]:
    return {name: [span[1] for span in spans] for name, spans in result.link_spans.items() if spans}


def test_each_chunk_sends_for_its_own_seconds() -> None:
    plan = _plan()
    forward = plan.stages[0].send_forward
    assert forward is not None and forward.chunk_seconds is not None
    small, large = forward.chunk_seconds
    assert large > small == forward.seconds
    result = simulate(plan, record=True)
    assert_identical(result, reference_simulator.simulate(plan, record=True), record=True)
    # on rank 0's link, each forward of chunk 1 (the MTP stage, "F<mb>.1") sends for `large`,
    # each forward of chunk 0 for `small`
    by_task = {label: seconds for _, seconds, label in result.link_spans[forward.link.name]}
    forwards = {str(task): task.chunk for task in plan.stages[0].tasks if task.phase.value == "F"}
    assert {label: by_task[label] for label in forwards} == {
        label: large if chunk == 1 else small for label, chunk in forwards.items()
    }


def test_without_chunk_seconds_every_send_takes_the_least() -> None:
    """The same plan with one size on every hop: the links are busy for less."""
    plan = _plan()
    flat = replace(
        plan,
        stages=tuple(
            replace(
                stage,
                send_forward=_flat(stage.send_forward),
                send_backward=_flat(stage.send_backward),
            )
            for stage in plan.stages
        ),
    )
    busy = sum(map(sum, _link_seconds(simulate(plan, record=True)).values()))
    flat_busy = sum(map(sum, _link_seconds(simulate(flat, record=True)).values()))
    assert flat_busy < busy


def _flat(transfer: Transfer | None) -> Transfer | None:
    return None if transfer is None else Transfer(transfer.link, transfer.seconds)
