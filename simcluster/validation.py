"""Predicted vs measured: the paper's Tables 4 and 5 (`simcluster validate`).

Table 4 (per-layer forward/backward of the 22B layer) is where a profile may be
calibrated; a constant fitted there is declared in the profile, and Table 4 is then
reported as calibration. Table 5 (end-to-end iteration times) is never fitted to.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from simcluster.config.hardware import HardwareProfile
from simcluster.config.scenario import Scenario, load_scenario_and_hardware
from simcluster.config.shipped import shipped_dir
from simcluster.costs.stage_pricing import StagePricing
from simcluster.simulation import layer_times, run_simulation
from simcluster.workload.model import build_workload

PAPER_TABLES = Path(__file__).parent / "data" / "paper_tables.yaml"


def scenarios_dir() -> Path:
    """The paper's scenarios, shipped with the package (`config.shipped`)."""
    return shipped_dir("scenarios") / "paper"


@dataclass(frozen=True, slots=True)
class Comparison:
    table: str
    row: str
    quantity: str
    predicted: float
    measured: float
    unit: str

    @property
    def error(self) -> float:
        """Relative error for times; absolute (in points) for utilisations."""
        if self.unit == "%":
            return self.predicted - self.measured
        return self.predicted / self.measured - 1.0


def load_paper_tables(path: Path = PAPER_TABLES) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _load(name: str, hardware: HardwareProfile | None) -> tuple[Scenario, HardwareProfile]:
    scenario, profile = load_scenario_and_hardware(scenarios_dir() / f"{name}.yaml")
    return scenario, hardware or profile


def table4_comparisons(hardware: HardwareProfile | None = None) -> list[Comparison]:
    rows = []
    for entry in load_paper_tables()["table4"]:
        scenario, hw = _load(entry["scenario"], hardware)
        layer = layer_times(build_workload(scenario), hw, scenario, StagePricing(hw))
        for quantity, predicted_s in (("forward", layer.forward_s), ("backward", layer.backward_s)):
            rows.append(
                Comparison(
                    "Table 4",
                    entry["experiment"],
                    f"{quantity} ms",
                    predicted_s * 1e3,
                    entry[f"{quantity}_ms"],
                    "ms",
                )
            )
    return rows


def table5_comparisons(hardware: HardwareProfile | None = None) -> list[Comparison]:
    rows = []
    for entry in load_paper_tables()["table5"]:
        scenario, hw = _load(entry["scenario"], hardware)
        result = run_simulation(scenario, hw).result
        label = f"{entry['model']} {entry['variant']}"
        rows.append(
            Comparison("Table 5", label, "iteration s", result.iteration_time_s, entry["iteration_s"], "s")
        )
        # Table 5's HFU column follows the paper's Eq. 8 (see workload.flops), so compare like with like.
        for key, value in (("mfu", result.mfu), ("hfu", result.paper_hfu)):
            if key in entry:
                rows.append(Comparison("Table 5", label, key.upper(), 100 * value, 100 * entry[key], "%"))
    return rows


TABLE4_FITTED = ("compute.gemm_max_efficiency", "network.tp_overlap_fraction")


def with_constants(
    hw: HardwareProfile, gemm_max_efficiency: float, tp_overlap_fraction: float
) -> HardwareProfile:
    return hw.model_copy(
        update={
            "compute": hw.compute.model_copy(update={"gemm_max_efficiency": gemm_max_efficiency}),
            "network": hw.network.model_copy(update={"tp_overlap_fraction": tp_overlap_fraction}),
        }
    )


@dataclass(frozen=True, slots=True)
class Table4Fit:
    gemm_max_efficiency: float
    tp_overlap_fraction: float
    rms_error: float


def fit_table4(hw: HardwareProfile, steps: int = 21, rounds: int = 3) -> Table4Fit:
    """Least-squares fit of (gemm_max_efficiency, tp_overlap_fraction) to the ten Table 4
    times by successively finer grids. Calibration only: Table 5 is never used here."""
    cases = []
    for entry in load_paper_tables()["table4"]:
        scenario, _ = _load(entry["scenario"], hw)
        cases.append((scenario, build_workload(scenario), entry["forward_ms"], entry["backward_ms"]))

    def squared_error(eff: float, overlap: float) -> float:
        candidate = with_constants(hw, eff, overlap)
        pricing = StagePricing(candidate)  # one per candidate profile, shared by its ten cases
        total = 0.0
        for scenario, workload, forward_ms, backward_ms in cases:
            layer = layer_times(workload, candidate, scenario, pricing)
            total += (1e3 * layer.forward_s / forward_ms - 1) ** 2
            total += (1e3 * layer.backward_s / backward_ms - 1) ** 2
        return total

    eff_range, overlap_range = (0.5, 1.0), (0.0, 1.0)
    best = (0.0, 0.0, float("inf"))
    for _ in range(rounds):
        effs = [eff_range[0] + (eff_range[1] - eff_range[0]) * i / (steps - 1) for i in range(steps)]
        overlaps = [
            overlap_range[0] + (overlap_range[1] - overlap_range[0]) * j / (steps - 1) for j in range(steps)
        ]
        for eff in effs:
            for overlap in overlaps:
                error = squared_error(eff, overlap)
                if error < best[2]:
                    best = (eff, overlap, error)
        eff_step, overlap_step = effs[1] - effs[0], overlaps[1] - overlaps[0]
        eff_range = (max(0.01, best[0] - eff_step), min(1.0, best[0] + eff_step))
        overlap_range = (max(0.0, best[1] - overlap_step), min(1.0, best[1] + overlap_step))
    return Table4Fit(round(best[0], 3), round(best[1], 3), (best[2] / (2 * len(cases))) ** 0.5)


def fitted_to_table4(hw: HardwareProfile | None) -> bool:
    """Whether the profile declares constants fitted to Table 4."""
    return hw is not None and "Table 4" in str(hw.calibration.get("fitted_to", ""))
