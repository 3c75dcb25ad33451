"""`simcluster plan`: the K fastest layouts that fit in memory, exactly, without simulating most.

1. Enumerate the layouts Megatron accepts (`simcluster.plan.space`).
2. For each, its static memory (weights, gradients, optimizer state: a lower bound on its
   peak) and, when that fits, a quick lower bound on its time bound from its layers' prices
   alone (`simcluster.plan.layer_bound`).
3. Visit layouts in order of increasing full bound (`simcluster.plan.bound`: the stages
   priced, cached per chunk), computed only when a layout reaches the front of the order
   (`simcluster.plan.order`: the order is that of sorting every layout by its full bound).
   A layout whose static memory already exceeds the limit is pruned; one whose memory floor
   (`simcluster.plan.memory_floor`) does is counted as not fitting; otherwise its exact
   per-stage peak (`memory_plan`, no engine) decides whether it fits; a fitting layout is
   event-simulated. Once K layouts are simulated, any layout whose bound exceeds the K-th
   best time cannot enter the top K, and neither can any later one (bounds only grow): the
   search stops. The answer is the same as simulating every layout that fits (a test runs
   both), ties broken by enumeration order; docs/plan.md ("Speed") says what each step saves.

A layout fits when its fullest stage leaves `headroom_fraction` of the device's capacity
free: peak ≤ (1 − headroom) · capacity.

With `workers > 1` a process pool evaluates layouts at most two per worker ahead of the
bound check (sweep's executor submits a whole expansion up front in cost order, so it could
not stop at the bound); a layout evaluated speculatively only adds to `simulated`, never
changes the answer.
"""

from __future__ import annotations

import gc
import math
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any

from simcluster import memory_plan, units
from simcluster.config.errors import ConfigError
from simcluster.config.hardware import HardwareProfile
from simcluster.config.megatron_args import to_megatron_args
from simcluster.config.scenario import Scenario
from simcluster.costs.stage_pricing import StagePricing
from simcluster.engine.gc_tuning import GC_THRESHOLDS
from simcluster.headroom import (
    DEFAULT_HEADROOM_FRACTION,
    capacity_bytes,
    headroom_problem,
    memory_limit_bytes,
)
from simcluster.plan.bound import bound_inputs, lower_bound_s
from simcluster.plan.layer_bound import QuickBound
from simcluster.plan.memory_floor import peak_floor_bytes
from simcluster.plan.order import BoundOrder
from simcluster.plan.space import (
    PLAN_AXES,
    PlanError,
    SearchSpace,
    axis_section,
    candidates,
    explain_no_layout,
    plan_axes,
    search_space,
)
from simcluster.profiler.bench.progress import StderrProgress
from simcluster.simulation import run_simulation
from simcluster.sweep.axes import AxisValue
from simcluster.workload.model import build_workload

DEFAULT_TOP = 10
BOUND_ROUNDING = 1e-12  # relative float slack between the bound's sums and the engine's


