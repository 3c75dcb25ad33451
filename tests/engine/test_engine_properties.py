"""Invariants of whole simulations over random small layouts (hypothesis)."""

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simcluster.config import ConfigError, load_hardware, parse_scenario
from simcluster.memory_plan import stage_memory_estimate
from simcluster.simulation import run_simulation

A100 = load_hardware("a100-sxm4-80gb")


@st.composite
def scenarios(draw):
    tp = draw(st.sampled_from([1, 2, 4, 8, 16]))
    pp = draw(st.sampled_from([1, 2, 3, 4]))
    vpp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 4]))
    mbs = draw(st.sampled_from([1, 2]))
    microbatches = draw(st.integers(1, 12))
    data = {
        "hardware": "a100-sxm4-80gb",
        "model": {
            "num_layers": 24,
            "hidden_size": 1024,
            "num_attention_heads": 16,
            "seq_length": 512,
            "vocab_size": 5000,
        },
        "parallel": {
            "tp": tp,
            "pp": pp,
            "dp": dp,
            "vpp": vpp,
            "sequence_parallel": tp > 1 and draw(st.booleans()),
        },
        "training": {
            "micro_batch_size": mbs,
            "global_batch_size": mbs * dp * microbatches,
            "recompute": draw(st.sampled_from(["none", "selective", "full"])),
            "schedule": draw(st.sampled_from(["1f1b", "gpipe"])),
            "overlap_grad_reduce": draw(st.booleans()),
            "use_distributed_optimizer": draw(st.booleans()),
        },
    }
    try:
        return parse_scenario(data, "random")
    except ConfigError:
        return None


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(scenarios())
def test_any_valid_layout_simulates_consistently(scenario):
    """No deadlock; the breakdown sums to the iteration; every stage frees what it stored;
    the run is no faster than its busiest stage's work; the estimate matches the tracker."""
    assume(scenario is not None)
    sim = run_simulation(scenario, A100)
    result = sim.result
    assert result.iteration_time_s > 0
    assert sum(result.time_breakdown_s.values()) == pytest.approx(result.iteration_time_s)
    assert all(v >= -1e-12 for v in result.time_breakdown_s.values())
    for outcome in sim.engine.stages:
        assert outcome.memory.stored_bytes == pytest.approx(0.0, abs=1e-3)
        busy = sum(outcome.busy_s.values())
        assert busy <= result.iteration_time_s * (1 + 1e-9)
    estimate = stage_memory_estimate(scenario, A100)
    for est, sim_row in zip(estimate, result.stages, strict=True):
        assert est.peak_memory_bytes == pytest.approx(sim_row.peak_memory_bytes)
    assert 0 < result.mfu <= result.hfu < 1
