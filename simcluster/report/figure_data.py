"""The data behind the figures, as pandas DataFrames (data before drawing: a notebook shows
the table, a test checks the numbers; `simcluster.report.plots` draws them).

Figure 7's ladder and Table 2 from the paper's formulas and the op graph, Figure 1's memory
budget, Tables 4 and 5 predicted vs measured, a run's pipeline timeline, and a sweep's
fitting rows and Pareto front.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from simcluster import units
from simcluster.config.choices import Recompute
from simcluster.config.hardware import HardwareProfile, load_hardware
from simcluster.config.scenario import Scenario, load_scenario
from simcluster.engine.plan import TimeCategory
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
                "capacity_gb": units.bytes_to_gb(hw.memory_bytes),
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


def _chunk_of(task_name: str) -> int:
    """Task names are `{F|B}{microbatch}.{chunk}` (`simcluster.schedule.tasks.Task`)."""
    return int(task_name.rsplit(".", 1)[1])


def timeline_frame(simulation: Simulation) -> pd.DataFrame:
    """A recorded run as Gantt rows (stage, name, category, start_s, duration_s).

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
    return pd.concat([frame, _idle_rows(frame, simulation.engine.iteration_time_s)], ignore_index=True)


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
