"""The engine (one event per task, messages as arrival times) gives, bit for bit, what the
engine before it gave (tests/engine/reference_simulator.py: a SimPy timeout per task, per
message and per blocked send), on random layouts of every schedule and option."""

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simcluster.config import ConfigError, load_hardware, load_scenario_and_hardware, parse_scenario
from simcluster.engine.simulator import simulate, stage_shape
from simcluster.periodicity import PlanIndex, stable_frontier
from simcluster.simulation import build_plan
from simcluster.steady_state import reduced_counts
from simcluster.workload.model import build_workload
from tests.engine import reference_simulator
from tests.paths import ROOT

A100 = load_hardware("a100-sxm4-80gb")


@st.composite
def scenarios(draw):
    """Small models, unbalanced stages (large vocabularies), p2p comparable to compute
    (small hidden sizes), few to many microbatches, every option the engine branches on."""
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 3, 4, 8]))
    vpp = draw(st.sampled_from([1, 2, 3]))
    dp = draw(st.sampled_from([1, 2, 16, 64]))
    mbs = draw(st.sampled_from([1, 2]))
    schedule = draw(st.sampled_from(["1f1b", "1f1b", "gpipe"]))
    step = pp if vpp > 1 and schedule == "1f1b" else 1
    microbatches = step * draw(st.integers(1, max(1, 12 * pp // step)))
    training = {
        "micro_batch_size": mbs,
        "global_batch_size": mbs * dp * microbatches,
        "recompute": draw(st.sampled_from(["none", "selective", "full"])),
        "schedule": schedule,
        "overlap_grad_reduce": draw(st.booleans()),
        "use_distributed_optimizer": draw(st.booleans()),
    }
    if training["overlap_grad_reduce"] and training["use_distributed_optimizer"]:
        training["overlap_param_gather"] = draw(st.booleans())
    data = {
        "hardware": "a100-sxm4-80gb",
        "model": {
            "num_layers": pp * vpp * draw(st.integers(1, 3)),
            "hidden_size": draw(st.sampled_from([256, 1024, 4096])),
            "num_attention_heads": 16,
            "seq_length": draw(st.sampled_from([128, 2048])),
            "vocab_size": draw(st.sampled_from([5000, 50000, 250000])),
        },
        "parallel": {
            "tp": tp,
            "pp": pp,
            "dp": dp,
            "vpp": vpp,
            "sequence_parallel": tp > 1 and draw(st.booleans()),
        },  # fmt: skip
        "training": training,
    }
    try:
        return parse_scenario(data, "reference")
    except ConfigError:
        return None


def _probe_states(result) -> list[list[tuple]]:
    return [[(p.times_s, list(p.busy_s.items()), p.stored_bytes) for p in stage] for stage in result.probes]


def assert_identical(new, old, record: bool = False) -> None:
    """Every number the engine reports, compared with ==, and the busy sums in the same
    category order (sums over them follow it)."""
    assert new.iteration_time_s == old.iteration_time_s
    assert new.bubble_fraction() == old.bubble_fraction()
    for a, b in zip(new.stages, old.stages, strict=True):
        assert list(a.busy_s.items()) == list(b.busy_s.items())
        assert a.pipeline_end_s == b.pipeline_end_s and a.grads_ready_s == b.grads_ready_s
        assert a.finished and b.finished
        assert a.memory == b.memory
    assert _probe_states(new) == _probe_states(old)
    assert new.arrival_s == old.arrival_s
    if record:
        assert sorted(new.spans) == sorted(old.spans)
        assert new.link_spans == old.link_spans


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(scenarios(), st.booleans())
def test_engine_equals_the_reference_engine(scenario, record):
    """Full simulations, with and without a trace: the same floats, the same trace."""
    assume(scenario is not None)
    plan = build_plan(scenario, A100, build_workload(scenario))
    assert_identical(simulate(plan, record=record), reference_simulator.simulate(plan, record=record), record)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(scenarios())
def test_probed_runs_equal_the_reference_engine(scenario):
    """The certificate's probed short runs: the same states at the probes, the same arrivals."""
    assume(scenario is not None)
    par = scenario.parallel
    counts = reduced_counts(scenario.training.schedule, par.pp, par.vpp, scenario.num_microbatches)
    assume(counts is not None)
    workload = build_workload(scenario)
    plans = [PlanIndex.of(build_plan(scenario, A100, workload, m)) for m in (counts.m1, counts.m2)]
    frontier = stable_frontier(plans[0], plans[1])
    assume(frontier is not None)
    probe = tuple(zip(*frontier, strict=True))
    new = simulate(plans[1].plan, probe=probe, shapes=plans[1].shapes)
    old = reference_simulator.simulate(plans[1].plan, probe=probe)
    assert new.probes
    assert_identical(new, old)


@pytest.mark.parametrize("name", ["gpt3-175b-sp-selective", "gpt3-175b-full-recompute"])
def test_paper_scenarios_equal_the_reference_engine(name):
    scenario, hw = load_scenario_and_hardware(ROOT / "scenarios" / "paper" / f"{name}.yaml")
    plan = build_plan(scenario, hw, build_workload(scenario))
    new, old = simulate(plan), reference_simulator.simulate(plan)
    assert_identical(new, old)
    assert new.num_events < old.num_events  # one event per task, plus one per wait


def test_stage_shapes_follow_the_task_order_not_the_costs():
    """Layouts with the same (schedule, p, m, v) share the wiring; another m, or an equal
    order in new tuples, gets its own, equal where the order is equal."""
    base = dict(tp=8, pp=4, vpp=2, mbs=1)
    first, second = _layout(**base, sp=True), _layout(**base, sp=False)
    plans = [build_plan(s, A100, build_workload(s)) for s in (first, second)]
    assert plans[0].stages[1].forward != plans[1].stages[1].forward  # other costs
    shapes = [stage_shape(plan, 1) for plan in plans]
    assert shapes[0] is shapes[1]
    other_m = build_plan(first, A100, build_workload(first), num_microbatches=8)
    assert stage_shape(other_m, 1) is not shapes[0] and stage_shape(other_m, 1).waits != shapes[0].waits
    stage = plans[0].stages[1]
    copied = replace(stage, tasks=tuple(list(stage.tasks)), send_after=tuple(list(stage.send_after)))
    fresh = replace(plans[0], stages=(plans[0].stages[0], copied, *plans[0].stages[2:]))
    assert stage_shape(fresh, 1) is not shapes[0] and stage_shape(fresh, 1).program == shapes[0].program
    assert_identical(simulate(fresh), simulate(plans[0]))


def _layout(tp: int, pp: int, vpp: int, mbs: int, sp: bool):
    return parse_scenario(
        {
            "hardware": "a100-sxm4-80gb",
            "model": {
                "num_layers": 16,
                "hidden_size": 1024,
                "num_attention_heads": 16,
                "seq_length": 512,
                "vocab_size": 5000,
            },  # fmt: skip
            "parallel": {"tp": tp, "pp": pp, "dp": 2, "vpp": vpp, "sequence_parallel": sp},
            "training": {"micro_batch_size": mbs, "global_batch_size": 2 * mbs * 16},
        },
        "shapes",
    )
