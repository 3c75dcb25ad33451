"""Steady-state extrapolation equals the full simulation (simcluster/steady_state.py)."""

import math

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from simcluster.config import ConfigError, load_hardware, parse_scenario
from simcluster.config.choices import ScheduleKind
from simcluster.engine.simulator import simulate
from simcluster.periodicity import PlanIndex, certify, stable_frontier
from simcluster.simulation import build_plan, run_simulation
from simcluster.steady_state import ReducedCounts, reduced_counts
from simcluster.workload.model import build_workload

A100 = load_hardware("a100-sxm4-80gb")
REL = 1e-9  # float rounding of a line through two points, far below any modelled effect


def _scenario(data: dict) -> object:
    try:
        return parse_scenario(data, "steady")
    except ConfigError:
        return None


@st.composite
def long_scenarios(draw):
    """Small models with deliberately unbalanced stages (large vocabularies make the last
    stage's logits heavy; small hidden sizes make p2p comparable to compute) and enough
    microbatches that the extrapolation is used."""
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([2, 3, 4, 5, 8]))
    vpp = draw(st.sampled_from([1, 2, 3]))
    dp = draw(st.sampled_from([1, 2, 16, 64]))
    mbs = draw(st.sampled_from([1, 2]))
    schedule = draw(st.sampled_from(["1f1b", "gpipe"]))
    step = pp if vpp > 1 and schedule == "1f1b" else 1
    microbatches = step * draw(st.integers(3 * pp // step, 14 * pp // step))  # mostly above m2
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
        },
        "training": {
            "micro_batch_size": mbs,
            "global_batch_size": mbs * dp * microbatches,
            "recompute": draw(st.sampled_from(["none", "selective", "full"])),
            "schedule": schedule,
            "overlap_grad_reduce": draw(st.booleans()),
            "use_distributed_optimizer": draw(st.booleans()),
        },
    }
    training = data["training"]
    if training["overlap_grad_reduce"] and training["use_distributed_optimizer"]:
        # main's overlapped parameter all-gather (it needs both, as Megatron asserts); with
        # grad buckets on pp rank 0's first chunk whenever the distributed optimizer overlaps
        training["overlap_param_gather"] = draw(st.booleans())
    return _scenario(data)


def assert_same_result(fast, full) -> None:
    """Every number of the result, to float rounding; per-stage memory exactly as the full
    run's (a constant peak is taken from the second run unchanged) or to rounding (GPipe)."""
    a, b = fast.result, full.result
    for name in ("iteration_time_s", "mfu", "hfu", "tflops_per_gpu", "model_flops", "hardware_flops"):
        assert getattr(a, name) == pytest.approx(getattr(b, name), rel=REL), name
    assert a.bubble_fraction == pytest.approx(b.bubble_fraction, rel=1e-7, abs=1e-12)
    assert a.time_breakdown_s.keys() == b.time_breakdown_s.keys()
    scale = b.iteration_time_s
    for category, seconds in b.time_breakdown_s.items():
        assert a.time_breakdown_s[category] == pytest.approx(seconds, rel=REL, abs=REL * scale), category
    for x, y in zip(a.stages, b.stages, strict=True):
        assert x.peak_memory_bytes == pytest.approx(y.peak_memory_bytes, rel=1e-12)
        assert x.activation_bytes == pytest.approx(y.activation_bytes, rel=1e-12)
        assert x.transient_bytes == pytest.approx(y.transient_bytes, rel=1e-9, abs=1.0)
    for s, t in zip(fast.engine.stages, full.engine.stages, strict=True):
        assert s.pipeline_end_s == pytest.approx(t.pipeline_end_s, rel=REL)
        assert s.grads_ready_s == pytest.approx(t.grads_ready_s, rel=REL)
        for category in t.busy_s.keys() | s.busy_s.keys():
            expected = t.busy_s.get(category, 0.0)
            assert s.busy_s.get(category, 0.0) == pytest.approx(expected, rel=REL, abs=REL * scale)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(long_scenarios())
def test_extrapolation_equals_full_simulation(scenario):
    """Every schedule, vpp, dp overlap, distributed optimizer, SP and recompute: a certified
    short run extended to m gives the full run's numbers (an uncertified one is the full run)."""
    assume(scenario is not None)
    full = run_simulation(scenario, A100)
    fast = run_simulation(scenario, A100, steady_state=True)
    event("extended" if fast.engine.num_events < full.engine.num_events else "full run")
    assert_same_result(fast, full)


