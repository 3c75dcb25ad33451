"""Per-stage peak memory without running the engine: replay each stage's task order,
adding a chunk's stored activations at its forward and freeing them at its backward (or,
where the sums are exact, take the largest of the few in-flight states the order goes
through, computed once per schedule).

Gives the same numbers as the engine's memory tracker (a test proves it) at a fraction of
the cost, so sweeps can prune configurations that cannot fit before simulating them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from operator import ge, mul
from typing import Any

from simcluster.config.choices import ScheduleKind
from simcluster.config.hardware import HardwareProfile
from simcluster.config.scenario import Scenario
from simcluster.headroom import capacity_bytes
from simcluster.results import StageMemory
from simcluster.schedule import (
    build_schedule,
    ep_overlap_extra_warmup,
    unpaired_positions,
    warmup_microbatches,
)
from simcluster.schedule.in_flight import InFlightStates, chunk_in_flight_states
from simcluster.schedule.ordering import StageTasks
from simcluster.schedule.tasks import Phase
from simcluster.workload import memory
from simcluster.workload.model import (
    ChunkWork,
    StageWork,
    Workload,
    build_workload,
    recompute_workspace_bytes,
    transient_bytes,
)


def stage_memory_estimate(
    scenario: Scenario, hw: HardwareProfile, workload: Workload | None = None
) -> tuple[StageMemory, ...]:
    workload = workload or build_workload(scenario, hw.fp8_weight_copies)
    par = scenario.parallel
    kind, m = scenario.training.schedule, scenario.num_microbatches
    ep_overlap = scenario.training.overlap_moe_expert_parallel_comm
    extra = ep_overlap_extra_warmup(ep_overlap)
    transient = transient_bytes(workload)
    rows = []
    states = _states(kind, par.pp, m, par.vpp, extra)
    for r, stage in enumerate(workload.stages):
        chunk_saved = [chunk.saved_bytes for chunk in stage.chunks]
        peaks = None if ep_overlap else exact_peaks(states[r], chunk_saved, transient)
        if peaks is None:
            tasks = build_schedule(kind, par.pp, m, par.vpp, extra)[r]
            paired = None
            if ep_overlap:  # the pairs' layer-by-layer overlap of memory, replayed as the engine runs it
                warmup = warmup_microbatches(kind, par.pp, r, m, par.vpp, extra)
                paired = (
                    unpaired_positions(tasks, warmup),
                    [paired_forward_head_bytes(c) for c in stage.chunks],
                )
            peaks = replayed_peaks(tasks, chunk_saved, transient, paired)
        rows.append(stage_memory_row(stage, *peaks, hw))
    return tuple(rows)


def paired_forward_head_bytes(chunk: ChunkWork) -> float:
    """What a forward paired with a backward under the EP overlap stores before the backward
    frees anything: its embedding (the chunk's pre_process) and one layer. Megatron-core's
    combined step runs forward layer i with backward layer n − 1 − i and releases the
    backward layer's state after each pair (`TransformerModelChunkSchedulePlan.run`,
    megatron/core/models/common/model_chunk_schedule_plan.py @d98e8a64), so the forward's
    activations grow one layer ahead of the backward's frees; the rest of them is stored as
    the backward ends (`engine.plan.TaskWork.deferred_bytes`). Taken as the chunk's largest
    layer: layers of equal size on both sides."""
    layer = max((segment.layer.saved_bytes for segment in chunk.segments if segment.num_layers), default=0.0)
    return (chunk.embedding.saved_bytes if chunk.embedding is not None else 0.0) + layer


@lru_cache(maxsize=256)
def _states(
    kind: ScheduleKind, pp: int, m: int, vpp: int, extra_warmup: int = 0
) -> tuple[InFlightStates, ...]:
    """Per stage, the in-flight states of its task order that no other state of the same
    kind holds at least as many of every chunk as (with bytes >= 0 the peaks are among
    them). Cached: they depend only on the schedule, and a sweep's layouts share a few."""
    return tuple(
        (maximal_states(after_forward), maximal_states(before_backward))
        for after_forward, before_backward in (
            chunk_in_flight_states(tasks, vpp) for tasks in build_schedule(kind, pp, m, vpp, extra_warmup)
        )
    )


def maximal_states(states: frozenset[tuple[int, ...]]) -> frozenset[tuple[int, ...]]:
    """The states no other state holds at least as many of every chunk as. In order of
    decreasing total, a state can only be dominated by one already kept (a dominating
    state has a larger total, or is equal)."""
    kept: list[tuple[int, ...]] = []
    for state in sorted(states, key=sum, reverse=True):
        if not any(all(map(ge, other, state)) for other in kept):
            kept.append(state)
    return frozenset(kept)


EXACT_FLOAT_INTEGERS = 2.0**53  # every integer below this is a float, and so is their sum


