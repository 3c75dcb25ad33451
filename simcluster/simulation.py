"""Scenario -> workload -> costs -> schedule -> engine -> result: the main job, end to end."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from simcluster.config.choices import Dtype, ScheduleKind
from simcluster.config.errors import ConfigError
from simcluster.config.hardware import HardwareProfile
from simcluster.config.scenario import Scenario, require_hardware_fits
from simcluster.costs.breakdown import Split, step_split
from simcluster.costs.stage_pricing import (
    PricedChunk,
    PricedStage,
    PricedTransfer,
    StagePricing,
    host_issue_share,
    pricing_layout,
)
from simcluster.engine.links import Link, LinkKind
from simcluster.engine.plan import (
    Collective,
    Issue,
    Occurrence,
    ParamGather,
    PipelinePlan,
    StagePlan,
    TaskRef,
    TaskWork,
    TimeCategory,
    Transfer,
)
from simcluster.engine.simulator import EngineResult, simulate
from simcluster.memory_plan import paired_forward_head_bytes, stage_memory_row
from simcluster.results import LayerTimes, SimulationResult, StageMemory
from simcluster.schedule import (
    build_schedule,
    default_comm_points,
    ep_overlap_extra_warmup,
    interleaved_comm_points,
    unpaired_positions,
    warmup_microbatches,
)
from simcluster.schedule.tasks import Phase, Task
from simcluster.steady_state import simulate_steady_state
from simcluster.workload import flops
from simcluster.workload.mla_mfu import ModelShape, variant_model_flops
from simcluster.workload.model import StageWork, Workload, build_workload, mla_spec, transient_bytes
from simcluster.workload.moe_config import MoEConfig
from simcluster.workload.moe_mfu import moe_model_flops


@dataclass(frozen=True, slots=True)
class Simulation:
    """Everything one run produced: the inputs, the plan, the engine's raw outcome."""

    scenario: Scenario
    hardware: HardwareProfile
    workload: Workload
    plan: PipelinePlan
    engine: EngineResult
    result: SimulationResult


def _with_host_wait(
    wait_s: float, parts: tuple[tuple[TimeCategory, float], ...]
) -> tuple[tuple[TimeCategory, float], ...]:
    """A task's busy parts: the GPU's, and a host-bound wait where the host issues its
    kernels more slowly than the GPU runs them (`costs.host`, `PricedChunk`)."""
    return (*parts, (TimeCategory.HOST_WAIT, wait_s)) if wait_s > 0 else parts


def _ep_part(seconds: float) -> tuple[tuple[TimeCategory, float], ...]:
    """A task's MoE dispatcher seconds as their own part, where it has any (a dense task
    keeps the parts it always had)."""
    return ((TimeCategory.EP_COMM, seconds),) if seconds else ()


def _task_works(
    priced: tuple[PricedChunk, ...], stage: StageWork, transient: float, paired: bool = False
) -> tuple[tuple[TaskWork, ...], tuple[TaskWork, ...]]:
    """Per chunk, its forward and backward task: the priced seconds, labelled by part, and
    the memory the workload says they allocate (`paired`: a forward the EP overlap pairs
    stores its head first and the rest when its partner backward ends,
    `memory_plan.paired_forward_head_bytes`)."""
    forward, backward = [], []
    for price, chunk in zip(priced, stage.chunks):
        saved = chunk.saved_bytes
        head = paired_forward_head_bytes(chunk) if paired else saved
        cost = price.cost
        gpu = (
            (TimeCategory.COMPUTE, cost.forward.compute_s),
            (TimeCategory.TP_COMM, cost.forward.comm_s),
            *_ep_part(cost.forward.ep_comm_s),
        )
        parts = _with_host_wait(price.forward_host_wait_s, gpu)
        forward.append(
            TaskWork(
                price.forward_busy_s, parts, stored_bytes=head, deferred_bytes=saved - head if paired else 0.0
            )
        )
        gpu_backward = (
            (TimeCategory.COMPUTE, cost.backward.compute_s),
            (TimeCategory.TP_COMM, cost.backward.comm_s),
            *_ep_part(cost.backward.ep_comm_s),
            (TimeCategory.RECOMPUTE, cost.recompute.total_s),
        )
        parts = _with_host_wait(price.backward_host_wait_s, gpu_backward)
        backward.append(TaskWork(busy_s=price.backward_busy_s, parts=parts, transient_bytes=transient))
    return tuple(forward), tuple(backward)


def _link(crosses_nodes: bool, stage: int, channel: str | None = None) -> Link:
    """The stage's own link: NVLink inside an NVLink domain, the NICs beyond it."""
    return Link.of_stage(LinkKind.NIC if crosses_nodes else LinkKind.NVLINK, stage, channel)


