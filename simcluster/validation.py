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
from simcluster.simulation import layer_times, run_simulation
from simcluster.workload.model import build_workload

PAPER_TABLES = Path(__file__).parent / "data" / "paper_tables.yaml"


def scenarios_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "scenarios" / "paper"


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
        layer = layer_times(build_workload(scenario), hw, scenario)
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
        for key, value in (("mfu", result.mfu), ("hfu", result.hfu)):
            if key in entry:
                rows.append(Comparison("Table 5", label, key.upper(), 100 * value, 100 * entry[key], "%"))
    return rows


TABLE4_FITTED = ("gemm_max_efficiency", "tp_overlap_fraction")


def with_constants(
    hw: HardwareProfile, gemm_max_efficiency: float, tp_overlap_fraction: float
) -> HardwareProfile:
    return hw.model_copy(
        update={
            "compute": hw.compute.model_copy(update={"gemm_max_efficiency": gemm_max_efficiency}),
            "network": hw.network.model_copy(update={"tp_overlap_fraction": tp_overlap_fraction}),
        }
    )


def table4_squared_error(hw: HardwareProfile) -> float:
    return sum(row.error**2 for row in table4_comparisons(hw))


def fit_table4(hw: HardwareProfile, steps: int = 41) -> tuple[float, float, float]:
    """Least-squares fit of (gemm_max_efficiency, tp_overlap_fraction) to the ten Table 4
    times, by a coarse grid then a fine grid. Returns (efficiency, overlap, rms error).
    This is calibration: Table 5 is never used here."""
    best = (hw.compute.gemm_max_efficiency, hw.network.tp_overlap_fraction, float("inf"))
    eff_lo, eff_hi, ov_lo, ov_hi = 0.6, 1.0, 0.0, 1.0
    for _ in range(2):
        for i in range(steps):
            eff = eff_lo + (eff_hi - eff_lo) * i / (steps - 1)
            for j in range(steps):
                overlap = ov_lo + (ov_hi - ov_lo) * j / (steps - 1)
                error = table4_squared_error(with_constants(hw, eff, overlap))
                if error < best[2]:
                    best = (eff, overlap, error)
        eff_step, ov_step = (eff_hi - eff_lo) / (steps - 1), (ov_hi - ov_lo) / (steps - 1)
        eff_lo, eff_hi = best[0] - 2 * eff_step, min(1.0, best[0] + 2 * eff_step)
        ov_lo, ov_hi = max(0.0, best[1] - 2 * ov_step), min(1.0, best[1] + 2 * ov_step)
    return round(best[0], 3), round(best[1], 3), (best[2] / 10) ** 0.5
