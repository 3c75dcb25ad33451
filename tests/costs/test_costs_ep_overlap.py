"""`training.overlap_moe_expert_parallel_comm` (`costs.ep_overlap`): a MoE layer's pass cut at
its dispatch and combine, the combined 1F1B pair's saving from Megatron-core's stream
schedule, the saving taken off the dispatcher's seconds only, and Megatron-core's rules."""

from __future__ import annotations

import shlex
from dataclasses import replace

import pytest
import yaml

from simcluster.config import ConfigError
from simcluster.config.choices import ScheduleKind
from simcluster.config.hardware import load_hardware
from simcluster.config.megatron_export import to_megatron_args
from simcluster.config.megatron_import import parse_megatron_args
from simcluster.config.scenario import parse_scenario
from simcluster.costs.chunk import ChunkCost, OpsCost, is_expert_collective, price_ops
from simcluster.costs.ep_overlap import (
    EXPERT_MODULES,
    delayed_mlp_phase_s,
    overlapped_cost,
    paired_saving_s,
    pass_phases,
)
from simcluster.costs.stage_pricing import StagePricing, pricing_layout
from simcluster.engine.plan import TimeCategory
from simcluster.engine.simulator import simulate
from simcluster.memory_plan import paired_forward_head_bytes, stage_memory_estimate
from simcluster.plan.memory_floor import peak_floor_bytes, stored_floor
from simcluster.schedule import build_schedule, peak_in_flight, unpaired_positions, warmup_microbatches
from simcluster.schedule.interleaved import interleaved_warmup
from simcluster.simulation import build_plan, run_simulation
from simcluster.workload.layer import LayerOps
from simcluster.workload.model import build_workload
from simcluster.workload.ops import (
    CollectiveKind,
    CommGroup,
    Module,
    Op,
    OpKind,
    Pass,
    collective,
    elementwise,
)
from tests.megatron_line import as_read_back
from tests.paths import ROOT

H100 = load_hardware("h100-sxm5-80gb")
QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"


def _data(overlap=True, **parallel):
    data = yaml.safe_load(QWEN.read_text())
    data["parallel"].update({"pp": 2, "vpp": 2, "dp": 32, "ep": 8} | parallel)
    data["training"]["overlap_moe_expert_parallel_comm"] = overlap
    return data


def _work(name: str, pass_: Pass = Pass.FORWARD) -> Op:
    return elementwise(name, 1.0, module=Module.LAYERNORM, pass_=pass_)


def _a2a(name: str, pass_: Pass = Pass.FORWARD) -> Op:
    return collective(
        name, CollectiveKind.ALL_TO_ALL, 1.0, module=Module.MOE_PERMUTE, pass_=pass_, group=CommGroup.EP
    )


def _pass(before: int, between: int, after: int, tag: str, pass_: Pass) -> tuple[Op, ...]:
    ops = [_work(f"{tag}.a{i}", pass_) for i in range(before)]
    ops.append(_a2a(f"{tag}.first", pass_))
    ops += [_work(f"{tag}.m{i}", pass_) for i in range(between)]
    ops.append(_a2a(f"{tag}.last", pass_))
    return tuple(ops + [_work(f"{tag}.p{i}", pass_) for i in range(after)])


# forward: attention 3, dispatch, experts 2, combine, unpermute 1;
# backward: unpermute grad 1, combine grad, experts grad 4, dispatch grad, attention grad 6
LAYER = LayerOps(_pass(3, 2, 1, "f", Pass.FORWARD), _pass(1, 4, 6, "b", Pass.INPUT_GRAD), ())


def _seconds(weights: dict[str, float]):
    def price(ops: tuple[Op, ...]) -> OpsCost:
        return OpsCost(compute_s=sum(weights.get(op.name, 1.0) for op in ops))

    return price


def test_a_pass_is_cut_at_its_first_and_last_dispatcher_collectives():
    phases = pass_phases(LAYER.forward)
    assert phases is not None
    parts = (phases.before, phases.first_comm, phases.between, phases.last_comm, phases.after)
    assert [len(part) for part in parts] == [3, 1, 2, 1, 1]
    assert pass_phases(tuple(_work(f"x{i}") for i in range(4))) is None  # a dense pass


