"""One configuration -> one result row: prune by memory, else simulate; never raise.

Pruning uses `stage_memory_estimate`, which replays each stage's task order without the
engine and gives the engine's exact peaks, so an out-of-memory row costs one workload and
schedule build, not a simulation. A configuration that raises becomes an `error` row.
By default the engine runs once at a reduced microbatch count and its certified steady
state is extended to m (`simcluster.steady_state`: the full run's numbers to float
rounding, ~3x fewer tasks on issue 9's spec); `steady_state=False` simulates every microbatch.
"""

from __future__ import annotations

import math
import traceback
from typing import Any, Literal

from simcluster import memory_plan, simulation, units
from simcluster.config.hardware import HardwareProfile
from simcluster.results import StageMemory
from simcluster.sweep.expand import SweepConfig
from simcluster.workload.model import build_workload

Status = Literal["ok", "oom", "error"]
Row = dict[str, Any]

METRIC_COLUMNS = ("iteration_time_s", "mfu", "hfu", "bubble_fraction", "tflops_per_gpu")


def _describe(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


def _memory_fields(stages: tuple[StageMemory, ...]) -> Row:
    peaks = [stage.peak_memory_bytes for stage in stages]
    fullest = max(range(len(peaks)), key=peaks.__getitem__)
    capacity = stages[fullest].capacity_bytes
    return {
        "max_stage_peak_memory_bytes": peaks[fullest],
        "memory_headroom_bytes": capacity - peaks[fullest],
        "fullest_stage": fullest,
        "fits": all(stage.fits for stage in stages),
        "stage_peak_memory_bytes": peaks,
    }


def _empty_row(config: SweepConfig) -> Row:
    scenario = config.scenario
    return {
        "config_id": config.config_id,
        **config.layout,
        "num_gpus": scenario.num_gpus,
        "num_microbatches": scenario.num_microbatches,
        "status": "error",
        **{column: math.nan for column in METRIC_COLUMNS},
        "max_stage_peak_memory_bytes": math.nan,
        "memory_headroom_bytes": math.nan,
        "fullest_stage": None,
        "fits": None,
        "stage_peak_memory_bytes": [],
        "num_events": 0,
        "message": "",
    }


def evaluate(config: SweepConfig, hw: HardwareProfile, steady_state: bool = True) -> Row:
    """The row for one configuration: status ok (simulated), oom (pruned) or error."""
    row = _empty_row(config)
    try:
        workload = build_workload(config.scenario)
        row.update(_memory_fields(memory_plan.stage_memory_estimate(config.scenario, hw, workload)))
        if not row["fits"]:
            need_gb = units.bytes_to_gb(row["max_stage_peak_memory_bytes"])
            row["status"] = "oom"
            row["message"] = (
                f"stage {row['fullest_stage']} needs {need_gb:.1f} GB, "
                f"has {units.bytes_to_gb(hw.memory_bytes):.1f} GB"
            )
            return row
        result = simulation.run_simulation(
            config.scenario, hw, workload=workload, steady_state=steady_state
        ).result
    except Exception as error:  # noqa: BLE001 - a failing configuration must not stop the sweep
        row["status"], row["message"] = "error", _describe(error)
        return row
    row.update(_memory_fields(result.stages))
    row.update({column: getattr(result, column) for column in METRIC_COLUMNS})
    row["status"], row["num_events"] = "ok", result.num_events
    return row


def evaluate_batch(configs: list[SweepConfig], hw: HardwareProfile, steady_state: bool = True) -> list[Row]:
    """A worker's unit of work: several configurations per message keeps IPC off the profile."""
    return [evaluate(config, hw, steady_state) for config in configs]