@dataclass(frozen=True, slots=True)
class Candidate:
    """A layout to visit: its enumeration index, scenario, time bound and static memory."""

    index: int
    scenario: Scenario
    bound_s: float
    static_bytes: float  # the fullest stage's weights + gradients + optimizer state
    bound_exact: bool = True  # False: bound_s is the quick bound (`plan.layer_bound`), ≤ the full one
    peak_floor_bytes: float = 0.0  # set by `refine`: ≤ the exact peak (`plan.memory_floor`)


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A visited layout: its exact peak, and its simulated metrics if it fits."""

    index: int
    peak_memory_bytes: float
    fullest_stage: int
    fits: bool
    iteration_time_s: float = math.nan
    mfu: float = math.nan


@dataclass(frozen=True, slots=True)
class PlanCandidate:
    """One layout of the answer."""

    scenario: Scenario
    iteration_time_s: float
    mfu: float
    tokens_per_s_per_gpu: float
    peak_memory_bytes: float
    capacity_bytes: float
    megatron_args: str | None  # None where the export refuses the layout (`megatron_args_problem`)
    lower_bound_s: float
    megatron_args_problem: str | None = None

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.peak_memory_bytes

    def to_json_dict(self) -> dict[str, Any]:
        problem = (
            {}
            if self.megatron_args_problem is None
            else {"megatron_args_problem": self.megatron_args_problem}
        )
        return {
            "scenario": self.scenario.model_dump(mode="json"),
            "iteration_time_s": self.iteration_time_s,
            "mfu": self.mfu,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "capacity_bytes": self.capacity_bytes,
            "headroom_bytes": self.headroom_bytes,
            "megatron_args": self.megatron_args,
            "lower_bound_s": self.lower_bound_s,
            **problem,  # why megatron_args is null, only then
        }


@dataclass(frozen=True, slots=True)
class PlanResult:
    candidates: tuple[PlanCandidate, ...]  # best first
    num_gpus: int
    hardware: str
    headroom_fraction: float
    capacity_bytes: float
    searched: int  # layouts Megatron accepts
    pruned_memory: int  # visited, did not fit
    pruned_bound: int  # never visited: their bound exceeds the K-th best time
    simulated: int
    elapsed_s: float
    axes: tuple[str, ...] = ()  # the searched axes (`space.plan_axes`): ep and etp for a MoE model

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "candidates": [candidate.to_json_dict() for candidate in self.candidates],
            "searched": self.searched,
            "pruned_memory": self.pruned_memory,
            "pruned_bound": self.pruned_bound,
            "simulated": self.simulated,
            "elapsed_s": self.elapsed_s,
            "num_gpus": self.num_gpus,
            "hardware": self.hardware,
            "headroom_fraction": self.headroom_fraction,
            "capacity_bytes": self.capacity_bytes,
            "axes": list(self.axes),
        }


def check_headroom(headroom_fraction: float) -> None:
    problem = headroom_problem(headroom_fraction)
    if problem is not None:
        raise PlanError(problem)


STATIC_FREE_FIELDS = {
    "parallel": ("sequence_parallel",),
    "training": ("micro_batch_size", "recompute", "overlap_grad_reduce", "overlap_param_gather"),
}
"""Searched fields a stage's weights, gradients and optimizer state do not depend on
(activations and communication only): layouts that differ only in them share one static
memory (`static_key`; a test checks it against each layout's own workload)."""


def static_key(scenario: Scenario) -> Scenario:
    """`scenario` with the `STATIC_FREE_FIELDS` blanked (None): equal keys, equal static
    memory. A key only, never simulated."""
    update = {
        section: getattr(scenario, section).model_copy(update=dict.fromkeys(names, None))
        for section, names in STATIC_FREE_FIELDS.items()
    }
    return scenario.model_copy(update=update)


def prepare(
    space: SearchSpace,
    limit_bytes: float,
    progress: bool = False,
    pricing: StagePricing | None = None,
    quick: bool = False,
) -> list[Candidate]:
    """Every layout with its static memory and, when that fits under `limit_bytes`, its
    time bound (infinite otherwise: it is pruned without one), in enumeration order. The
    static memory is the workload's (expert weights and gradients sharded over ep·etp, their
    optimizer state over the expert-data-parallel group), computed once per `static_key`:
    a layout pruned by it costs no workload. With `quick` the bound is the quick one
    (`plan.layer_bound`, `bound_exact` False), refined by `refine` when the search needs it."""
    pricing = pricing or StagePricing(space.hardware)
    quick_bound = QuickBound(pricing) if quick else None
    prepared = []
    layouts = list(candidates(space))
    statics: dict[Scenario, float] = {}
    with StderrProgress("plan: bounds") as bar:
        if progress:
            bar.start(len(layouts))
        for index, scenario in enumerate(layouts):
            key = static_key(scenario)
            workload = None
            if key not in statics:
                workload = build_workload(scenario, space.hardware.fp8_weight_copies)
                statics[key] = max(stage.static.total_bytes for stage in workload.stages)
            static = statics[key]
            bound = math.inf
            if static <= limit_bytes and quick_bound is not None:
                prepared.append(Candidate(index, scenario, quick_bound.bound_s(scenario), static, False))
            else:
                if static <= limit_bytes:
                    workload = workload or build_workload(scenario, space.hardware.fp8_weight_copies)
                    bound = lower_bound_s(bound_inputs(scenario, space.hardware, workload, pricing))
                prepared.append(Candidate(index, scenario, bound, static))
            if progress:
                bar.step("")
    return prepared


def refine(candidate: Candidate, hw: HardwareProfile, pricing: StagePricing) -> Candidate:
    """`candidate` with its full time bound (`bound.lower_bound_s`) and its peak memory's
    floor (`memory_floor.peak_floor_bytes`), both from its workload."""
    if candidate.bound_exact:
        return candidate
    scenario = candidate.scenario
    workload = build_workload(scenario, hw.fp8_weight_copies)
    bound = lower_bound_s(bound_inputs(scenario, hw, workload, pricing))
    floor = peak_floor_bytes(scenario, workload)
    return replace(candidate, bound_s=bound, bound_exact=True, peak_floor_bytes=floor)


def evaluate_candidate(
    candidate: Candidate, hw: HardwareProfile, limit_bytes: float, pricing: StagePricing | None = None
) -> Evaluation:
    """Exact peak memory without the engine; the simulation only if it fits (priced by
    `pricing`, of `hw`, when the caller shares one)."""
    scenario = candidate.scenario
    workload = build_workload(scenario, hw.fp8_weight_copies)
    peaks = [stage.peak_memory_bytes for stage in memory_plan.stage_memory_estimate(scenario, hw, workload)]
    fullest = max(range(len(peaks)), key=peaks.__getitem__)
    if peaks[fullest] > limit_bytes:
        return Evaluation(candidate.index, peaks[fullest], fullest, fits=False)
    result = run_simulation(scenario, hw, workload=workload, pricing=pricing).result
    return Evaluation(candidate.index, peaks[fullest], fullest, True, result.iteration_time_s, result.mfu)


_WORKER: tuple[HardwareProfile, float, StagePricing] | None = None


def _init_worker(hw: HardwareProfile, limit_bytes: float) -> None:
    global _WORKER
    _WORKER = (hw, limit_bytes, StagePricing(hw))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.set_threshold(*GC_THRESHOLDS)


def _pool_evaluate(candidate: Candidate) -> Evaluation:
    assert _WORKER is not None
    return evaluate_candidate(candidate, *_WORKER)


class _InlineExecutor:
    """The pool's interface, run in this process (workers = 1)."""

    def __init__(self, task: Callable[[Candidate], Evaluation]) -> None:
        self.task = task

    def submit(self, candidate: Candidate) -> Future[Evaluation]:
        future: Future[Evaluation] = Future()
        future.set_result(self.task(candidate))
        return future

    def shutdown(self) -> None:
        pass


class _PoolExecutor:
    def __init__(self, hw: HardwareProfile, limit_bytes: float, workers: int) -> None:
        self.pool = ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(hw, limit_bytes))

    def submit(self, candidate: Candidate) -> Future[Evaluation]:
        return self.pool.submit(_pool_evaluate, candidate)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


