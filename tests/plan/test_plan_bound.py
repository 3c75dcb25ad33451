"""The plan's lower bound: never above the simulated iteration time, priced exactly as the
engine's plan, and tight where nothing overlaps."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcluster.config.errors import ConfigError
from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import parse_scenario
from simcluster.costs.stage_pricing import StagePricing
from simcluster.plan.bound import (
    bound_inputs,
    lower_bound_s,
    stage_seconds,
    stage_seconds_from_plan,
)
from simcluster.simulation import build_plan, run_simulation
from simcluster.workload.model import build_workload
from tests.plan.plan_world import TINY, a100

HW = a100()
H100 = load_hardware("h100-sxm5-80gb")  # has flash attention rates: cp > 1 needs flash
PROFILES = {HW.name: HW, H100.name: H100}


def _hw(scenario):
    return PROFILES[scenario.hardware]


@st.composite
def layouts(draw):
    """Small layouts of an 8-layer model: every schedule, recompute mode and DP option, and
    context parallelism (cp > 1 with flash attention, on the H100 profile that prices it;
    flash with cp 1 too)."""
    cp = draw(st.sampled_from([1, 1, 2, 4]))
    flash = cp > 1 or draw(st.booleans())
    pp = draw(st.sampled_from([1, 2, 4]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    dp = draw(st.sampled_from([1, 2, 4]))
    micro = draw(st.sampled_from([1, 2]))
    microbatches = draw(st.sampled_from([1, 2, 3, 4, 8]))
    data = {
        **TINY,
        "hardware": H100.name if flash else TINY["hardware"],
        "model": {**TINY["model"], "num_layers": 8},
        "parallel": {
            "tp": tp, "cp": cp, "pp": pp, "dp": dp, "vpp": vpp,
            "sequence_parallel": tp > 1 and draw(st.booleans()),
        },
        "training": {
            "micro_batch_size": micro,
            "global_batch_size": micro * dp * microbatches,
            "recompute": draw(st.sampled_from(["none", "selective", "full"])),
            "schedule": draw(st.sampled_from(["1f1b", "gpipe"])),
            "use_distributed_optimizer": draw(st.booleans()),
            "overlap_grad_reduce": draw(st.booleans()),
            "attention_backend": "flash" if flash else "unfused",
        },
    }  # fmt: skip
    try:
        return parse_scenario(data, "layout")
    except ConfigError:
        return None  # e.g. interleaving with m not a multiple of pp


@settings(max_examples=120, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_bound_never_exceeds_simulated_time(scenario):
    """bound ≤ simulated iteration time, on random small layouts of every schedule."""
    if scenario is None:
        return
    hw = _hw(scenario)
    workload = build_workload(scenario)
    bound = lower_bound_s(bound_inputs(scenario, hw, workload, StagePricing(hw)))
    simulated = run_simulation(scenario, hw, workload=workload).result.iteration_time_s
    assert 0 < bound <= simulated * (1 + 1e-12)


@settings(max_examples=60)
@given(layouts())
def test_cached_prices_equal_the_engine_plan(scenario):
    """The search's cached stage prices are exactly the numbers `build_plan` gives the engine."""
    if scenario is None:
        return
    hw = _hw(scenario)
    workload = build_workload(scenario)
    pricer = StagePricing(hw)
    stage_seconds(scenario, hw, build_workload(scenario.model_copy(update={"name": "warm"})), pricer)
    assert stage_seconds(scenario, hw, workload, pricer) == stage_seconds_from_plan(
        build_plan(scenario, hw, workload)
    )


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_bound_is_exact_without_pipeline_or_data_parallelism(recompute):
    """One stage, one replica: nothing overlaps or waits, so bound == simulated time."""
    data = {**TINY, "training": {**TINY["training"], "recompute": recompute}}
    scenario = parse_scenario(data, "single")
    workload = build_workload(scenario)
    bound = lower_bound_s(bound_inputs(scenario, HW, workload))
    assert bound == pytest.approx(run_simulation(scenario, HW).result.iteration_time_s, rel=1e-12)


def test_bound_counts_the_pipeline_fill_and_drain():
    """With p stages and m microbatches the bound exceeds m·(f + b) on a stage by at least
    the (p − 1)(f + b) fill and drain of uniform 1F1B (the textbook bubble)."""
    data = {
        **TINY,
        "parallel": {"tp": 1, "pp": 4},
        "training": {**TINY["training"], "micro_batch_size": 1, "global_batch_size": 8},
    }
    scenario = parse_scenario(data, "pipeline")
    inputs = bound_inputs(scenario, HW, build_workload(scenario))
    middle = inputs.stages[1]
    task_s = middle.forward_s[0] + middle.backward_s[0]
    assert lower_bound_s(inputs) >= (8 + 3) * task_s