def _transfer(priced: PricedTransfer | None, stage: int) -> Transfer | None:
    """The engine's route for a priced message: the stage's link of its kind."""
    if priced is None:
        return None
    return Transfer(_link(priced.crosses_nodes, stage), priced.seconds, priced.chunk_seconds)


def build_plan(
    scenario: Scenario,
    hw: HardwareProfile,
    workload: Workload,
    num_microbatches: int | None = None,
    pricing: StagePricing | None = None,
) -> PipelinePlan:
    """The engine's plan; `num_microbatches` overrides the scenario's m (steady_state.py)."""
    return schedule_plan(scenario, priced_stages(scenario, hw, workload, pricing), num_microbatches)


def priced_stages(
    scenario: Scenario, hw: HardwareProfile, workload: Workload, pricing: StagePricing | None = None
) -> tuple[StagePlan, ...]:
    """Every stage's task costs, routes and static memory, without tasks: none depends on m.
    The prices are `pricing`'s (a new `StagePricing(hw)` when None); this only wires them
    into the engine's plan with the workload's memory."""
    require_hardware_fits(scenario, hw)
    pricing = pricing or StagePricing(hw)
    transient = transient_bytes(workload)
    stages = []
    for stage, priced in zip(workload.stages, pricing.stages(scenario, workload)):
        forward, backward = _task_works(
            priced.chunks, stage, transient, paired=priced.unpaired_chunks is not None
        )
        alone = (
            None if priced.unpaired_chunks is None else _task_works(priced.unpaired_chunks, stage, transient)
        )
        r, gather = stage.stage, priced.param_gather
        stages.append(
            StagePlan(
                tasks=(),
                forward=forward,
                backward=backward,
                static_bytes=stage.static.total_bytes,
                send_forward=_transfer(priced.send_forward, r),
                send_backward=_transfer(priced.send_backward, r),
                grad_reduce=_transfer(priced.grad_reduce, r),
                tied_grad_reduce=_transfer(priced.tied_grad_reduce, r),
                optimizer_s=priced.optimizer_s,
                grad_buckets=priced.grad_buckets,
                param_gather=(
                    None
                    if gather is None
                    else ParamGather(_link(gather.crosses_nodes, r, "dp"), gather.buckets, gather.overlapped)
                ),
                collectives=_expert_collectives(
                    priced, r, len(priced.chunks), scenario.training.overlap_grad_reduce
                ),
                unpaired_forward=None if alone is None else alone[0],
                unpaired_backward=None if alone is None else alone[1],
            )
        )
    return tuple(stages)


def _expert_collectives(
    priced: PricedStage, stage: int, chunks: int, overlap: bool
) -> tuple[Collective, ...]:
    """A MoE stage's expert-data-parallel traffic as ordinary collectives on the stage's
    "edp" channel, issued as the dense ones are (`engine.plan.data_parallel_collectives`):
    the gradient reduction per chunk after its last backward with --overlap-grad-reduce
    (one piece each, no buckets), else after the stage's last task; the parameter
    all-gather gating each chunk's first forward with --overlap-param-gather, else after
    the optimizer step."""
    out: list[Collective] = []
    gather = priced.expert_param_gather
    if gather is not None:
        link = _link(gather.crosses_nodes, stage, "edp")
        if gather.overlapped:
            out += [
                Collective(f"expert param gather chunk {c}", link, pieces, TimeCategory.DP_COMM, Issue.START,
                           TaskRef(Phase.FORWARD, c, Occurrence.FIRST), span="expert param gather wait")
                for c, pieces in enumerate(gather.buckets)
            ]  # fmt: skip
        else:
            out.append(
                Collective(
                    "expert param all-gather", link, (gather.total_s,), TimeCategory.DP_COMM, Issue.STEP
                )
            )
    reduce = priced.expert_grad_reduce
    if reduce is not None:
        link = _link(reduce.crosses_nodes, stage, "edp")
        if overlap:
            share = (reduce.seconds / chunks,)
            out += [
                Collective(f"expert dp grads chunk {c}", link, share, TimeCategory.DP_COMM, Issue.AFTER,
                           TaskRef(Phase.BACKWARD, c, Occurrence.LAST))
                for c in range(chunks)
            ]  # fmt: skip
        else:
            out.append(
                Collective("expert dp grads", link, (reduce.seconds,), TimeCategory.DP_COMM, Issue.TASKS_DONE)
            )
    return tuple(out)