def test_short_collectives_are_hidden_whole():
    """Every op 1 s: separate 21 s; paired 1 + max(1, 3) + max(1, 4) + max(1, 2) + max(1, 6) + 1
    = 17 s: the four 1-s collectives are all hidden."""
    assert paired_saving_s(LAYER, _seconds({})) == pytest.approx(4.0)


def test_a_long_dispatch_is_hidden_only_under_the_backward_experts():
    """The forward dispatch 10 s: paired 1 + 3 + max(10, 4) + 2 + 6 + 1 = 23 s against 30 s."""
    assert paired_saving_s(LAYER, _seconds({"f.first": 10.0})) == pytest.approx(7.0)


def test_the_saving_comes_off_the_dispatcher_seconds_in_proportion():
    cost = ChunkCost(OpsCost(5.0, 0.5, 11.0), OpsCost(9.0, 0.25, 2.0), OpsCost(1.0))
    out = overlapped_cost(cost, 7.0)
    assert out.forward.ep_comm_s == pytest.approx(11.0 - 7.0 * 11 / 13)
    assert out.backward.ep_comm_s == pytest.approx(2.0 - 7.0 * 2 / 13)
    assert (out.forward.compute_s, out.forward.comm_s, out.recompute) == (5.0, 0.5, cost.recompute)
    assert overlapped_cost(cost, 0.0) == cost
    assert overlapped_cost(cost, 99.0).forward.ep_comm_s == pytest.approx(0.0)


def _moe_segment(scenario):
    workload = build_workload(scenario)
    return next(seg for seg in workload.stages[0].chunks[0].segments if seg.kind.moe)


def test_a_real_moe_layer_hides_some_but_not_more_than_its_dispatcher_seconds():
    scenario = parse_scenario(_data(), "s.yaml")
    segment = _moe_segment(scenario)
    layout = pricing_layout(scenario, H100)
    assert layout.ep_overlap
    plain = StagePricing(H100).segment(segment, pricing_layout(parse_scenario(_data(False), "s.yaml"), H100))
    hidden = StagePricing(H100).segment(segment, layout)
    forward = pass_phases(segment.layer.forward)
    assert forward is not None and all(is_expert_collective(op) for op in forward.first_comm)
    assert any(op.kind is OpKind.ATTENTION for op in forward.before)

    def price(ops):
        return price_ops(
            ops, H100, layout.tp, layout.dtype, layout.cp, False, segment.layer.fp8_recipe, layout.experts
        )

    saving = paired_saving_s(segment.layer, price, hw=H100)  # the SMs NCCL holds (costs.ep_overlap)
    ep = plain.forward.ep_comm_s + plain.backward.ep_comm_s
    assert 0 < saving <= paired_saving_s(segment.layer, price) <= ep
    assert hidden.forward.ep_comm_s + hidden.backward.ep_comm_s == pytest.approx(ep - saving)
    assert hidden.forward.compute_s == plain.forward.compute_s


def test_the_step_is_faster_and_reports_less_ep_comm():
    on = run_simulation(*_load(True)).result
    off = run_simulation(*_load(False)).result
    assert on.iteration_time_s < off.iteration_time_s
    assert on.time_breakdown_s["ep_comm"] < off.time_breakdown_s["ep_comm"]


def _load(overlap):
    scenario = parse_scenario(_data(overlap), "s.yaml")
    return scenario, H100


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"parallel": {"vpp": 1}}, "parallel.vpp > 1"),
        ({"parallel": {"ep": 1, "dp": 32}}, "parallel.ep > 1"),
        ({"training": {"moe_token_dispatcher": "allgather"}}, "alltoall or flex"),
        ({"training": {"recompute": "full"}}, "recompute full"),
        ({"training": {"recompute": "selective", "recompute_modules": ["moe"]}}, "'moe'"),
    ],
)
def test_megatrons_rules_are_one_clear_error_each(changes, words):
    data = _data()
    for section, values in changes.items():
        data[section].update(values)
    with pytest.raises(ConfigError) as caught:
        parse_scenario(data, "s.yaml")
    message = str(caught.value)
    assert "training.overlap_moe_expert_parallel_comm" in message and words in message


