"""Scenario -> workload -> costs -> schedule -> engine -> result: the main job, end to end."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from simcluster.config.choices import Dtype, Fp8Recipe, ScheduleKind
from simcluster.config.errors import ConfigError
from simcluster.config.hardware import HardwareProfile
from simcluster.config.scenario import Scenario, require_hardware_fits
from simcluster.costs.breakdown import Split, chunk_split, layer_split, step_split
from simcluster.costs.chunk import (
    NO_CONTEXT_PARALLEL,
    ChunkCost,
    compose_chunk,
    fp8_amax_reduction_s,
    price_layer_ops,
)
from simcluster.costs.compute import OPTIMIZER_KIND, elementwise_time_s
from simcluster.costs.host import chunk_host_s, host_wait_s
from simcluster.costs.network import GroupPlacement, collective_time_s, p2p_time_s
from simcluster.costs.placement import cp_group, dp_cp_group, stages_share_node, strided_group, tp_group
from simcluster.engine.plan import ParamGather, PipelinePlan, StagePlan, TaskWork, TimeCategory, Transfer
from simcluster.engine.simulator import EngineResult, simulate
from simcluster.memory_plan import stage_memory_row
from simcluster.results import LayerTimes, SimulationResult, StageMemory
from simcluster.schedule import (
    build_schedule,
    default_comm_points,
    interleaved_comm_points,
    warmup_microbatches,
)
from simcluster.schedule.tasks import Task
from simcluster.steady_state import simulate_steady_state
from simcluster.workload import flops
from simcluster.workload.layer import LayerOps
from simcluster.workload.model import (
    ChunkWork,
    StageWork,
    Workload,
    build_workload,
    transient_bytes,
)
from simcluster.workload.ops import CollectiveKind


@dataclass(frozen=True, slots=True)
class Simulation:
    """Everything one run produced: the inputs, the plan, the engine's raw outcome."""

    scenario: Scenario
    hardware: HardwareProfile
    workload: Workload
    plan: PipelinePlan
    engine: EngineResult
    result: SimulationResult


def _host_bound(
    gpu_s: float, host_s: float, parts: tuple[tuple[TimeCategory, float], ...]
) -> tuple[float, tuple[tuple[TimeCategory, float], ...]]:
    """A task's busy seconds and parts when the host issues its kernels in `host_s`
    (`costs.host`): the GPU's parts, and a host-bound wait where the host is slower."""
    wait_s = host_wait_s(gpu_s, host_s)
    return (host_s, (*parts, (TimeCategory.HOST_WAIT, wait_s))) if wait_s > 0 else (gpu_s, parts)


def _task_works(
    costs: tuple[ChunkCost, ...], stage: StageWork, transient: float,
    hosts: tuple[tuple[float, float], ...] | None = None,
) -> tuple[tuple[TaskWork, ...], tuple[TaskWork, ...]]:  # fmt: skip
    hosts = hosts or ((0.0, 0.0),) * len(costs)
    forward, backward = [], []
    for cost, chunk, (host_forward_s, host_backward_s) in zip(costs, stage.chunks, hosts):
        busy_s, parts = _host_bound(
            cost.forward_s,
            host_forward_s,
            ((TimeCategory.COMPUTE, cost.forward.compute_s), (TimeCategory.TP_COMM, cost.forward.comm_s)),
        )
        forward.append(TaskWork(busy_s=busy_s, parts=parts, stored_bytes=chunk.saved_bytes))
        busy_s, parts = _host_bound(
            cost.backward_s,
            host_backward_s,
            (
                (TimeCategory.COMPUTE, cost.backward.compute_s),
                (TimeCategory.TP_COMM, cost.backward.comm_s),
                (TimeCategory.RECOMPUTE, cost.recompute.total_s),
            ),
        )
        backward.append(TaskWork(busy_s=busy_s, parts=parts, transient_bytes=transient))
    return tuple(forward), tuple(backward)


