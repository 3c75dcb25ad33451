"""Work beyond a stated bound is refused at load, with the way to the answer."""

import tracemalloc

import pytest

from simcluster.config import ConfigError, load_hardware, parse_scenario
from simcluster.config.scenario import MAX_SIMULATED_TASKS
from simcluster.simulation import run_simulation
from tests.config.scenario_cases import with_changes


def _scenario(global_batch_size: int, pp: int = 4, vpp: int = 2):
    data = with_changes("parallel", tp=1, pp=pp, vpp=vpp)
    data["training"]["global_batch_size"] = global_batch_size
    return parse_scenario(data, "big.yaml")


def test_a_trillion_sample_batch_is_refused_at_once():
    """10⁹ microbatches: refused before anything is built (it used to grow to 6 GB), naming
    the field, the task count and the largest batch that runs here. Memory, not wall time,
    is what is bounded: CI machines differ in speed."""
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as caught:
            _scenario(1_000_000_000)
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak_bytes < 10e6
    message = str(caught.value)
    largest = MAX_SIMULATED_TASKS // (2 * 4 * 2) // 4 * 4
    assert "training.global_batch_size: value 1000000000" in message
    assert "16,000,000,000 pipeline tasks" in message and f"at most {largest:,} here" in message
    _scenario(largest)  # the suggested batch loads


def test_the_bound_is_the_stated_task_count():
    """2 · pp · vpp · m = MAX_SIMULATED_TASKS loads; one step of m more does not."""
    m = MAX_SIMULATED_TASKS // 16
    _scenario(m)
    with pytest.raises(ConfigError, match="pipeline tasks"):
        _scenario(m + 4)


def test_iteration_time_is_linear_in_m_past_the_fill():
    """The advice holds: t(m) from two smaller runs extrapolates the third exactly enough."""
    hw = load_hardware("a100-sxm4-80gb")
    times = {m: run_simulation(_scenario(m), hw).result.iteration_time_s for m in (16, 32, 64)}
    slope = (times[32] - times[16]) / 16
    assert times[64] == pytest.approx(times[32] + 32 * slope, rel=1e-6)


def test_a_sweep_of_too_many_combinations_is_refused(tmp_path):
    """Axes whose product exceeds the bound are refused at load, naming each axis's count."""
    from simcluster.sweep.spec import MAX_COMBINATIONS, parse_sweep_spec
    from tests.paths import ROOT

    (tmp_path / "base.yaml").write_text((ROOT / "scenarios/paper/gpt3-175b-sp-selective.yaml").read_text())
    axes = {"global_batch_size": list(range(64, 64 * 2001, 64)), "micro_batch_size": list(range(1, 1001))}
    with pytest.raises(ConfigError) as caught:
        parse_sweep_spec({"base": "base.yaml", "axes": axes}, tmp_path / "spec.yaml")
    assert "micro_batch_size 1000 * global_batch_size 2000 = 2,000,000 combinations" in str(caught.value)
    assert f"{MAX_COMBINATIONS:,}" in str(caught.value)