def test_a_dense_model_refuses_it():
    data = yaml.safe_load((ROOT / "scenarios" / "paper" / "gpt3-175b-sp-selective.yaml").read_text())
    data["training"]["overlap_moe_expert_parallel_comm"] = True
    with pytest.raises(ConfigError, match="overlap_moe_expert_parallel_comm"):
        parse_scenario(data, "s.yaml")


def test_import_and_export_carry_the_flag():
    scenario = parse_scenario(_data(), "s.yaml")
    line = to_megatron_args(scenario, 8)
    assert "--overlap-moe-expert-parallel-comm" in shlex.split(line)
    assert parse_megatron_args(line, scenario.hardware, scenario.name).validated() == as_read_back(scenario)


# --- warm-up and cooldown run alone; the extra warm-up forward; --delay-wgrad-compute ---


def _scenario(overlap=True, gbs=None, **parallel):
    data = _data(overlap, **parallel)
    if gbs is not None:
        data["training"]["global_batch_size"] = gbs
    return parse_scenario(data, "s.yaml")


def test_the_combined_schedule_runs_one_more_warmup_forward():
    """Megatron-core get_pp_rank_microbatches: num_warmup_microbatches + 1 with the overlap
    (interleaved); without a pipeline, forward 0 alone, then forward i + 1 with backward i."""
    on, off = (
        build_schedule(ScheduleKind.ONE_F_ONE_B, 4, 8, 2, 1),
        build_schedule(ScheduleKind.ONE_F_ONE_B, 4, 8, 2),
    )
    for r in range(4):
        w = interleaved_warmup(4, r, 8, 2)
        assert warmup_microbatches(ScheduleKind.ONE_F_ONE_B, 4, r, 8, 2, 1) == w + 1
        assert on[r][: w + 1] == off[r][:w] + (off[r][w],)  # the next forward moves into the warm-up
        assert peak_in_flight(on[r]) == peak_in_flight(off[r]) + 1
    (alone,) = build_schedule(ScheduleKind.ONE_F_ONE_B, 1, 3, 1, 1)
    assert [str(task) for task in alone] == ["F0.0", "F1.0", "B0.0", "F2.0", "B1.0", "B2.0"]
    assert unpaired_positions(alone, 1) == {0, 5}
    # m == p: every chunk-forward is warm-up, nothing pairs
    (first, *_) = build_schedule(ScheduleKind.ONE_F_ONE_B, 2, 2, 2, 1)
    assert unpaired_positions(first, interleaved_warmup(2, 0, 2, 2, 1)) == set(range(len(first)))


def test_unpaired_tasks_cost_the_price_without_the_saving():
    """The warm-up forwards and cooldown backwards run the works of the run without the
    key; the steady state's the cheaper paired works."""
    scenario, plain = _scenario(gbs=32 * 4), _scenario(False, gbs=32 * 4)  # m = 4, pp 2, vpp 2
    plan = build_plan(scenario, H100, build_workload(scenario))
    alone = build_plan(plain, H100, build_workload(plain))
    for r, (stage, without) in enumerate(zip(plan.stages, alone.stages)):
        assert stage.unpaired_forward == without.forward and stage.unpaired_backward == without.backward
        paired, single = (*stage.forward, *stage.backward), (*without.forward, *without.backward)
        # the GPU's seconds (this layout's busy time is the host's: it issues more slowly)
        assert all(_gpu_s(p) < _gpu_s(a) for p, a in zip(paired, single))
        n, w = len(stage.tasks), warmup_microbatches(ScheduleKind.ONE_F_ONE_B, 2, r, 4, 2, 1)
        assert 0 < w < n // 2 and stage.unpaired == set(range(w)) | set(range(n - w, n))
    assert not any(stage.unpaired for stage in alone.stages)


def _gpu_s(work) -> float:
    return sum(seconds for category, seconds in work.parts if category is not TimeCategory.HOST_WAIT)


def test_pricing_unpaired_passes_makes_a_pipeline_slower_than_paired_everywhere():
    scenario = _scenario(gbs=32 * 4)
    plan = build_plan(scenario, H100, build_workload(scenario))
    paired_everywhere = replace(
        plan, stages=tuple(replace(stage, unpaired=frozenset()) for stage in plan.stages)
    )
    fixed, optimistic = simulate(plan).iteration_time_s, simulate(paired_everywhere).iteration_time_s
    off = run_simulation(_scenario(False, gbs=32 * 4), H100).result.iteration_time_s
    assert optimistic < fixed < off