def p2p_send(scenario: Scenario, hw: HardwareProfile, src: int, dst: int, message_bytes: float) -> Transfer:
    """Each rank sends its 1/t of the activation. Without SP the receiver then all-gathers
    the t pieces over NVLink (Megatron-LM 2021's scatter/gather p2p,
    `megatron/p2p_communication.py`) before the p2p call returns, so the message is
    delivered only after that all-gather."""
    same = stages_share_node(scenario, hw, src, dst)
    return Transfer(_p2p_link(same, src), p2p_seconds(scenario, hw, same, message_bytes))


def _p2p_link(same_node: bool, src: int) -> str:
    return f"{'nvlink' if same_node else 'nic'}:{src}"


def p2p_seconds(scenario: Scenario, hw: HardwareProfile, same_node: bool, message_bytes: float) -> float:
    """`p2p_send`'s seconds, between stages that share a node or not."""
    seconds = p2p_time_s(message_bytes, same_node, hw)
    par = scenario.parallel
    if par.tp > 1 and not par.sequence_parallel:
        seconds += collective_time_s(
            CollectiveKind.ALL_GATHER, message_bytes * par.tp, tp_group(scenario, hw), hw
        )
    return seconds


MIN_BUCKET_PARAMS = 40_000_000  # Megatron's default DP bucket: max(40M, 1M · |DP×CP|) params
BUCKET_PARAMS_PER_DP_RANK = 1_000_000  # (Megatron-LM training.py::resolve_ddp_bucket_size)


def dp_bucket_params(scenario: Scenario) -> float:
    """Megatron's `ddp_config.bucket_size` in parameters: max(40M, 1M · |DP×CP|)."""
    par = scenario.parallel
    return max(MIN_BUCKET_PARAMS, BUCKET_PARAMS_PER_DP_RANK * par.dp * par.cp)


def dp_bucket_counts(scenario: Scenario, stage: StageWork) -> tuple[int, ...]:
    """Buckets per chunk of `stage`. Megatron buckets only with --overlap-grad-reduce, and
    only on pipeline rank 0's first model chunk (`DistributedDataParallel.__init__` sets
    bucket_size None on pp rank > 0; training.py::get_model disables bucketing for chunks
    after the first); everywhere else a chunk's parameters are one bucket. A stage's
    parameters are split evenly over its chunks, and a bucketed chunk into equal buckets of
    at most the bucket size (Megatron closes a bucket at a parameter boundary past it)."""
    chunks = len(stage.chunks)
    counts = [1] * chunks
    if scenario.training.overlap_grad_reduce and stage.stage == 0:
        counts[0] = max(1, math.ceil(stage.num_params / chunks / dp_bucket_params(scenario)))
    return tuple(counts)


def grad_reduce_transfer(scenario: Scenario, hw: HardwareProfile, stage: StageWork) -> Transfer | None:
    """DP reduction of fp32 main grads: an all-reduce, or with the distributed optimizer a
    reduce-scatter (the all-gather of the updated parameters is `param_gather`), over the
    DP × CP group (`costs.placement.dp_cp_group`: CP ranks hold identical weights)."""
    par = scenario.parallel
    if par.dp * par.cp == 1:
        return None
    group = dp_cp_group(scenario, hw)
    link = "nic" if group.crosses_nodes else "nvlink"
    seconds = grad_reduce_seconds(scenario, hw, group, stage.dp_gradient_bytes)
    return Transfer(f"{link}:{stage.stage}", seconds)


def grad_reduce_seconds(
    scenario: Scenario, hw: HardwareProfile, group: GroupPlacement, gradient_bytes: float
) -> float:
    """`grad_reduce_transfer`'s seconds for `gradient_bytes` over the DP × CP `group`."""
    if scenario.training.use_distributed_optimizer:
        return collective_time_s(CollectiveKind.REDUCE_SCATTER, gradient_bytes, group, hw)
    return collective_time_s(CollectiveKind.ALL_REDUCE, gradient_bytes, group, hw)