@dataclass(slots=True)
class _Tally:
    best: list[tuple[float, int]]  # (iteration time, index) of the top K, sorted
    top: int
    pruned_memory: int = 0
    pruned_bound: int = 0
    simulated: int = 0

    def threshold_s(self) -> float:
        return self.best[-1][0] if len(self.best) == self.top else math.inf

    def record(self, evaluation: Evaluation) -> None:
        if not evaluation.fits:
            self.pruned_memory += 1
            return
        self.simulated += 1
        self.best.append((evaluation.iteration_time_s, evaluation.index))
        self.best.sort()
        del self.best[self.top :]


def _visit(
    order: BoundOrder[Candidate],
    executor: _InlineExecutor | _PoolExecutor,
    tally: _Tally,
    window: int,
    use_bound: bool,
    step: Callable[[str], None],
    limit_bytes: float = math.inf,
) -> dict[int, Evaluation]:
    """Evaluate `order` (layouts whose static memory fits, by increasing full bound), at
    most `window` at a time, until the bound rules the rest out. A layout whose peak floor
    exceeds `limit_bytes` is not evaluated: its evaluation would say it does not fit (and a
    layout that does not fit changes nothing else), so it is resolved in place, in the same
    window slot, and the counts stay those of evaluating it."""
    evaluations: dict[int, Evaluation] = {}
    pending: set[Future[Evaluation]] = set()
    while True:
        while order and len(pending) < window:
            candidate = order.peek()
            # A tight bound (every task host-bound: costs.host) can equal a layout's time
            # yet exceed it by a rounding: such a tie must still be simulated.
            if use_bound and candidate.bound_s > tally.threshold_s() * (1 + BOUND_ROUNDING):
                tally.pruned_bound = len(order)
                for _ in range(tally.pruned_bound):
                    step("pruned by bound")
                order.clear()
                break
            candidate = order.pop()
            if candidate.peak_floor_bytes > limit_bytes:
                # resolved here, but it takes its place in the window as an evaluation would
                doomed: Future[Evaluation] = Future()
                doomed.set_result(Evaluation(candidate.index, candidate.peak_floor_bytes, 0, fits=False))
                pending.add(doomed)
            else:
                pending.add(executor.submit(candidate))
        if not pending:
            return evaluations
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        for future in done:
            evaluation = future.result()
            evaluations[evaluation.index] = evaluation
            tally.record(evaluation)
            step("simulated" if evaluation.fits else "pruned: memory")