def exact_peaks(
    states: InFlightStates, chunk_saved: list[float], transient: float
) -> tuple[float, float] | None:
    """(peak stored, peak stored + transient) from the stage's in-flight states, or None
    unless the replay's running sums are exact: whole numbers of bytes whose largest sum
    is below 2^53. Then every float sum the replay (and the engine's tracker) takes is the
    exact integer, whatever the order, so the peak over the states is the replay's, bit
    for bit; other values are replayed. `states` may leave out states another one
    dominates (no more of any chunk): with bytes >= 0 they hold no more."""
    after_forward, before_backward = states
    values = [*chunk_saved, transient]
    if not all(value >= 0 and float(value).is_integer() for value in values):
        return None
    seen = after_forward | before_backward
    largest = [max((state[c] for state in seen), default=0) for c in range(len(chunk_saved))]
    if _bytes(tuple(largest), chunk_saved) + transient >= EXACT_FLOAT_INTEGERS:
        return None
    peak_stored = max((_bytes(state, chunk_saved) for state in after_forward), default=0.0)
    held = [_bytes(state, chunk_saved) + transient for state in before_backward]
    return peak_stored, max(0.0, peak_stored, *held)


def _bytes(state: tuple[int, ...], chunk_saved: list[float]) -> float:
    return sum(map(mul, state, chunk_saved))


def replayed_peaks(
    tasks: StageTasks, chunk_saved: list[float], transient: float,
    paired: tuple[frozenset[int], list[float]] | None = None,
) -> tuple[float, float]:  # fmt: skip
    """Replay the stage's order: a chunk's forward adds its stored activations at its start,
    its backward holds the transient bytes while it runs and frees the chunk's at its end.
    `paired` (the EP overlap: the unpaired positions and each chunk's head bytes): a paired
    forward adds its head at its start and the rest when the backward after it ends, as the
    engine does (`engine.plan.TaskWork.deferred_bytes`)."""
    unpaired, heads = paired if paired is not None else (None, [])
    stored = peak_stored = peak_total = pending = 0.0
    for position, task in enumerate(tasks):
        chunk_bytes = chunk_saved[task.chunk]
        if task.phase is Phase.FORWARD:
            if unpaired is not None and position not in unpaired:
                stored += heads[task.chunk]
                pending += chunk_bytes - heads[task.chunk]
            else:
                stored += chunk_bytes
            peak_stored = max(peak_stored, stored)
            peak_total = max(peak_total, stored)
        else:
            peak_total = max(peak_total, stored + transient)
            stored -= chunk_bytes
            if pending:
                stored += pending
                pending = 0.0
                peak_stored = max(peak_stored, stored)
                peak_total = max(peak_total, stored)
    return peak_stored, peak_total


def stage_memory_row(
    stage: StageWork, peak_stored_bytes: float, peak_activations_bytes: float, hw: HardwareProfile
) -> StageMemory:
    """A stage's memory: static bytes, peak stored activations, and the peak of stored plus
    transient (recompute workspace) bytes on top of the static ones."""
    return StageMemory(
        stage=stage.stage,
        weight_bytes=stage.static.weight_bytes,
        gradient_bytes=stage.static.gradient_bytes,
        optimizer_bytes=stage.static.optimizer_bytes,
        activation_bytes=peak_stored_bytes,
        transient_bytes=peak_activations_bytes - peak_stored_bytes,
        peak_memory_bytes=stage.static.total_bytes + peak_activations_bytes,
        capacity_bytes=capacity_bytes(hw),
    )


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """`simcluster memory`: where each stage's bytes go, per Korthikanti §4."""

    scenario: str
    table2_row: str
    predicted_bytes_per_layer: float
    layers_per_stage: int
    interleave_factor: float
    embedding_bytes_per_microbatch: float
    output_bytes_per_microbatch: float
    transient_bytes: float
    stages: tuple[StageMemory, ...]
    stage_num_layers: tuple[int, ...] = ()

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "table2_row": self.table2_row,
            "predicted_bytes_per_layer": self.predicted_bytes_per_layer,
            "layers_per_stage": self.layers_per_stage,
            "interleave_factor": self.interleave_factor,
            "embedding_bytes_per_microbatch": self.embedding_bytes_per_microbatch,
            "output_bytes_per_microbatch": self.output_bytes_per_microbatch,
            "transient_bytes": self.transient_bytes,
            "stages": [{**asdict(stage), "fits": stage.fits} for stage in self.stages],
            "stage_num_layers": list(self.stage_num_layers),
        }


def memory_report(scenario: Scenario, hw: HardwareProfile) -> MemoryReport:
    workload = build_workload(scenario, hw.fp8_weight_copies)
    par = scenario.parallel
    first, last = workload.stages[0].chunks[0], workload.stages[-1].chunks[-1]
    split = scenario.pipeline_split
    return MemoryReport(
        scenario=scenario.name,
        table2_row=memory.table2_row(par.tp, par.sequence_parallel, scenario.training.recompute).value,
        predicted_bytes_per_layer=workload.layer.saved_bytes,
        layers_per_stage=split.stage_layers[0],
        interleave_factor=memory.interleave_factor(par.pp, par.vpp),
        embedding_bytes_per_microbatch=first.embedding.saved_bytes if first.embedding else 0.0,
        output_bytes_per_microbatch=last.output.saved_bytes if last.output else 0.0,
        transient_bytes=recompute_workspace_bytes(workload),
        stages=stage_memory_estimate(scenario, hw, workload),
        stage_num_layers=split.stage_layers,
    )