def grad_buckets(
    scenario: Scenario, hw: HardwareProfile, stage: StageWork
) -> tuple[tuple[float, ...], ...] | None:
    """With the distributed optimizer and --overlap-grad-reduce: per chunk, the seconds of
    each bucket's reduce-scatter of fp32 main grads (`start_grad_sync` per bucket). Each
    bucket is its own collective, so each pays the collective's latency."""
    par = scenario.parallel
    if par.dp * par.cp == 1 or not (
        scenario.training.use_distributed_optimizer and scenario.training.overlap_grad_reduce
    ):
        return None
    group = dp_cp_group(scenario, hw)
    chunk_bytes = stage.dp_gradient_bytes / len(stage.chunks)
    return tuple(
        (collective_time_s(CollectiveKind.REDUCE_SCATTER, chunk_bytes / n, group, hw),) * n
        for n in dp_bucket_counts(scenario, stage)
    )


def param_gather(scenario: Scenario, hw: HardwareProfile, stage: StageWork) -> ParamGather | None:
    """Distributed optimizer: all-gather of the updated parameters over DP × CP (the
    optimizer's shard group, `dp_cp_group`; `StageWork.param_gather_bytes`: 2 bytes per
    parameter, 1 for the TE linears' with --fp8-param-gather), in the same buckets as the
    gradients.
    Overlapped (--overlap-param-gather), it runs on the DP communicator's own link, beside
    pipeline p2p (their sharing of a NIC is not modelled); otherwise it follows the step."""
    tr, par = scenario.training, scenario.parallel
    if par.dp * par.cp == 1 or not tr.use_distributed_optimizer:
        return None
    group = dp_cp_group(scenario, hw)
    chunk_bytes = stage.param_gather_bytes / len(stage.chunks)
    buckets = tuple(
        (collective_time_s(CollectiveKind.ALL_GATHER, chunk_bytes / n, group, hw),) * n
        for n in dp_bucket_counts(scenario, stage)
    )
    return ParamGather(link=f"dp:{stage.stage}", buckets=buckets, overlapped=tr.overlap_param_gather)


def tied_reduce_transfer(scenario: Scenario, hw: HardwareProfile, stage: StageWork) -> Transfer | None:
    if stage.embedding_grad_bytes == 0:
        return None
    pp = scenario.parallel.pp
    same = stages_share_node(scenario, hw, 0, pp - 1)
    group = GroupPlacement(num_ranks=2, ranks_per_node=2 if same else 1)
    seconds = collective_time_s(CollectiveKind.ALL_REDUCE, stage.embedding_grad_bytes, group, hw)
    return Transfer(f"{'nvlink' if same else 'nic'}:{stage.stage}", seconds)


def amax_group(scenario: Scenario, hw: HardwareProfile) -> GroupPlacement | None:
    """FP8's amax-reduction group, TP × DP × CP (`get_amax_reduction_group(
    with_context_parallel=True)`): contiguous ranks in Megatron's tp-cp-dp-pp order. Only
    delayed scaling reduces the amaxes once per pass; the other recipes scale each tensor
    from its own amax (`workload.fp8.current_scaling_ops`): None there."""
    if scenario.training.dtype is not Dtype.FP8 or scenario.training.fp8_recipe is not Fp8Recipe.DELAYED:
        return None
    par = scenario.parallel
    return strided_group(par.tp * par.dp * par.cp, 1, hw)


def build_plan(
    scenario: Scenario, hw: HardwareProfile, workload: Workload, num_microbatches: int | None = None
) -> PipelinePlan:
    """The engine's plan; `num_microbatches` overrides the scenario's m (steady_state.py)."""
    return schedule_plan(scenario, priced_stages(scenario, hw, workload), num_microbatches)


