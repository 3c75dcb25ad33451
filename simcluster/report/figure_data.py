"""The data behind the figures, as pandas DataFrames (data before drawing: a notebook shows
the table, a test checks the numbers; `simcluster.report.plots` draws them).

Figure 7's ladder and Table 2 from the paper's formulas and the op graph, Figure 1's memory
budget, Tables 4 and 5 predicted vs measured, a run's pipeline timeline, and a sweep's
fitting rows and Pareto front.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from simcluster import units
from simcluster.config.choices import Recompute
from simcluster.config.hardware import HardwareProfile, load_hardware
from simcluster.config.scenario import Scenario, load_scenario
from simcluster.engine.plan import TimeCategory
from simcluster.headroom import capacity_bytes
from simcluster.memory_plan import stage_memory_estimate
from simcluster.simulation import Simulation
from simcluster.validation import Comparison, load_paper_tables, scenarios_dir
from simcluster.workload.layer import layer_ops
from simcluster.workload.memory import Table2Row, table2_bytes_per_layer
from simcluster.workload.model import layer_config

PRESENT_WORK = "SP + selective"


FULL_RECOMPUTE = "full recompute"


# Figure 7's ladder: (label, sequence_parallel, recompute), all at the model's t.
LADDER: tuple[tuple[str, bool, Recompute], ...] = (
    ("tensor parallel (baseline)", False, Recompute.NONE),
    ("sequence parallel", True, Recompute.NONE),
    ("selective recompute", False, Recompute.SELECTIVE),
    ("SP + selective recompute", True, Recompute.SELECTIVE),
    ("full recompute", False, Recompute.FULL),
)


# Table 2's rows as (t is the model's or 1, sequence_parallel, recompute, formula).
TABLE2: dict[Table2Row, tuple[bool, bool, Recompute, str]] = {
    Table2Row.NO_PARALLELISM: (False, False, Recompute.NONE, "sbh(34 + 5as/h)"),
    Table2Row.TENSOR_PARALLEL: (True, False, Recompute.NONE, "sbh(10 + 24/t + 5as/(ht))"),
    Table2Row.TENSOR_SEQUENCE_PARALLEL: (True, True, Recompute.NONE, "sbh(34/t + 5as/(ht))"),
    Table2Row.TENSOR_PARALLEL_SELECTIVE: (True, False, Recompute.SELECTIVE, "sbh(10 + 24/t)"),
    Table2Row.TENSOR_SEQUENCE_PARALLEL_SELECTIVE: (True, True, Recompute.SELECTIVE, "sbh(34/t)"),
    Table2Row.FULL_RECOMPUTE: (True, False, Recompute.FULL, "sbh(2)"),
}


_COMMS = (TimeCategory.PP_COMM.value, TimeCategory.DP_COMM.value)  # trace categories drawn as comms


def paper_scenarios(variant: str = PRESENT_WORK) -> dict[str, Scenario]:
    """The four Table 3 models (22B, 175B, 530B, 1T) as shipped scenarios, keyed by model."""
    return {
        entry["model"]: load_scenario(scenarios_dir() / f"{entry['scenario']}.yaml")
        for entry in load_paper_tables()["table5"]
        if entry["variant"] == variant
    }


def _variant(scenario: Scenario, sequence_parallel: bool, recompute: Recompute) -> Scenario:
    return scenario.model_copy(
        update={
            "parallel": scenario.parallel.model_copy(update={"sequence_parallel": sequence_parallel}),
            "training": scenario.training.model_copy(update={"recompute": recompute}),
        }
    )


def _formula_bytes(scenario: Scenario, tp: int, sequence_parallel: bool, recompute: Recompute) -> float:
    m = scenario.model
    b = scenario.training.micro_batch_size
    return table2_bytes_per_layer(
        m.seq_length, b, m.hidden_size, m.num_attention_heads, tp, sequence_parallel, recompute
    )


def table2_frame(scenario: Scenario) -> pd.DataFrame:
    """Table 2's six formulas evaluated for one model (its s, b, h, a, t), bytes per layer
    per rank; `percent_of_no_parallelism` is each row over the first."""
    rows = []
    for row, (use_tp, sp, recompute, formula) in TABLE2.items():
        tp = scenario.parallel.tp if use_tp else 1
        rows.append(
            {
                "configuration": row.value,
                "formula": formula,
                "bytes_per_layer": _formula_bytes(scenario, tp, sp, recompute),
            }
        )
    frame = pd.DataFrame(rows)
    frame["gb_per_layer"] = frame["bytes_per_layer"].map(units.bytes_to_gb)
    frame["percent_of_no_parallelism"] = 100 * frame["bytes_per_layer"] / frame["bytes_per_layer"].iloc[0]
    return frame


def memory_ladder_frame(scenarios: Mapping[str, Scenario] | None = None) -> pd.DataFrame:
    """Figure 7's numbers: per-layer activation bytes of each ladder step, from Table 2
    (`formula_bytes`) and from the simulator's op graph (`simulator_bytes`), and the share
    of the tensor-parallel baseline (from the formula)."""
    rows = []
    for model, scenario in (scenarios or paper_scenarios()).items():
        for label, sp, recompute in LADDER:
            variant = _variant(scenario, sp, recompute)
            rows.append(
                {
                    "model": model,
                    "configuration": label,
                    "formula_bytes": _formula_bytes(scenario, scenario.parallel.tp, sp, recompute),
                    "simulator_bytes": layer_ops(layer_config(variant)).saved_bytes,
                }
            )
    frame = pd.DataFrame(rows)
    baseline = frame.groupby("model", sort=False)["formula_bytes"].transform("first")
    frame["percent_of_baseline"] = 100 * frame["formula_bytes"] / baseline
    return frame


def memory_budget_frame(
    scenarios: Mapping[str, Scenario] | None = None, hardware: HardwareProfile | None = None
) -> pd.DataFrame:
    """Figure 1's numbers, first pipeline stage of each model from the simulator's memory
    plan: weights + gradients + optimizer state, and stored activations with the tensor-
    parallel baseline (no recompute) and with the present work (SP + selective)."""
    rows = []
    for model, scenario in (scenarios or paper_scenarios()).items():
        hw = hardware or load_hardware(scenario.hardware)
        baseline = stage_memory_estimate(_variant(scenario, False, Recompute.NONE), hw)[0]
        present = stage_memory_estimate(_variant(scenario, True, Recompute.SELECTIVE), hw)[0]
        rows.append(
            {
                "model": model,
                "static_gb": units.bytes_to_gb(
                    baseline.weight_bytes + baseline.gradient_bytes + baseline.optimizer_bytes
                ),
                "activations_baseline_gb": units.bytes_to_gb(baseline.activation_bytes),
                "activations_present_gb": units.bytes_to_gb(present.activation_bytes),
                "capacity_gb": units.bytes_to_gb(capacity_bytes(hw)),
            }
        )
    return pd.DataFrame(rows)


def comparisons_frame(comparisons: Sequence[Comparison]) -> pd.DataFrame:
    """Predicted vs measured rows (Tables 4 and 5) as a table, with each row's error."""
    return pd.DataFrame(
        [
            {
                "table": c.table,
                "row": c.row,
                "quantity": c.quantity,
                "predicted": c.predicted,
                "measured": c.measured,
                "unit": c.unit,
                "error": c.error,
            }
            for c in comparisons
        ]
    )


