"""One configuration -> one result row: prune by memory, else simulate; never raise.

A configuration fits only if its fullest stage leaves `headroom_fraction` of the device's
usable capacity free (`simcluster.headroom`, the same rule as `plan`). Pruning uses
`stage_memory_estimate`, which replays each stage's task order without the
engine and gives the engine's exact peaks, so an out-of-memory row costs one workload and
schedule build, not a simulation. A configuration that raises becomes an `error` row.
By default the engine runs once at a reduced microbatch count and its certified steady
state is extended to m (`simcluster.steady_state`: the full run's numbers to float
rounding, ~3x fewer tasks on issue 9's spec); `steady_state=False` simulates every microbatch.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from simcluster import memory_plan, simulation, units
from simcluster.config.hardware import HardwareProfile
from simcluster.costs.stage_pricing import StagePricing
from simcluster.headroom import DEFAULT_HEADROOM_FRACTION, capacity_bytes, memory_limit_bytes
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


@dataclass(frozen=True, slots=True)
class SweepInputs:
    """What every worker needs besides the configurations: the hardware profiles by the
    reference a configuration's scenario names (`Scenario.hardware`), the headroom, and
    whether the engine's certified steady state is extended from one short run."""

    profiles: Mapping[str, HardwareProfile] = field(default_factory=dict)
    headroom_fraction: float = DEFAULT_HEADROOM_FRACTION
    steady_state: bool = True  # False: simulate every microbatch (sweep --full-simulation)

    def profile(self, config: SweepConfig) -> HardwareProfile:
        return self.profiles[config.scenario.hardware]


def _memory_fields(stages: tuple[StageMemory, ...], hw: HardwareProfile, headroom_fraction: float) -> Row:
    peaks = [stage.peak_memory_bytes for stage in stages]
    fullest = max(range(len(peaks)), key=peaks.__getitem__)
    capacity = capacity_bytes(hw)
    return {
        "max_stage_peak_memory_bytes": peaks[fullest],
        "memory_headroom_bytes": capacity - peaks[fullest],
        "fullest_stage": fullest,
        "fits": peaks[fullest] <= memory_limit_bytes(hw, headroom_fraction),
        "stage_peak_memory_bytes": peaks,
        "capacity_bytes": capacity,
    }


def _empty_row(config: SweepConfig, hw: HardwareProfile, headroom_fraction: float) -> Row:
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
        "capacity_bytes": capacity_bytes(hw),
        "headroom_fraction": headroom_fraction,
    }


def evaluate(
    config: SweepConfig,
    hw: HardwareProfile,
    headroom_fraction: float = DEFAULT_HEADROOM_FRACTION,
    steady_state: bool = True,
    pricing: StagePricing | None = None,
) -> Row:
    """The row for one configuration: status ok (simulated), oom (pruned: its fullest stage
    does not leave `headroom_fraction` of `hw`'s usable memory free) or error. `pricing`
    (of `hw`) shares its cached prices with the batch's other configurations."""
    row = _empty_row(config, hw, headroom_fraction)
    try:
        workload = build_workload(config.scenario, hw.fp8_weight_copies)
        stages = memory_plan.stage_memory_estimate(config.scenario, hw, workload)
        row.update(_memory_fields(stages, hw, headroom_fraction))
        if not row["fits"]:
            need_gb = units.bytes_to_gb(row["max_stage_peak_memory_bytes"])
            limit_gb = units.bytes_to_gb(memory_limit_bytes(hw, headroom_fraction))
            row["status"] = "oom"
            row["message"] = (
                f"stage {row['fullest_stage']} needs {need_gb:.1f} GB, may use {limit_gb:.1f} GB "
                f"({units.bytes_to_gb(capacity_bytes(hw)):.1f} GB usable, headroom {headroom_fraction:g})"
            )
            return row
        result = simulation.run_simulation(
            config.scenario, hw, workload=workload, steady_state=steady_state, pricing=pricing
        ).result
    except Exception as error:  # noqa: BLE001 - a failing configuration must not stop the sweep
        row["status"], row["message"] = "error", _describe(error)
        return row
    row.update(_memory_fields(result.stages, hw, headroom_fraction))
    row.update({column: getattr(result, column) for column in METRIC_COLUMNS})
    row["status"], row["num_events"] = "ok", result.num_events
    return row


def evaluate_batch(configs: list[SweepConfig], inputs: SweepInputs) -> list[Row]:
    """A worker's unit of work: several configurations per message keeps IPC off the profile.
    One `StagePricing` per profile serves the batch."""
    pricings: dict[str, StagePricing] = {}
    rows = []
    for config in configs:
        hw = inputs.profile(config)
        pricing = pricings.setdefault(config.scenario.hardware, StagePricing(hw))
        rows.append(evaluate(config, hw, inputs.headroom_fraction, inputs.steady_state, pricing))
    return rows