def priced_stages(scenario: Scenario, hw: HardwareProfile, workload: Workload) -> tuple[StagePlan, ...]:
    """Every stage's task costs, routes and static memory, without tasks: none depends on m."""
    require_hardware_fits(scenario, hw)
    par, dtype = scenario.parallel, scenario.training.dtype
    tp, cp = tp_group(scenario, hw), cp_group(scenario, hw)
    overlap, amax = scenario.tp_comm_overlap_active, amax_group(scenario, hw)
    graph = scenario.training.cuda_graph_impl
    transient = transient_bytes(workload)
    # Chunks differ only in their layer count (uneven splits) and the extras they carry, and
    # so do their task works; sends only in whether the stages share a node, and gradient
    # reductions in their bytes: each is priced once per layout (the same calls, same values).
    cost_cache: dict[tuple[tuple[int, ...], bool, bool], ChunkCost] = {}
    works: dict[
        tuple[tuple[tuple[int, ...], bool, bool], ...], tuple[tuple[TaskWork, ...], tuple[TaskWork, ...]]
    ] = {}
    send_s: dict[bool, float] = {}
    reduce_s: dict[float, float] = {}
    dp_group = dp_cp_group(scenario, hw) if par.dp * par.cp > 1 else None

    def send(src: int, dst: int) -> Transfer:
        same = stages_share_node(scenario, hw, src, dst)
        if same not in send_s:
            send_s[same] = p2p_seconds(scenario, hw, same, workload.p2p_bytes)
        return Transfer(_p2p_link(same, src), send_s[same])

    def reduce(stage: StageWork) -> Transfer | None:
        if dp_group is None:
            return None
        gradient_bytes = stage.dp_gradient_bytes
        if gradient_bytes not in reduce_s:
            reduce_s[gradient_bytes] = grad_reduce_seconds(scenario, hw, dp_group, gradient_bytes)
        link = "nic" if dp_group.crosses_nodes else "nvlink"
        return Transfer(f"{link}:{stage.stage}", reduce_s[gradient_bytes])

    stages = []
    for stage in workload.stages:
        keys = tuple(
            (_segment_counts(c), c.embedding is not None, c.output is not None) for c in stage.chunks
        )
        for key, chunk in zip(keys, stage.chunks):
            if key not in cost_cache:
                cost_cache[key] = _chunk_cost(chunk, hw, tp, dtype, cp, overlap, amax)
        if keys not in works:
            hosts = tuple(chunk_host_s(c, hw, dtype, graph, amax is not None) for c in stage.chunks)
            works[keys] = _task_works(tuple(cost_cache[key] for key in keys), stage, transient, hosts)
        forward, backward = works[keys]
        r, p = stage.stage, par.pp
        stages.append(
            StagePlan(
                tasks=(),
                forward=forward,
                backward=backward,
                static_bytes=stage.static.total_bytes,
                send_forward=send(r, (r + 1) % p) if p > 1 else None,
                send_backward=send(r, (r - 1) % p) if p > 1 else None,
                grad_reduce=reduce(stage),
                tied_grad_reduce=tied_reduce_transfer(scenario, hw, stage),
                optimizer_s=elementwise_time_s(stage.optimizer_step_bytes, hw, OPTIMIZER_KIND),
                grad_buckets=grad_buckets(scenario, hw, stage),
                param_gather=param_gather(scenario, hw, stage),
            )
        )
    return tuple(stages)


_LAYER_COSTS: dict[tuple[object, ...], tuple[LayerOps, HardwareProfile, ChunkCost]] = {}
_MAX_LAYER_COSTS = 4096


def layer_cost(
    ops: LayerOps, hw: HardwareProfile, tp: GroupPlacement, dtype: Dtype,
    cp: GroupPlacement = NO_CONTEXT_PARALLEL, tp_comm_overlap: bool = False,
) -> ChunkCost:  # fmt: skip
    """`price_layer_ops`, cached. Layer, embedding and output ops are cached objects
    (`workload.layer.layer_ops`, `embedding_ops`, `output_ops`): the layouts of a sweep
    share a few, so they are keyed by identity (the entry keeps the ops and the profile
    alive, so no identity is reused while it exists) with the other inputs by value."""
    key = (id(ops), id(hw), tp, dtype, cp, tp_comm_overlap)
    hit = _LAYER_COSTS.get(key)
    if hit is not None:
        return hit[2]
    cost = price_layer_ops(ops, hw, tp, dtype, cp, tp_comm_overlap)
    if len(_LAYER_COSTS) >= _MAX_LAYER_COSTS:
        _LAYER_COSTS.clear()
    _LAYER_COSTS[key] = (ops, hw, cost)
    return cost