@pytest.mark.parametrize("parallel", [{}, {"pp": 1, "vpp": 1}], ids=["interleaved m=p", "no pipeline m=1"])
def test_every_pass_unpaired_is_the_price_without_the_overlap(parallel):
    """m == pp under the interleaved schedule: every chunk-forward is warm-up (with or
    without the extra one), so nothing pairs and nothing is hidden; likewise one microbatch
    without a pipeline (its forward and its backward each run alone)."""
    gbs = 32 * (2 if not parallel else 1)
    on = run_simulation(_scenario(True, gbs=gbs, **parallel), H100).result
    off = run_simulation(_scenario(False, gbs=gbs, **parallel), H100).result
    assert on.iteration_time_s == off.iteration_time_s
    assert on.time_breakdown_s == off.time_breakdown_s
    assert [s.activation_bytes for s in on.stages] == [s.activation_bytes for s in off.stages]


@pytest.mark.parametrize("parallel", [{}, {"pp": 1, "vpp": 1}], ids=["interleaved", "no pipeline"])
def test_the_steady_state_extension_agrees_with_the_full_run(parallel):
    scenario = _scenario(gbs=32 * 16, **parallel)
    full = run_simulation(scenario, H100).result
    short = run_simulation(scenario, H100, steady_state=True).result
    assert short.num_events < full.num_events  # the certified extension ran, not the full fallback
    assert short.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-9)
    assert short.stages == full.stages


def test_memory_grows_by_one_layer_of_the_paired_forward():
    """Before each pair one more chunk-microbatch is stashed (the extra warm-up forward), and
    the pair's forward allocates one layer ahead of its backward's frees: on a middle stage
    (chunks of equal layers) the peak is the plain schedule's plus exactly one layer's saved
    activations, not one more chunk. The engine and the memory plan agree."""
    on, off = _scenario(gbs=32 * 8, pp=4), _scenario(False, gbs=32 * 8, pp=4)
    workload = build_workload(on)
    run_on, run_off = run_simulation(on, H100).result, run_simulation(off, H100).result
    for r in (1, 2):
        stage = workload.stages[r]
        (one_chunk,) = {chunk.saved_bytes for chunk in stage.chunks}
        (layer,) = {segment.layer.saved_bytes for chunk in stage.chunks for segment in chunk.segments}
        assert layer < one_chunk and paired_forward_head_bytes(stage.chunks[0]) == layer
        growth = run_on.stages[r].activation_bytes - run_off.stages[r].activation_bytes
        assert growth == pytest.approx(layer, rel=1e-9)
    first = workload.stages[0].chunks[0]  # the embedding is stored before any layer pair frees
    assert first.embedding is not None and paired_forward_head_bytes(first) > first.embedding.saved_bytes
    for estimated, engine in zip(stage_memory_estimate(on, H100), run_on.stages):
        assert estimated.activation_bytes == pytest.approx(engine.activation_bytes, rel=1e-12)
        assert estimated.peak_memory_bytes == pytest.approx(engine.peak_memory_bytes, rel=1e-12)


def test_without_a_pipeline_the_overlap_holds_one_microbatch_and_one_layer():
    """PP 1: forward i + 1 runs with backward i, so the peak is one microbatch's activations
    and one layer (Megatron's combined step frees the backward's layers as the forward
    allocates), not two microbatches."""
    on, off = _scenario(gbs=32 * 4, pp=1, vpp=1), _scenario(False, gbs=32 * 4, pp=1, vpp=1)
    (stage,) = build_workload(on).stages
    head = paired_forward_head_bytes(stage.chunks[0])
    a, b = run_simulation(on, H100).result.stages[0], run_simulation(off, H100).result.stages[0]
    assert a.activation_bytes == pytest.approx(b.activation_bytes + head, rel=1e-9)
    assert a.activation_bytes < 1.5 * b.activation_bytes