def schedule_plan(
    scenario: Scenario, priced: tuple[StagePlan, ...], num_microbatches: int | None = None
) -> PipelinePlan:
    """`priced_stages` with each stage's task order and Megatron's p2p points for m; under
    the EP overlap, the order has one more warm-up forward and its unpaired tasks (warm-up
    forwards, cooldown backwards) run the stage's unpaired works."""
    par, kind = scenario.parallel, scenario.training.schedule
    m = num_microbatches or scenario.num_microbatches
    ep_overlap = scenario.training.overlap_moe_expert_parallel_comm
    orders = stage_orders(kind, par.pp, m, par.vpp, ep_overlap)
    stages = tuple(
        replace(stage, tasks=tasks, send_after=send_after, extra_waits=extra_waits, unpaired=unpaired)
        for stage, (tasks, send_after, extra_waits, unpaired) in zip(priced, orders)
    )
    return PipelinePlan(
        stages=stages,
        num_chunks=par.vpp,
        overlap_grad_reduce=scenario.training.overlap_grad_reduce,
    )


StageOrder = tuple[tuple[Task, ...], tuple[int, ...], tuple[tuple[int, ...], ...], frozenset[int]]


@lru_cache(maxsize=32)
def stage_orders(
    kind: ScheduleKind, pp: int, m: int, vpp: int, ep_overlap: bool = False
) -> tuple[StageOrder, ...]:
    """Per stage: its task order, Megatron's p2p points (send after, extra waits) and the
    positions that run unpaired under the EP overlap (`schedule.unpaired_positions`; empty
    without it). Cached: a sweep's layouts share a few (schedule, p, m, v), and plans that
    share these tuples share the engine's and the certificate's per-stage wiring
    (`stage_shape`)."""
    extra = ep_overlap_extra_warmup(ep_overlap)
    schedule = build_schedule(kind, pp, m, vpp, extra)
    interleaved = kind is ScheduleKind.ONE_F_ONE_B and vpp > 1
    orders = []
    for r in range(pp):
        warmup = warmup_microbatches(kind, pp, r, m, vpp, extra)
        comm = (
            interleaved_comm_points(schedule[r], warmup) if interleaved else default_comm_points(schedule[r])
        )
        unpaired = unpaired_positions(schedule[r], warmup) if ep_overlap else frozenset()
        orders.append((tuple(schedule[r]), comm.send_after, comm.extra_waits, unpaired))
    return tuple(orders)


def _time_breakdown(engine: EngineResult) -> dict[str, float]:
    num_stages = len(engine.stages)
    breakdown = {
        category.value: sum(stage.busy_s.get(category, 0.0) for stage in engine.stages) / num_stages
        for category in TimeCategory
        if category is not TimeCategory.IDLE
    }
    breakdown[TimeCategory.IDLE.value] = max(0.0, engine.iteration_time_s - sum(breakdown.values()))
    return breakdown


def time_by_kind(
    scenario: Scenario, hw: HardwareProfile, workload: Workload, engine: EngineResult,
    pricing: StagePricing | None = None,
) -> tuple[Split, Split]:  # fmt: skip
    """(the step, one layer) split by kind of work (`costs.breakdown`): the step's parts sum
    to the iteration time, the layer's to its price (`layer_times`)."""
    pricing = pricing or StagePricing(hw)
    layout = pricing_layout(scenario, hw)
    stage_chunks = [
        [pricing.chunk_split(chunk, layout) for chunk in stage.chunks] for stage in workload.stages
    ]
    busy = [{category.value: s for category, s in stage.busy_s.items()} for stage in engine.stages]
    step = step_split(engine.iteration_time_s, busy, stage_chunks)
    return step, dict(pricing.layer_split(workload.layer, workload.layer, layout))


def _stage_memory(workload: Workload, engine: EngineResult, hw: HardwareProfile) -> tuple[StageMemory, ...]:
    rows = []
    for stage, outcome in zip(workload.stages, engine.stages):
        tracker = outcome.memory
        assert tracker is not None
        activations_and_transient = tracker.peak_total_bytes - stage.static.total_bytes
        rows.append(stage_memory_row(stage, tracker.peak_stored_bytes, activations_and_transient, hw))
    return tuple(rows)


def layer_times(
    workload: Workload, hw: HardwareProfile, scenario: Scenario, pricing: StagePricing | None = None
) -> LayerTimes:
    """One layer's forward and backward (with recompute) seconds per microbatch."""
    pricing = pricing or StagePricing(hw)
    cost = pricing.layer_of(workload, pricing_layout(scenario, hw))
    backward_s = cost.backward.total_s + cost.recompute.total_s
    return LayerTimes(forward_s=cost.forward.total_s, backward_s=backward_s)