def _chunk_cost(
    chunk: ChunkWork, hw: HardwareProfile, tp: GroupPlacement, dtype: Dtype, cp: GroupPlacement,
    tp_comm_overlap: bool, amax: GroupPlacement | None,
) -> ChunkCost:  # fmt: skip
    """`price_chunk(chunk, …)` from cached layer prices: the same calls, composed the same way."""
    extras = [layer_cost(extra, hw, tp, dtype) for extra in (chunk.embedding, chunk.output) if extra]
    amax_s = fp8_amax_reduction_s(amax, hw) if dtype is Dtype.FP8 and amax is not None else 0.0
    layers = [(s.num_layers, layer_cost(s.layer, hw, tp, dtype, cp, tp_comm_overlap)) for s in chunk.segments]
    return compose_chunk(layers, extras, amax_s)


def _segment_counts(chunk: ChunkWork) -> tuple[int, ...]:
    return tuple(segment.num_layers for segment in chunk.segments)


def schedule_plan(
    scenario: Scenario, priced: tuple[StagePlan, ...], num_microbatches: int | None = None
) -> PipelinePlan:
    """`priced_stages` with each stage's task order and Megatron's p2p points for m."""
    par, kind = scenario.parallel, scenario.training.schedule
    m = num_microbatches or scenario.num_microbatches
    orders = stage_orders(kind, par.pp, m, par.vpp)
    stages = tuple(
        replace(stage, tasks=tasks, send_after=send_after, extra_waits=extra_waits)
        for stage, (tasks, send_after, extra_waits) in zip(priced, orders)
    )
    return PipelinePlan(
        stages=stages,
        num_chunks=par.vpp,
        overlap_grad_reduce=scenario.training.overlap_grad_reduce,
    )


StageOrder = tuple[tuple[Task, ...], tuple[int, ...], tuple[tuple[int, ...], ...]]


@lru_cache(maxsize=32)
def stage_orders(kind: ScheduleKind, pp: int, m: int, vpp: int) -> tuple[StageOrder, ...]:
    """Per stage: its task order and Megatron's p2p points (send after, extra waits).
    Cached: a sweep's layouts share a few (schedule, p, m, v), and plans that share these
    tuples share the engine's and the certificate's per-stage wiring (`stage_shape`)."""
    schedule = build_schedule(kind, pp, m, vpp)
    interleaved = kind is ScheduleKind.ONE_F_ONE_B and vpp > 1
    orders = []
    for r in range(pp):
        comm = (
            interleaved_comm_points(schedule[r], warmup_microbatches(kind, pp, r, m, vpp))
            if interleaved
            else default_comm_points(schedule[r])
        )
        orders.append((tuple(schedule[r]), comm.send_after, comm.extra_waits))
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
    scenario: Scenario, hw: HardwareProfile, workload: Workload, engine: EngineResult
) -> tuple[Split, Split]:
    """(the step, one layer) split by kind of work (`costs.breakdown`): the step's parts sum
    to the iteration time, the layer's to its price (`layer_times`)."""
    dtype, graph = scenario.training.dtype, scenario.training.cuda_graph_impl
    tp, cp = tp_group(scenario, hw), cp_group(scenario, hw)
    overlap, amax = scenario.tp_comm_overlap_active, amax_group(scenario, hw)
    amax_s = fp8_amax_reduction_s(amax, hw) if dtype is Dtype.FP8 and amax is not None else 0.0
    layers: dict[int, Split] = {}
    chunks: dict[tuple[object, ...], Split] = {}  # as priced_stages: chunks differ in these

    def split_of(chunk: ChunkWork) -> Split:
        segments = tuple((id(s.layer), s.num_layers) for s in chunk.segments)
        key = (segments, chunk.embedding is not None, chunk.output is not None)
        if key not in chunks:
            chunks[key] = _chunk_split(chunk)
        return chunks[key]

    def _chunk_split(chunk: ChunkWork) -> Split:
        for segment in chunk.segments:
            if id(segment.layer) not in layers:
                cost = layer_cost(segment.layer, hw, tp, dtype, cp, overlap)
                layers[id(segment.layer)] = layer_split(segment.layer, cost, hw, tp, dtype, cp)
        extras = [layer_cost(e, hw, tp, dtype) for e in (chunk.embedding, chunk.output) if e]
        cost = _chunk_cost(chunk, hw, tp, dtype, cp, overlap, amax)
        host_forward_s, host_backward_s = chunk_host_s(chunk, hw, dtype, graph, amax is not None)
        wait_s = host_wait_s(cost.forward_s, host_forward_s) + host_wait_s(cost.backward_s, host_backward_s)
        segments = [(s.num_layers, layers[id(s.layer)]) for s in chunk.segments]
        return chunk_split(segments, extras, amax_s, wait_s)

    stage_chunks = [[split_of(chunk) for chunk in stage.chunks] for stage in workload.stages]
    busy = [{category.value: s for category, s in stage.busy_s.items()} for stage in engine.stages]
    step = step_split(engine.iteration_time_s, busy, stage_chunks)
    cost = layer_cost(workload.layer, hw, tp, dtype, cp, overlap)
    return step, layer_split(workload.layer, cost, hw, tp, dtype, cp)