def table5_frame(comparisons: Sequence[Comparison]) -> pd.DataFrame:
    """One row per model: full-recompute and SP + selective iteration seconds, predicted
    and measured, and the throughput gain full / present − 1 (the paper's column)."""
    times = [c for c in comparisons if c.table == "Table 5" and c.quantity == "iteration s"]
    cells: dict[str, dict[str, float]] = {}
    for c in times:
        model, variant = c.row.split(" ", 1)
        key = "full" if variant == FULL_RECOMPUTE else "present"
        cells.setdefault(model, {})[f"{key}_predicted_s"] = c.predicted
        cells[model][f"{key}_measured_s"] = c.measured
    frame = pd.DataFrame.from_dict(cells, orient="index").rename_axis("model").reset_index()
    for source in ("predicted", "measured"):
        frame[f"gain_{source}"] = frame[f"full_{source}_s"] / frame[f"present_{source}_s"] - 1
    return frame


_TASK = re.compile(r"\b[FB](\d+)\.(\d+)\b")  # F3.0, B3.0 recompute, send after F3.0


def _microbatch_of(span_name: str) -> int:
    """The microbatch a span works on (-1 for the optimizer, idle and all-reduces)."""
    found = _TASK.search(span_name)
    return int(found.group(1)) if found else -1


