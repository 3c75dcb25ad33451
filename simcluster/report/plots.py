"""Figures for people: the paper's memory and timing figures, a run's pipeline timeline, and
a sweep's heatmap and Pareto front.

Each figure is two pure steps: a `*_frame` function turns library results into a pandas
DataFrame (data first: a notebook shows the table, a test checks the numbers), and a
`*_figure` function draws that table and returns a matplotlib `Figure`. Figures are built
without pyplot on an Agg canvas, so nothing here touches global backend state; `save_figure`
writes PNG, SVG or PDF by the file's suffix.
"""

from __future__ import annotations

import enum
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simcluster import units
from simcluster.config.choices import Recompute
from simcluster.config.hardware import HardwareProfile, load_hardware
from simcluster.config.scenario import Scenario, load_scenario
from simcluster.memory_plan import stage_memory_estimate
from simcluster.simulation import Simulation
from simcluster.validation import Comparison, load_paper_tables, scenarios_dir
from simcluster.workload.layer import layer_ops
from simcluster.workload.memory import Table2Row, table2_bytes_per_layer
from simcluster.workload.model import layer_config

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")
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

TIMELINE_COLORS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "recompute": "#C44E52",
    "comms": "#55A868",
    "optimizer": "#8172B3",
    "idle": "#E5E5E5",
}
_COMMS = ("pp_comm", "dp_comm")


class HeatmapMetric(str, enum.Enum):
    """What a sweep heatmap colours: the best value per (tp, pp) of fitting configurations."""

    MFU = "mfu"
    HFU = "hfu"


def new_figure(width_in: float = 8.0, height_in: float = 4.5) -> Figure:
    """A figure on an Agg canvas, not registered with pyplot (no global state)."""
    figure = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def check_figure_path(path: Path) -> None:
    if Path(path).suffix.lower() not in FIGURE_SUFFIXES:
        raise ValueError(f"{path}: unknown figure format; use one of {', '.join(FIGURE_SUFFIXES)}")


def save_figure(figure: Figure, path: Path) -> Path:
    """Write `figure` as PNG, SVG or PDF, chosen by the suffix of `path`."""
    path = Path(path)
    check_figure_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=150)
    return path


# --- the paper's models ----------------------------------------------------------------


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


# --- timeline ------------------------------------------------------------------------------


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
            recompute_s = duration * parts.get("recompute", 0.0) / max(sum(parts.values()), 1e-300)
            if recompute_s > 0:
                rows.append((stage, f"{name} recompute", "recompute", start, recompute_s))
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
                rows.append((stage, "idle", "idle", cursor, start - cursor))
            cursor = max(cursor, start + duration)
        if end_s > cursor + 1e-12:
            rows.append((stage, "idle", "idle", cursor, end_s - cursor))
    return pd.DataFrame(rows, columns=frame.columns)


def timeline_figure(frame: pd.DataFrame, title: str = "pipeline timeline") -> Figure:
    """Gantt chart: one row per pipeline stage (stage 0 on top), one colour per category."""
    num_stages = int(frame["stage"].max()) + 1
    figure = new_figure(10.0, max(2.5, 0.35 * num_stages + 1.5))
    axes = figure.add_subplot()
    for category, color in TIMELINE_COLORS.items():
        rows = frame[frame["category"] == category]
        for stage, spans in rows.groupby("stage"):
            axes.broken_barh(
                list(zip(spans["start_s"], spans["duration_s"])),
                (stage - 0.4, 0.8),
                facecolors=color,
                label=category if stage == rows["stage"].min() else None,
            )
    axes.set_ylim(num_stages - 0.5, -0.5)
    axes.set_yticks(range(num_stages), [f"stage {s}" for s in range(num_stages)])
    axes.set_xlabel("time (s)")
    axes.set_title(title)
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return figure


# --- paper figures -------------------------------------------------------------------------


def _grouped_bars(
    axes,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
    fmt: str = "%.1f",
    hatches: Mapping[str, str | None] | None = None,
    colors: Mapping[str, str] | None = None,
) -> None:
    """Side-by-side bars: one group per entry of `groups`, one bar per series."""
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        offsets = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        hatch, color = (hatches or {}).get(label), (colors or {}).get(label)
        bars = axes.bar(offsets, values, width, label=label, hatch=hatch, color=color)
        axes.bar_label(bars, fmt=fmt, fontsize="x-small", padding=1)
    axes.set_xticks(range(len(groups)), groups)