def _smallest_peak(prepared: Iterable[Candidate], hw: HardwareProfile) -> tuple[float, int, Candidate]:
    """The layout needing the least memory: exact peaks in order of static memory (a lower
    bound of the peak), stopping once no remaining layout can need less."""
    best: tuple[float, int, Candidate] | None = None
    for candidate in sorted(prepared, key=lambda c: (c.static_bytes, c.index)):
        if best is not None and candidate.static_bytes >= best[0]:
            break
        evaluation = evaluate_candidate(candidate, hw, limit_bytes=-math.inf)
        if best is None or evaluation.peak_memory_bytes < best[0]:
            best = (evaluation.peak_memory_bytes, evaluation.fullest_stage, candidate)
    assert best is not None
    return best


def describe_layout(scenario: Scenario) -> str:
    par, tr = scenario.parallel, scenario.training
    layout = {**par.model_dump(mode="json"), **tr.model_dump(mode="json")}
    names = [
        name for name in layout_columns(plan_axes(scenario)) if name != "cp" or par.cp > 1
    ]  # cp when used
    return ", ".join(f"{name} {layout[name]}" for name in names)


def layout_columns(axes: tuple[str, ...] = PLAN_AXES) -> list[str]:
    """tp, pp, dp and the other searched `axes`: a layout's columns, in output order."""
    return ["tp", "pp", "dp", *axes[2:]]


def _no_fit_error(prepared: list[Candidate], space: SearchSpace, headroom: float) -> PlanError:
    peak, stage, candidate = _smallest_peak(prepared, space.hardware)
    capacity = capacity_bytes(space.hardware)
    limit_gb = units.bytes_to_gb((1 - headroom) * capacity)
    hint = "use more GPUs or a device with more memory"
    if peak <= capacity:
        hint = f"it would fit with --headroom {1 - peak / capacity:.3f} or less; or {hint}"
    return PlanError(
        f"--gpus {space.num_gpus}: no layout fits in {limit_gb:.1f} GB ({units.bytes_to_gb(capacity):.1f} GB "
        f"with --headroom {headroom}): the smallest peak is {units.bytes_to_gb(peak):.1f} GB "
        f"(stage {stage} of {describe_layout(candidate.scenario)}); {hint}"
    )


def _layout_name(base: str, scenario: Scenario) -> str:
    par, tr = scenario.parallel, scenario.training
    switches = (
        ("sp", par.sequence_parallel),
        ("distopt", tr.use_distributed_optimizer),
        ("overlap", tr.overlap_grad_reduce),
    )
    flags = "".join(f"-{label}" for label, on in switches if on)
    cp = f"-cp{par.cp}" if par.cp > 1 else ""
    experts = f"-ep{par.ep}-etp{par.etp}" if scenario.model.moe is not None else ""
    return (
        f"{base}-tp{par.tp}{cp}-pp{par.pp}-dp{par.dp}{experts}-vpp{par.vpp}-mbs{tr.micro_batch_size}"
        f"{flags}-{tr.recompute.value}"
    )


def _megatron_args(scenario: Scenario, hw: HardwareProfile) -> tuple[str | None, str | None]:
    """The launch line, or None and why the export refuses it (the MoE flags are written by
    `config.megatron_export` once they are supported)."""
    try:
        return to_megatron_args(scenario, hw.network.gpus_per_node), None
    except ConfigError as error:
        return None, "; ".join(error.problems)