def run_simulation(
    scenario: Scenario,
    hw: HardwareProfile,
    record: bool = False,
    workload: Workload | None = None,
    steady_state: bool = False,
    pricing: StagePricing | None = None,
) -> Simulation:
    """Simulate one iteration; pass `workload` when it is already built for this scenario,
    and `pricing` (a `StagePricing` of `hw`) to share its prices with other runs on `hw`.
    `steady_state` runs the engine once at a reduced microbatch count and, where its
    steady state is certified periodic, extends it to m (the full run's numbers to float
    rounding, see steady_state.py; no trace); `plan` is then the plan the engine ran."""
    workload = workload or build_workload(scenario, hw.fp8_weight_copies)
    pricing = pricing or StagePricing(hw)
    if steady_state and not record:
        par, priced = scenario.parallel, priced_stages(scenario, hw, workload, pricing)
        plan, engine = simulate_steady_state(
            lambda m: schedule_plan(scenario, priced, m),
            scenario.training.schedule,
            par.pp,
            par.vpp,
            scenario.num_microbatches,
        )
    else:
        plan = build_plan(scenario, hw, workload, pricing=pricing)
        engine = simulate(plan, record=record)
    m, tr = scenario.model, scenario.training
    B, s, L, v = tr.global_batch_size, m.seq_length, m.num_layers, m.vocab_size
    widths = flops.layer_widths(workload.layer_config)
    model_flops = flops.model_flops(B, s, L, v, widths)
    modules = workload.layer_config.recompute_modules
    hardware_flops = flops.hardware_flops(B, s, L, v, widths, tr.recompute, modules)
    paper_hardware_flops = flops.paper_hardware_flops(B, s, L, v, widths, tr.recompute, modules)
    if m.moe is not None:  # Megatron's active-parameter count (workload.moe_mfu)
        model_flops, hardware_flops = moe_model_flops(
            B, s, L, v, widths, MoEConfig(**m.moe.model_dump()), tr.recompute, modules
        )
        paper_hardware_flops = hardware_flops
    if m.mla is not None or m.mtp_num_layers:  # MLA's linears and core, MTP layers (workload.mla_mfu)
        experts = MoEConfig(**m.moe.model_dump()) if m.moe is not None else None
        shape = ModelShape(widths, m.num_attention_heads, experts, mla_spec(scenario), m.mtp_num_layers)
        model_flops, hardware_flops = variant_model_flops(B, s, L, v, shape, tr.recompute)
        paper_hardware_flops = hardware_flops
    peak = hw.peak_flop_per_s(tr.dtype)
    t = engine.iteration_time_s
    step, layer = time_by_kind(scenario, hw, workload, engine, pricing)
    result = SimulationResult(
        scenario=scenario.name,
        hardware=hw.name,
        num_gpus=scenario.num_gpus,
        iteration_time_s=t,
        model_flops=model_flops,
        hardware_flops=hardware_flops,
        mfu=flops.utilization(model_flops, t, scenario.num_gpus, peak),
        hfu=flops.utilization(hardware_flops, t, scenario.num_gpus, peak),
        tflops_per_gpu=model_flops / (t * scenario.num_gpus) / 1e12,
        bubble_fraction=engine.bubble_fraction(),
        time_breakdown_s=_time_breakdown(engine),
        time_by_kind_s={kind.value: s for kind, s in step.items()},
        layer_time_by_kind_s={kind.value: s for kind, s in layer.items()},
        stages=_stage_memory(workload, engine, hw),
        layer=layer_times(workload, hw, scenario, pricing),
        num_events=engine.num_events,
        paper_hardware_flops=paper_hardware_flops,
        paper_hfu=flops.utilization(paper_hardware_flops, t, scenario.num_gpus, peak),
        tokens_per_s_per_gpu=B * s / t / scenario.num_gpus,
        mfu_peak_flop_per_s=peak,
        mfu_peak_dtype=(tr.dtype if tr.dtype in (Dtype.FP32, Dtype.FP16) else Dtype.BF16).value,
        fp8_peak_flop_per_s=hw.peak_fp8_flop_per_s if tr.dtype is Dtype.FP8 else None,
        fp4_peak_flop_per_s=hw.peak_fp4_flop_per_s if tr.dtype is Dtype.FP4 else None,
        host_issue_share=(
            None
            if hw.compute.host_issue_s_per_op is None
            else host_issue_share(pricing.stages(scenario, workload))
        ),
    )
    return Simulation(scenario, hw, workload, plan, engine, result)


def _non_finite(value: Any, path: str) -> list[str]:
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in _non_finite(item, f"{path}.{key}" if path else key)]
    if isinstance(value, (list, tuple)):
        return [p for n, item in enumerate(value) for p in _non_finite(item, f"{path}[{n}]")]
    return []


def require_finite(result: SimulationResult, source: str | Path) -> None:
    """Raise ConfigError when a number of the result is infinite or NaN. A loaded profile's
    numbers are finite and within 1e-6..1e15 of their unit, so this is the last guard (a
    profile changed in code, `model_copy` skips validation) before JSON, which has no
    Infinity."""
    bad = _non_finite(result.to_json_dict(), "")
    if bad:
        raise ConfigError(
            source,
            [
                f"hardware {result.hardware!r}: the simulation gives non-finite {', '.join(bad[:5])}; "
                "a profile number is too small or too large to price (check its units)"
            ],
        )