def _chunk_of(task_name: str) -> int:
    """Task names are `{F|B}{microbatch}.{chunk}` (`simcluster.schedule.tasks.Task`)."""
    return int(task_name.rsplit(".", 1)[1])


def timeline_frame(simulation: Simulation) -> pd.DataFrame:
    """A recorded run as Gantt rows (stage, name, category, start_s, duration_s, microbatch;
    microbatch -1 where a span belongs to none).

    Categories: forward, backward, recompute (the first part of a backward task: Megatron
    re-runs the forward before the gradients), comms (blocking pipeline sends, data-parallel
    and embedding all-reduces), optimizer, and idle (every gap up to the iteration's end).
    Tensor-parallel collectives run inside each task and are drawn as part of it.
    """
    if not simulation.engine.spans:
        raise ValueError("no spans recorded: run the simulation with record=True")
    rows = []
    for stage, name, category, start, duration in simulation.engine.spans:
        if category == "backward":
            parts = dict(simulation.plan.stages[stage].backward[_chunk_of(name)].parts)
            recompute_s = duration * parts.get(TimeCategory.RECOMPUTE, 0.0) / max(sum(parts.values()), 1e-300)
            if recompute_s > 0:
                rows.append((stage, f"{name} recompute", TimeCategory.RECOMPUTE.value, start, recompute_s))
            rows.append((stage, name, "backward", start + recompute_s, duration - recompute_s))
        else:
            rows.append((stage, name, "comms" if category in _COMMS else category, start, duration))
    frame = pd.DataFrame(rows, columns=["stage", "name", "category", "start_s", "duration_s"])
    frame = pd.concat([frame, _idle_rows(frame, simulation.engine.iteration_time_s)], ignore_index=True)
    frame["microbatch"] = frame["name"].map(_microbatch_of).astype(int)
    return frame


def microbatch_window_s(frame: pd.DataFrame, first: int, last: int) -> tuple[float, float]:
    """The time span from the first task of microbatch `first` to the end of the last task
    of microbatch `last` (inclusive), on any stage. ValueError if the run has none of them."""
    chosen = frame[(frame["microbatch"] >= first) & (frame["microbatch"] <= last)]
    if chosen.empty:
        count = int(frame["microbatch"].max()) + 1
        raise ValueError(f"--microbatches: value {first}:{last}: the run has microbatches 0 to {count - 1}")
    return float(chosen["start_s"].min()), float((chosen["start_s"] + chosen["duration_s"]).max())


def clip_timeline(frame: pd.DataFrame, start_s: float, end_s: float) -> pd.DataFrame:
    """The rows that overlap [start_s, end_s], cut to it (a window of a long timeline)."""
    if not start_s < end_s:
        raise ValueError(f"window: {start_s} to {end_s} s: the start must be before the end")
    ends = frame["start_s"] + frame["duration_s"]
    inside = frame[(ends > start_s) & (frame["start_s"] < end_s)].copy()
    clipped_start = inside["start_s"].clip(lower=start_s)
    inside["duration_s"] = (inside["start_s"] + inside["duration_s"]).clip(upper=end_s) - clipped_start
    inside["start_s"] = clipped_start
    return inside.reset_index(drop=True)


def _idle_rows(frame: pd.DataFrame, end_s: float) -> pd.DataFrame:
    rows = []
    for stage, spans in frame.sort_values("start_s").groupby("stage"):
        cursor = 0.0
        for start, duration in zip(spans["start_s"], spans["duration_s"]):
            if start > cursor + 1e-12:
                rows.append((stage, "idle", TimeCategory.IDLE.value, cursor, start - cursor))
            cursor = max(cursor, start + duration)
        if end_s > cursor + 1e-12:
            rows.append((stage, "idle", TimeCategory.IDLE.value, cursor, end_s - cursor))
    return pd.DataFrame(rows, columns=frame.columns)


SUBJECT_COLUMNS = ("model", "hardware", "seq_length")
"""Columns that change the problem, not the layout: one heatmap shows one value of each."""


def select_rows(sweep: pd.DataFrame, where: Mapping[str, str]) -> pd.DataFrame:
    """The rows whose `column` reads `value` (compared as text; true/false for booleans)
    for every item of `where`. ValueError naming the column or value and what is allowed."""
    for column, value in where.items():
        if column not in sweep.columns:
            allowed = ", ".join(map(str, sweep.columns))
            raise ValueError(f"--where: {column}: no such column; allowed: {allowed}")
        text = sweep[column].map(lambda v: str(v).lower() if isinstance(v, (bool, np.bool_)) else str(v))
        if not (text == value).any():
            allowed = ", ".join(sorted(set(text)))
            raise ValueError(f"--where: {column}={value}: no row has it; allowed: {allowed}")
        sweep = sweep[text == value]
    return sweep