def _stage_memory(workload: Workload, engine: EngineResult, hw: HardwareProfile) -> tuple[StageMemory, ...]:
    rows = []
    for stage, outcome in zip(workload.stages, engine.stages):
        tracker = outcome.memory
        assert tracker is not None
        activations_and_transient = tracker.peak_total_bytes - stage.static.total_bytes
        rows.append(stage_memory_row(stage, tracker.peak_stored_bytes, activations_and_transient, hw))
    return tuple(rows)


def layer_times(workload: Workload, hw: HardwareProfile, scenario: Scenario) -> LayerTimes:
    tp, cp = tp_group(scenario, hw), cp_group(scenario, hw)
    tr = scenario.training
    cost = layer_cost(workload.layer, hw, tp, tr.dtype, cp, scenario.tp_comm_overlap_active)
    backward_s = cost.backward.total_s + cost.recompute.total_s
    return LayerTimes(forward_s=cost.forward.total_s, backward_s=backward_s)


def run_simulation(
    scenario: Scenario,
    hw: HardwareProfile,
    record: bool = False,
    workload: Workload | None = None,
    steady_state: bool = False,
) -> Simulation:
    """Simulate one iteration; pass `workload` when it is already built for this scenario.
    `steady_state` runs the engine once at a reduced microbatch count and, where its
    steady state is certified periodic, extends it to m (the full run's numbers to float
    rounding, see steady_state.py; no trace); `plan` is then the plan the engine ran."""
    workload = workload or build_workload(scenario, hw.fp8_weight_copies)
    if steady_state and not record:
        par, priced = scenario.parallel, priced_stages(scenario, hw, workload)
        plan, engine = simulate_steady_state(
            lambda m: schedule_plan(scenario, priced, m),
            scenario.training.schedule,
            par.pp,
            par.vpp,
            scenario.num_microbatches,
        )
    else:
        plan = build_plan(scenario, hw, workload)
        engine = simulate(plan, record=record)
    m, tr = scenario.model, scenario.training
    B, s, L, v = tr.global_batch_size, m.seq_length, m.num_layers, m.vocab_size
    widths = flops.layer_widths(workload.layer_config)
    model_flops = flops.model_flops(B, s, L, v, widths)
    hardware_flops = flops.hardware_flops(B, s, L, v, widths, tr.recompute)
    paper_hardware_flops = flops.paper_hardware_flops(B, s, L, v, widths, tr.recompute)
    peak = hw.peak_flop_per_s(tr.dtype)
    t = engine.iteration_time_s
    step, layer = time_by_kind(scenario, hw, workload, engine)
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
        layer=layer_times(workload, hw, scenario),
        num_events=engine.num_events,
        paper_hardware_flops=paper_hardware_flops,
        paper_hfu=flops.utilization(paper_hardware_flops, t, scenario.num_gpus, peak),
        tokens_per_s_per_gpu=B * s / t / scenario.num_gpus,
        mfu_peak_flop_per_s=peak,
        mfu_peak_dtype=(tr.dtype if tr.dtype in (Dtype.FP32, Dtype.FP16) else Dtype.BF16).value,
        fp8_peak_flop_per_s=hw.peak_fp8_flop_per_s if tr.dtype is Dtype.FP8 else None,
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