def test_delayed_weight_gradients_let_the_backward_dispatch_start_sooner():
    """Dispatch fwd 4, expert dgrad 2 + wgrad 3, dispatch bwd 4, expert fwd 1: without the
    delay max(4, 5) + max(4, 1) = 9; with it max(max(5, 4) + 1, max(4, 2) + 4) = 8."""
    assert delayed_mlp_phase_s(4.0, 2.0, 3.0, 4.0, 1.0) == pytest.approx(8.0)
    assert delayed_mlp_phase_s(4.0, 5.0, 0.0, 4.0, 1.0) == pytest.approx(max(4.0, 5.0) + max(4.0, 1.0))
    wgrad = LayerOps(
        LAYER.forward,
        (*LAYER.backward[:3], _work("b.w0", Pass.WEIGHT_GRAD), *LAYER.backward[3:]),
        (),
    )
    price = _seconds({"f.first": 5.0, "b.last": 5.0, "b.w0": 3.0})
    assert paired_saving_s(wgrad, price, delay_wgrad=True) > paired_saving_s(wgrad, price)
    assert paired_saving_s(LAYER, price, delay_wgrad=True) == paired_saving_s(LAYER, price)


def test_delay_wgrad_compute_is_a_key_with_megatrons_rule_and_its_flag():
    """On this layer the all-to-all over four nodes outlasts the backward experts (the
    communication stream sets the pace), so delaying their weight gradients hides nothing
    more; the delay never hides less."""
    data = _data(ep=32)
    data["training"]["delay_wgrad_compute"] = True
    delayed = parse_scenario(data, "s.yaml")
    segment = _moe_segment(delayed)
    phases = pass_phases(segment.layer.backward)
    assert phases is not None and any(op.pass_ is Pass.WEIGHT_GRAD for op in phases.between)
    now = StagePricing(H100).segment(segment, pricing_layout(delayed, H100))
    before = StagePricing(H100).segment(segment, pricing_layout(_scenario(ep=32), H100))
    exposed_now = now.forward.ep_comm_s + now.backward.ep_comm_s
    assert exposed_now <= before.forward.ep_comm_s + before.backward.ep_comm_s
    line = to_megatron_args(delayed, 8)
    assert "--delay-wgrad-compute" in shlex.split(line)
    assert parse_megatron_args(line, delayed.hardware, delayed.name).validated() == as_read_back(delayed)
    data["training"]["overlap_moe_expert_parallel_comm"] = False
    with pytest.raises(ConfigError, match="training.delay_wgrad_compute: value true: needs training.overlap"):
        parse_scenario(data, "s.yaml")


def test_the_dispatch_phase_is_the_token_all_to_all_not_the_count_exchange():
    """The tokens-per-expert exchange and the permute run before the dispatch node
    (Megatron-core's pre_dispatch_computation): the forward is cut at the token all-to-all
    next to the experts, as the backward is."""
    segment = _moe_segment(_scenario(ep=32))
    forward, backward = pass_phases(segment.layer.forward), pass_phases(segment.layer.backward)
    assert forward is not None and backward is not None
    for phases in (forward, backward):
        assert {op.module for op in phases.between} & EXPERT_MODULES
        assert not any(is_expert_collective(op) for op in phases.between)
        assert any(op.kind is OpKind.COLLECTIVE and op.message_bytes > 0 for op in phases.first_comm)
    assert [op.module for op in forward.first_comm] == [op.module for op in reversed(backward.last_comm)]
    assert any(is_expert_collective(op) for op in forward.before)  # the count exchange


def test_gpipe_refuses_the_overlap():
    data = _data()
    data["training"]["schedule"] = "gpipe"
    with pytest.raises(ConfigError, match="gpipe"):
        parse_scenario(data, "s.yaml")


def test_the_plan_memory_floor_stays_below_the_overlaps_peak():
    """The W + 1 whole warm-up forwards are what the plain schedule's floor counts; the
    paired forward after them adds only its head, so the floor neither grows nor passes the
    exact peak."""
    on, off = _scenario(gbs=32 * 8, pp=4), _scenario(False, gbs=32 * 8, pp=4)
    assert [stored_floor(on, r) for r in range(4)] == [stored_floor(off, r) for r in range(4)]
    peaks = [stage.peak_memory_bytes for stage in stage_memory_estimate(on, H100)]
    assert peak_floor_bytes(on, build_workload(on)) <= max(peaks)