def memory_ladder_figure(frame: pd.DataFrame) -> Figure:
    """Figure 7: per-layer activation memory as % of the tensor-parallel baseline."""
    figure = new_figure(9.0, 4.5)
    axes = figure.add_subplot()
    models = list(dict.fromkeys(frame["model"]))
    series = {
        label: list(
            frame[frame["configuration"] == label].set_index("model").loc[models, "percent_of_baseline"]
        )
        for label in dict.fromkeys(frame["configuration"])
    }
    _grouped_bars(axes, models, series, fmt="%.0f")
    axes.set_ylabel("activation memory per layer (% of TP baseline)")
    axes.set_ylim(0, 125)
    axes.set_title("Figure 7: activation memory per transformer layer")
    axes.legend(fontsize="small", ncols=3, loc="upper center")
    return figure


def memory_budget_figure(frame: pd.DataFrame) -> Figure:
    """Figure 1: first-stage weights + optimizer state with baseline and present-work
    activations, against the GPU's capacity (dashed line)."""
    figure = new_figure(8.0, 4.5)
    axes = figure.add_subplot()
    x = range(len(frame))
    width = 0.38
    for offset, key, label, color in (
        (-width / 2, "activations_baseline_gb", "activations (TP baseline)", "#C44E52"),
        (width / 2, "activations_present_gb", "activations (SP + selective)", "#55A868"),
    ):
        positions = [i + offset for i in x]
        axes.bar(positions, frame["static_gb"], width, color="#4C72B0")
        bars = axes.bar(positions, frame[key], width, bottom=frame["static_gb"], color=color, label=label)
        axes.bar_label(bars, labels=[f"{v:.0f}" for v in frame["static_gb"] + frame[key]], fontsize="small")
    axes.bar([], [], color="#4C72B0", label="parameters + gradients + optimizer state")
    axes.axhline(frame["capacity_gb"].iloc[0], color="red", linestyle="--", label="GPU memory")
    axes.set_xticks(list(x), frame["model"])
    axes.set_ylabel("memory per GPU, first stage (GB)")
    axes.set_title("Figure 1: what must fit on one GPU")
    axes.legend(fontsize="small")
    return figure


def table4_figure(comparisons: Sequence[Comparison]) -> Figure:
    """Table 4: one 22B layer's forward and backward, predicted next to measured."""
    rows = [c for c in comparisons if c.table == "Table 4"]
    experiments = list(dict.fromkeys(c.row for c in rows))
    figure = new_figure(10.0, 4.5)
    axes = figure.add_subplot()
    series: dict[str, list[float]] = {}
    for quantity in ("forward ms", "backward ms"):
        for source in ("measured", "predicted"):
            by_row = {c.row: getattr(c, source) for c in rows if c.quantity == quantity}
            series[f"{quantity.split()[0]} {source}"] = [by_row[e] for e in experiments]
    hatches = {k: "//" if k.endswith("predicted") else None for k in series}
    colors = {k: "#4C72B0" if k.startswith("forward") else "#DD8452" for k in series}
    labels = [textwrap.fill(e, 18) for e in experiments]
    _grouped_bars(axes, labels, series, hatches=hatches, colors=colors)
    axes.set_ylabel("ms per layer")
    axes.set_title("Table 4: one 22B layer, predicted (hatched) vs measured")
    axes.legend(fontsize="small", ncols=2)
    return figure


def table5_figure(comparisons: Sequence[Comparison]) -> Figure:
    """Table 5: iteration time with full recompute vs SP + selective, predicted next to
    measured, per model (each model on its own axes: times span 1 s to 94 s)."""
    frame = table5_frame(comparisons)
    figure = new_figure(11.0, 3.8)
    panels = figure.subplots(1, len(frame))
    for axes, (_, row) in zip(panels if len(frame) > 1 else [panels], frame.iterrows()):
        labels = ["full\nmeasured", "full\npredicted", "SP+sel\nmeasured", "SP+sel\npredicted"]
        values = [
            row[f"{k}_s"]
            for k in ("full_measured", "full_predicted", "present_measured", "present_predicted")
        ]
        colors = ["#C44E52", "#C44E52", "#55A868", "#55A868"]
        bars = axes.bar(range(4), values, color=colors)
        for bar, hatch in zip(bars, (None, "//", None, "//")):
            bar.set_hatch(hatch)
        axes.bar_label(bars, fmt="%.2f", fontsize="x-small")
        axes.set_xticks(range(4), labels, fontsize="x-small")
        axes.set_title(
            f"{row['model']}: gain {100 * row['gain_measured']:.0f}% meas., "
            f"{100 * row['gain_predicted']:.0f}% pred.",
            fontsize="small",
        )
    (panels[0] if len(frame) > 1 else panels).set_ylabel("iteration time (s)")
    figure.suptitle("Table 5: full recompute vs SP + selective (hatched: simulator)")
    return figure


