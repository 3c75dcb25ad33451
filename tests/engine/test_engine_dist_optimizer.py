"""The distributed optimizer in the engine: bucketed overlapped reduce-scatter, and the
parameter all-gather exposed after the step or overlapped with the next forwards. Times
worked out by hand on one stage (forward 1 s, backward 2 s)."""

from dataclasses import replace

import pytest

from simcluster.config import parse_scenario
from simcluster.config.hardware import load_hardware
from simcluster.costs.stage_transfers import dp_bucket_counts, dp_bucket_params
from simcluster.engine.plan import ParamGather, TimeCategory
from simcluster.engine.simulator import simulate
from simcluster.simulation import build_plan, run_simulation
from simcluster.workload.model import build_workload
from tests.engine.test_engine_pipeline import uniform_plan


def _one_stage(m, gather=None, grad_buckets=None, grad_reduce_s=None, overlap=False):
    extra = {} if grad_reduce_s is None else {"grad_reduce_s": grad_reduce_s}
    plan = uniform_plan(1, m, 1, overlap=overlap, **extra)
    stage = replace(plan.stages[0], param_gather=gather, grad_buckets=grad_buckets)
    return replace(plan, stages=(stage,))


def test_overlapped_param_gather_exposes_the_first_bucket_and_late_buckets():
    """Buckets of 0.5 s arrive at 0.5, 1.0, 1.5. F0 waits 0.5 for the first; its three
    slices of 1/3 s run 0.5–0.833, 1.0–1.333 (bucket 2 late), 1.5–1.833. Then B0, F1, B1
    (1F1B, m = 2) end at 1.833 + 5 = 6.833 instead of 6."""
    gather = ParamGather(link="dp:0", buckets=((0.5, 0.5, 0.5),), overlapped=True)
    result = simulate(_one_stage(2, gather=gather))
    assert result.iteration_time_s == pytest.approx(6.0 + 0.5 + 1 / 3)
    assert result.stages[0].busy_s[TimeCategory.DP_COMM] == pytest.approx(0.5 + 1 / 3)


def test_param_gather_hidden_when_buckets_keep_up():
    """Buckets of 0.1 s: the first is exposed (0.1), the rest arrive before their slice."""
    gather = ParamGather(link="dp:0", buckets=((0.1, 0.1, 0.1),), overlapped=True)
    assert simulate(_one_stage(2, gather=gather)).iteration_time_s == pytest.approx(6.1)


def test_param_gather_without_overlap_follows_the_step():
    gather = ParamGather(link="dp:0", buckets=((0.5, 0.5, 0.5),), overlapped=False)
    result = simulate(_one_stage(2, gather=gather))
    assert result.iteration_time_s == pytest.approx(6.0 + 1.5)
    assert result.stages[0].busy_s[TimeCategory.DP_COMM] == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("buckets", "expected"),
    [
        # B0 runs 1–3; bucket j's grads are final at 1 + 2·(j+1)/n
        ((0.5, 0.5, 0.5, 0.5), 3.5),  # issued 1.5, 2, 2.5, 3: ends 2, 2.5, 3, 3.5
        ((1.0, 1.0), 4.0),  # issued 2, 3: ends 3, 4
        ((2.0,), 5.0),  # one bucket: after the backward, fully exposed
    ],
)
def test_grad_buckets_reduce_as_the_last_backward_makes_them_final(buckets, expected):
    plan = _one_stage(1, grad_buckets=(buckets,), grad_reduce_s=sum(buckets), overlap=True)
    assert simulate(plan).iteration_time_s == pytest.approx(expected)


SCENARIO = {
    "hardware": "h100-sxm5-80gb",
    "model": {
        "num_layers": 8,
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "seq_length": 512,
        "vocab_size": 32000,
    },
    "parallel": {"tp": 1, "pp": 2, "dp": 8},
    "training": {"micro_batch_size": 1, "global_batch_size": 64, "use_distributed_optimizer": True},
}


def _scenario(**training):
    data = {**SCENARIO, "training": {**SCENARIO["training"], **training}}
    return parse_scenario(data, "s.yaml")


def test_megatron_bucket_size():
    """max(40M, 1M·|DP×CP|) parameters."""
    assert dp_bucket_params(_scenario()) == 40_000_000
    big = parse_scenario({**SCENARIO, "parallel": {"tp": 1, "pp": 2, "dp": 64}}, "s.yaml")
    assert dp_bucket_params(big) == 64_000_000


def test_buckets_only_on_the_first_pipeline_rank_with_overlap():
    scenario = _scenario(overlap_grad_reduce=True)
    workload = build_workload(scenario)
    first, last = workload.stages
    assert dp_bucket_counts(scenario, last) == (1,)
    # 83.7M parameters on stage 0 (embedding 32.8M + 4 layers of 12.6M): ⌈83.7 / 40⌉ = 3
    assert first.num_params == pytest.approx(83_677_184)
    assert dp_bucket_counts(scenario, first) == (3,)
    no_overlap = _scenario()
    assert dp_bucket_counts(no_overlap, first) == (1,)


def test_overlapping_the_param_gather_never_slows_the_step():
    hw = load_hardware("h100-sxm5-80gb")
    plain = run_simulation(_scenario(overlap_grad_reduce=True), hw).result.iteration_time_s
    overlapped = run_simulation(
        _scenario(overlap_grad_reduce=True, overlap_param_gather=True), hw
    ).result.iteration_time_s
    assert overlapped < plain
    plan = build_plan(_scenario(overlap_grad_reduce=True), hw, build_workload(_scenario()))
    assert all(stage.param_gather is not None and not stage.param_gather.overlapped for stage in plan.stages)


def test_overlap_param_gather_needs_overlap_grad_reduce_as_megatron_asserts():
    from simcluster.config import ConfigError

    with pytest.raises(ConfigError, match="overlap_param_gather: value True: needs training.overlap_grad"):
        _scenario(overlap_param_gather=True)


def test_param_gather_and_buckets_appear_in_the_trace(tmp_path):
    import json

    from simcluster.engine.trace import write_trace

    gather = ParamGather(link="dp:0", buckets=((0.5, 0.5),), overlapped=True)
    plan = _one_stage(2, gather=gather, grad_buckets=((0.5, 0.5),), grad_reduce_s=1.0, overlap=True)
    result = simulate(plan, record=True)
    assert any(span[1] == "param gather wait" for span in result.spans)
    assert len(result.link_spans["dp:0"]) == 2 and len(result.link_spans["nic:0"]) == 2
    write_trace(result, tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_plan_bound_counts_the_exposed_param_gather_and_stays_below():
    from simcluster.plan.bound import bound_inputs, lower_bound_s, stage_seconds, stage_seconds_from_plan

    hw = load_hardware("h100-sxm5-80gb")
    for training in ({}, {"overlap_grad_reduce": True, "overlap_param_gather": True}):
        scenario = _scenario(**training)
        workload = build_workload(scenario)
        plan = build_plan(scenario, hw, workload)
        assert stage_seconds(scenario, hw, workload) == stage_seconds_from_plan(plan)
        bound = lower_bound_s(bound_inputs(scenario, hw, workload))
        assert bound <= simulate(plan).iteration_time_s
        gathers = [stage.param_gather_s for stage in stage_seconds(scenario, hw, workload)]
        assert all(g > 0 for g in gathers) if not training else all(g == 0 for g in gathers)
