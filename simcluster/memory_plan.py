"""Per-stage peak memory without running the engine: replay each stage's task order,
adding a chunk's stored activations at its forward and freeing them at its backward.

Gives the same numbers as the engine's memory tracker (a test proves it) at a fraction of
the cost, so sweeps can prune configurations that cannot fit before simulating them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from simcluster.config.hardware import HardwareProfile
from simcluster.config.scenario import Scenario
from simcluster.results import StageMemory
from simcluster.schedule import build_schedule
from simcluster.schedule.tasks import Phase
from simcluster.workload import memory
from simcluster.workload.model import (
    StageWork,
    Workload,
    build_workload,
    recompute_workspace_bytes,
    transient_bytes,
)


def stage_memory_estimate(
    scenario: Scenario, hw: HardwareProfile, workload: Workload | None = None
) -> tuple[StageMemory, ...]:
    workload = workload or build_workload(scenario)
    par = scenario.parallel
    schedule = build_schedule(scenario.training.schedule, par.pp, scenario.num_microbatches, par.vpp)
    transient = transient_bytes(workload)
    rows = []
    for stage, tasks in zip(workload.stages, schedule):
        chunk_saved = [chunk.saved_bytes for chunk in stage.chunks]
        stored = peak_stored = peak_total = 0.0
        for task in tasks:
            chunk_bytes = chunk_saved[task.chunk]
            if task.phase is Phase.FORWARD:
                stored += chunk_bytes
                peak_stored = max(peak_stored, stored)
                peak_total = max(peak_total, stored)
            else:
                peak_total = max(peak_total, stored + transient)
                stored -= chunk_bytes
        rows.append(stage_memory_row(stage, peak_stored, peak_total, hw))
    return tuple(rows)


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
        capacity_bytes=hw.usable_memory_bytes,
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
    workload = build_workload(scenario)
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