def _answer(candidate: Candidate, evaluation: Evaluation, hw: HardwareProfile) -> PlanCandidate:
    scenario = candidate.scenario
    scenario = scenario.model_copy(update={"name": _layout_name(scenario.name, scenario)})
    args, problem = _megatron_args(scenario, hw)
    tokens = scenario.training.global_batch_size * scenario.model.seq_length
    return PlanCandidate(
        scenario=scenario,
        iteration_time_s=evaluation.iteration_time_s,
        mfu=evaluation.mfu,
        tokens_per_s_per_gpu=tokens / (evaluation.iteration_time_s * scenario.num_gpus),
        peak_memory_bytes=evaluation.peak_memory_bytes,
        capacity_bytes=capacity_bytes(hw),
        megatron_args=args,
        megatron_args_problem=problem,
        lower_bound_s=candidate.bound_s,
    )


def plan_layouts(
    base: Scenario,
    hardware: HardwareProfile,
    num_gpus: int,
    *,
    headroom_fraction: float = DEFAULT_HEADROOM_FRACTION,
    top: int = DEFAULT_TOP,
    workers: int = 1,
    use_bound: bool = True,
    progress: bool = False,
    choices: Mapping[str, Sequence[AxisValue]] | None = None,
) -> PlanResult:
    """The `top` fastest layouts of `base`'s model on `num_gpus` GPUs of `hardware` that
    leave `headroom_fraction` of memory free. `use_bound=False` simulates every layout that
    fits (the exhaustive answer the bound must reproduce); `choices` pins axes to listed
    values (`space.search_space`). Raises PlanError on input no layout can serve."""
    start_s = time.perf_counter()
    check_headroom(headroom_fraction)
    if num_gpus < 1 or top < 1:
        raise PlanError(f"--gpus {num_gpus} / --top {top}: both must be positive integers")
    space = search_space(base, hardware, num_gpus, choices)
    limit = memory_limit_bytes(hardware, headroom_fraction)
    pricing = StagePricing(hardware)  # the bounds' prices serve the simulations too
    prepared = prepare(space, limit, progress, pricing, quick=True)
    if not prepared:
        raise PlanError(explain_no_layout(space))

    def refined(candidate: Candidate) -> Candidate:
        prepared[candidate.index] = refine(candidate, hardware, pricing)  # the answer's bound
        return prepared[candidate.index]

    order = BoundOrder((c for c in prepared if c.static_bytes <= limit), refined)
    tally = _Tally(best=[], top=top, pruned_memory=len(prepared) - len(order))
    inline = _InlineExecutor(lambda c: evaluate_candidate(c, hardware, limit, pricing))
    executor = inline if workers <= 1 else _PoolExecutor(hardware, limit, workers)
    try:
        with StderrProgress("plan: simulate") as bar:
            if progress:
                bar.start(len(order))
            step = bar.step if progress else (lambda _label: None)
            evaluations = _visit(order, executor, tally, 2 * max(1, workers), use_bound, step, limit)
    finally:
        executor.shutdown()
    if tally.simulated == 0:
        raise _no_fit_error(prepared, space, headroom_fraction)
    answer = tuple(_answer(prepared[index], evaluations[index], hardware) for _, index in tally.best)
    return PlanResult(
        candidates=answer,
        num_gpus=num_gpus,
        hardware=hardware.name,
        headroom_fraction=headroom_fraction,
        capacity_bytes=capacity_bytes(hardware),
        searched=len(prepared),
        pruned_memory=tally.pruned_memory,
        pruned_bound=tally.pruned_bound,
        simulated=tally.simulated,
        elapsed_s=time.perf_counter() - start_s,
        axes=plan_axes(base),
    )


def differing_axes(result: PlanResult) -> list[str]:
    """The layout columns (tp, pp, dp and the searched axes) whose value is not the same
    in every candidate of the answer."""
    differing = []
    for column in layout_columns(result.axes):
        section = axis_section(column)
        values = {getattr(getattr(c.scenario, section), column) for c in result.candidates}
        if len(values) > 1:
            differing.append(column)
    return differing