def mixed_subject(sweep: pd.DataFrame) -> str | None:
    """Why one tp × pp heatmap cannot show `sweep` (it mixes models, profiles or sequence
    lengths, so a best per cell would compare unlike runs), or None."""
    for column in SUBJECT_COLUMNS:
        if column in sweep.columns and sweep[column].nunique() > 1:
            values = ", ".join(map(str, sorted(sweep[column].unique())))
            return (
                f"the table holds several {column} values ({values}); choose one with --where {column}=VALUE"
            )
    return None


def sweep_subject(sweep: pd.DataFrame) -> str:
    """'model, N GPUs, hardware' from the table's own columns (what a title must name)."""
    parts = []
    formats = (("model", "{}"), ("num_gpus", "{} GPUs"), ("hardware", "{}"), ("seq_length", "s = {}"))
    for column, fmt in formats:
        if column in sweep.columns and len(sweep):
            values = list(dict.fromkeys(sweep[column]))
            parts.append(fmt.format("/".join(map(str, values))))
    return ", ".join(parts)


class CellState(str, enum.Enum):
    """What a tp × pp heatmap cell shows."""

    FITS = "fits"  # the best fitting configuration's metric
    NO_FIT = "no fit"  # valid configurations, none fits in memory (with the headroom)
    ERROR = "error"  # valid configurations, each raised
    INVALID = "invalid"  # the loader rejected every combination of this tp and pp


def heatmap_frame(
    sweep: pd.DataFrame, metric: str = "mfu", invalid_cells: Iterable[tuple[int, int]] = ()
) -> pd.DataFrame:
    """One row per (pp, tp) cell over every tp and pp of the table and of `invalid_cells`
    ((tp, pp) pairs the loader rejected outright, from the sweep's metadata): its state,
    the best fitting `metric` (NaN if none), the index of that row in `sweep`, and the
    smallest peak any of its configurations needs. A cell without rows is invalid."""
    invalid = {(int(tp), int(pp)) for tp, pp in invalid_cells}
    tps = sorted({int(t) for t in sweep["tp"]} | {tp for tp, _ in invalid})
    pps = sorted({int(p) for p in sweep["pp"]} | {pp for _, pp in invalid})
    fitting = fitting_rows(sweep)
    rows = []
    for pp in pps:
        for tp in tps:
            cell = sweep[(sweep["tp"] == tp) & (sweep["pp"] == pp)]
            fits = fitting[(fitting["tp"] == tp) & (fitting["pp"] == pp)]
            measured = cell[cell["status"].isin(["ok", "oom"])]
            state = (
                CellState.INVALID if cell.empty
                else CellState.FITS if len(fits)
                else CellState.NO_FIT if len(measured)
                else CellState.ERROR
            )  # fmt: skip
            best = fits[metric].idxmax() if len(fits) else None
            rows.append({
                "pp": pp, "tp": tp, "state": state.value,
                "value": float(fits.loc[best, metric]) if best is not None else math.nan,
                "best_index": best,
                "min_peak_memory_bytes": float(measured["max_stage_peak_memory_bytes"].min())
                if len(measured) else math.nan,
            })  # fmt: skip
    return pd.DataFrame(rows)


def fitting_rows(sweep: pd.DataFrame) -> pd.DataFrame:
    """Simulated configurations that fit in GPU memory (status ok, fits true; a missing
    `fits`, as in error rows, counts as not fitting)."""
    fits = sweep["fits"].map(lambda value: bool(value) if pd.notna(value) else False).astype(bool)
    return sweep[(sweep["status"] == "ok") & fits]


def pareto_front(sweep: pd.DataFrame) -> pd.DataFrame:
    """Fitting configurations not beaten on both peak memory and iteration time (the
    lower-left staircase), sorted by memory."""
    ordered = fitting_rows(sweep).sort_values(["max_stage_peak_memory_bytes", "iteration_time_s"])
    keep, best = [], float("inf")
    for index, time_s in zip(ordered.index, ordered["iteration_time_s"]):
        if time_s < best:
            keep.append(index)
            best = time_s
    return ordered.loc[keep]