def _gpt3_175b(tp: int, pp: int, vpp: int, mbs: int, sp: bool, recompute: str, **training) -> object:
    """A layout of benchmarks/specs/gpt3-175b-1024gpus-144.yaml (B = 1536 on 1,024 GPUs)."""
    return parse_scenario(
        {
            "hardware": "a100-sxm4-80gb",
            "model": {
                "num_layers": 96,
                "hidden_size": 12288,
                "num_attention_heads": 96,
                "seq_length": 2048,
                "vocab_size": 51200,
            },  # fmt: skip
            "parallel": {"tp": tp, "pp": pp, "dp": 1024 // (tp * pp), "vpp": vpp, "sequence_parallel": sp},
            "training": {
                "micro_batch_size": mbs,
                "global_batch_size": 1536,
                "recompute": recompute,
                **training,
            },  # fmt: skip
        },
        "gpt3-175b",
    )


@pytest.mark.parametrize(
    "layout",
    [
        dict(tp=8, pp=16, vpp=3, mbs=1, sp=True, recompute="selective"),  # m = 192, interleaved
        dict(tp=8, pp=8, vpp=1, mbs=1, sp=False, recompute="full"),  # m = 96, 1F1B
        dict(tp=4, pp=16, vpp=2, mbs=1, sp=True, recompute="full", overlap_grad_reduce=True),
        dict(tp=8, pp=16, vpp=1, mbs=2, sp=True, recompute="selective", use_distributed_optimizer=True),
    ],
)
def test_extrapolation_equals_full_simulation_at_benchmark_scale(layout):
    """The benchmark's 175B layouts (96 layers, up to 192 microbatches, dp up to 32)."""
    scenario = _gpt3_175b(**layout)
    assert reduced_counts(scenario.training.schedule, scenario.parallel.pp, scenario.parallel.vpp,
                          scenario.num_microbatches) is not None  # fmt: skip
    fast, full = run_simulation(scenario, A100, steady_state=True), run_simulation(scenario, A100)
    assert fast.engine.num_events < full.engine.num_events  # certified and extended, not re-run
    assert_same_result(fast, full)


def test_reduced_counts_follow_each_schedules_period():
    """1F1B: m1 = p, m2 = p + 1; interleaved: whole groups 2p and 3p; none for GPipe or when
    simulating m is no dearer."""
    assert reduced_counts(ScheduleKind.ONE_F_ONE_B, 8, 1, 96) == ReducedCounts(8, 9, 96)
    assert reduced_counts(ScheduleKind.ONE_F_ONE_B, 16, 3, 192) == ReducedCounts(32, 48, 192)
    assert reduced_counts(ScheduleKind.GPIPE, 4, 2, 64) is None  # no steady state
    assert reduced_counts(ScheduleKind.ONE_F_ONE_B, 16, 3, 48) is None  # simulating 48 is no dearer
    assert reduced_counts(ScheduleKind.ONE_F_ONE_B, 8, 1, 9) is None


def test_a_huge_batch_costs_one_short_run():
    """Six million microbatches: one run of p + 1 microbatches; the iteration grows by one
    steady-state period per microbatch."""
    scenario = _gpt3_175b(tp=8, pp=8, vpp=1, mbs=1, sp=True, recompute="selective")
    huge = scenario.model_copy(
        update={"training": scenario.training.model_copy(update={"global_batch_size": 1536 * 62_500})}
    )
    assert huge.num_microbatches == 6_000_000
    fast = run_simulation(huge, A100, steady_state=True)
    short = run_simulation(scenario, A100, steady_state=True)
    period = (fast.result.iteration_time_s - short.result.iteration_time_s) / (6_000_000 - 96)
    full_short = run_simulation(scenario, A100)
    assert short.result.iteration_time_s == pytest.approx(full_short.result.iteration_time_s, rel=REL)
    assert math.isfinite(period) and period > 0
    assert fast.engine.num_events < full_short.engine.num_events  # one short run, not 6M tasks
    peaks = [s.peak_memory_bytes for s in fast.result.stages]
    assert peaks == [s.peak_memory_bytes for s in short.result.stages]


def _late_transient() -> object:
    """Found by a random search: 1F1B on 4 stages whose iteration time grows by 90.75 ms per
    microbatch up to m = 9 and by 91.00 ms from m = 10 on (two routes through the pipeline
    with nearly equal periods; the slower-growing one is the longest at first)."""
    return parse_scenario(
        {
            "hardware": "a100-sxm4-80gb",
            "model": {
                "num_layers": 12,
                "hidden_size": 12288,
                "num_attention_heads": 16,
                "seq_length": 2048,
                "vocab_size": 1000,
            },  # fmt: skip
            "parallel": {"tp": 8, "pp": 4, "dp": 2},
            "training": {"micro_batch_size": 2, "global_batch_size": 88, "recompute": "none"},
        },
        "late-transient",
    )


def _certified_shift(scenario, m1: int, m2: int) -> float | None:
    workload = build_workload(scenario)
    plans = tuple(PlanIndex.of(build_plan(scenario, A100, workload, m)) for m in (m1, m2))
    frontier = stable_frontier(plans[0], plans[1])
    assert frontier is not None
    run = simulate(plans[1].plan, probe=tuple(zip(*frontier)), shapes=plans[1].shapes)
    return certify((plans[0], plans[1]), frontier, run)


def test_a_transient_longer_than_the_reduced_runs_is_not_extrapolated():
    """The line through m = 4 and 5 (or 8 and 9) misses m = 22; the certificate refuses both
    and the full simulation answers, bit for bit."""
    scenario = _late_transient()
    assert _certified_shift(scenario, 4, 5) is None and _certified_shift(scenario, 8, 9) is None
    times = [run_simulation(_with_microbatches(scenario, m), A100).result.iteration_time_s for m in (8, 9)]
    full = run_simulation(scenario, A100)
    assert times[1] + (times[1] - times[0]) * (22 - 9) < full.result.iteration_time_s * (1 - 1e-4)
    fast = run_simulation(scenario, A100, steady_state=True)
    assert fast.result.to_json_dict() == full.result.to_json_dict()


def _with_microbatches(scenario, m: int):
    per_step = scenario.training.micro_batch_size * scenario.parallel.dp
    training = scenario.training.model_copy(update={"global_batch_size": m * per_step})
    return scenario.model_copy(update={"training": training})


def test_the_certificate_accepts_a_periodic_pipeline():
    """The benchmark's interleaved 175B layout is periodic from m = 32 (2p) on: the shift
    is T(48) − T(32), one group of p microbatches through all v chunks."""
    scenario = _gpt3_175b(tp=8, pp=16, vpp=3, mbs=1, sp=True, recompute="selective")
    shift_s = _certified_shift(scenario, 32, 48)
    assert shift_s is not None
    t32, t48 = (
        run_simulation(_with_microbatches(scenario, m), A100).result.iteration_time_s for m in (32, 48)
    )
    assert shift_s == pytest.approx(t48 - t32, rel=1e-9)