# --- sweeps --------------------------------------------------------------------------------


def fitting_rows(sweep: pd.DataFrame) -> pd.DataFrame:
    """Simulated configurations that fit in GPU memory (status ok, fits true; a missing
    `fits`, as in error rows, counts as not fitting)."""
    fits = sweep["fits"].map(lambda value: bool(value) if pd.notna(value) else False).astype(bool)
    return sweep[(sweep["status"] == "ok") & fits]


def _text(value: object) -> str:
    return str(value.value) if isinstance(value, enum.Enum) else str(value)


def _cell_label(row: pd.Series | None, key: str) -> str:
    if row is None:
        return "no fit"
    sp = "SP " if row["sequence_parallel"] else ""
    return (
        f"{100 * row[key]:.1f}%\nvpp {row['vpp']} b {row['micro_batch_size']}\n{sp}{_text(row['recompute'])}"
    )


def sweep_heatmap_figure(sweep: pd.DataFrame, metric: HeatmapMetric = HeatmapMetric.MFU) -> Figure:
    """tp × pp heatmap of the best `metric` over fitting configurations; each cell names
    its best configuration (vpp, micro batch, SP, recompute). Grey: nothing fits."""
    key = HeatmapMetric(metric).value
    ok = fitting_rows(sweep)
    tps, pps = sorted(sweep["tp"].unique()), sorted(sweep["pp"].unique())
    best = ok.loc[ok.groupby(["pp", "tp"])[key].idxmax()].set_index(["pp", "tp"]) if len(ok) else ok
    grid = [[100 * best[key].get((pp, tp), float("nan")) for tp in tps] for pp in pps]
    figure = new_figure(1.6 * len(tps) + 3.0, 0.9 * len(pps) + 1.8)
    axes = figure.add_subplot()
    axes.set_facecolor("#D0D0D0")
    image = axes.imshow(grid, cmap="viridis", aspect="auto")
    for i, pp in enumerate(pps):
        for j, tp in enumerate(tps):
            row = best.loc[(pp, tp)] if (pp, tp) in best.index else None
            dark = row is not None and float(image.norm(100 * float(row[key]))) <= 0.6  # type: ignore[arg-type]
            axes.text(j, i, _cell_label(row, key), ha="center", va="center", fontsize="x-small",
                      color="white" if dark else "black")  # fmt: skip
    axes.set_xticks(range(len(tps)), [str(t) for t in tps])
    axes.set_yticks(range(len(pps)), [str(p) for p in pps])
    axes.set_xlabel("tensor parallel (tp)")
    axes.set_ylabel("pipeline parallel (pp)")
    axes.set_title(f"best {key.upper()} of fitting configurations")
    figure.colorbar(image, ax=axes, label=f"{key.upper()} (%)")
    return figure


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


def pareto_figure(sweep: pd.DataFrame, capacity_bytes: float | None = None) -> Figure:
    """Peak memory (most loaded stage) vs iteration time of every simulated configuration,
    coloured by recompute mode, with the Pareto front of those that fit as a staircase."""
    ok = sweep[(sweep["status"] == "ok") & sweep["iteration_time_s"].notna()]
    figure = new_figure(8.0, 5.0)
    axes = figure.add_subplot()
    for mode, rows in ok.groupby("recompute"):
        axes.scatter(
            units.bytes_to_gb(rows["max_stage_peak_memory_bytes"]),
            rows["iteration_time_s"],
            s=14,
            alpha=0.6,
            label=f"recompute {_text(mode)}",
        )
    front = pareto_front(sweep)
    axes.step(
        units.bytes_to_gb(front["max_stage_peak_memory_bytes"]),
        front["iteration_time_s"],
        where="post",
        color="black",
        linewidth=1.2,
    )
    axes.scatter(
        units.bytes_to_gb(front["max_stage_peak_memory_bytes"]),
        front["iteration_time_s"],
        s=40,
        facecolors="none",
        edgecolors="black",
        label="Pareto front",
    )
    if capacity_bytes is not None:
        axes.axvline(units.bytes_to_gb(capacity_bytes), color="red", linestyle="--", label="GPU memory")
    axes.set_xlabel("peak memory of the most loaded stage (GB)")
    axes.set_ylabel("iteration time (s)")
    axes.set_title("memory vs iteration time")
    axes.legend(fontsize="small")
    return figure
