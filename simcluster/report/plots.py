"""Figures for people: the paper's memory and timing figures, a run's pipeline timeline, and
a sweep's heatmap and Pareto front.

Each figure is two pure steps: a `*_frame` function (in `figure_data`) turns library results into a pandas
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
from matplotlib.patches import Patch, Rectangle

from simcluster import units
from simcluster.output_files import write_atomically
from simcluster.report.figure_data import (  # noqa: F401  (re-exported for callers of plots)
    _COMMS,
    FULL_RECOMPUTE,
    LADDER,
    PRESENT_WORK,
    TABLE2,
    CellState,
    clip_timeline,
    comparisons_frame,
    fitting_rows,
    heatmap_frame,
    memory_budget_frame,
    memory_ladder_frame,
    microbatch_window_s,
    mixed_subject,
    paper_scenarios,
    pareto_front,
    select_rows,
    sweep_subject,
    table2_frame,
    table5_frame,
    timeline_frame,
)
from simcluster.validation import Comparison

FIGURE_SUFFIXES = (".png", ".svg", ".pdf")


TIMELINE_COLORS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "recompute": "#C44E52",
    "comms": "#55A868",
    "optimizer": "#8172B3",
    "idle": "#E5E5E5",
}

TIMELINE_HATCHES = {"recompute": "////"}  # the recompute part of a backward, visible at any width
MIN_LABEL_FRACTION = 0.02  # a task bar this share of the window wide, or more, shows its name


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
    # the temporary file's suffix is .tmp: name the format, which savefig would take from it
    fmt = path.suffix.lower().removeprefix(".")
    write_atomically(path, lambda temporary: figure.savefig(temporary, dpi=150, format=fmt))
    return path


# --- the paper's models ----------------------------------------------------------------


# --- timeline ------------------------------------------------------------------------------


def timeline_figure(
    frame: pd.DataFrame,
    title: str = "pipeline timeline",
    window_s: tuple[float, float] | None = None,
    highlight: tuple[int, int] | None = None,
) -> Figure:
    """Gantt chart: one row per pipeline stage (stage 0 on top), one colour per category,
    the recompute part of each backward hatched. `window_s` (start, end) draws only that
    span of the run, so tasks stay wide enough to read at 64+ microbatches; `highlight`
    (first, last microbatch) fades the other microbatches' tasks. Bars wide enough are
    labelled with their task (F3.1 = forward of microbatch 3, model chunk 1)."""
    num_stages = int(frame["stage"].max()) + 1
    if window_s is not None:
        frame = clip_timeline(frame, *window_s)
    start_s, end_s = window_s or (0.0, float((frame["start_s"] + frame["duration_s"]).max()))
    figure = new_figure(12.0 if window_s else 10.0, max(2.5, 0.35 * num_stages + 1.5))
    axes = figure.add_subplot()
    faded = (
        (frame["microbatch"] >= 0) & ~frame["microbatch"].between(*highlight)
        if highlight is not None
        else pd.Series(False, index=frame.index)
    )
    for category, color in TIMELINE_COLORS.items():
        rows = frame[frame["category"] == category]
        for stage, spans in rows.groupby("stage"):
            for dim in (False, True):
                part = spans[faded[spans.index] == dim]
                axes.broken_barh(
                    list(zip(part["start_s"], part["duration_s"])),
                    (stage - 0.4, 0.8),
                    facecolors=color,
                    alpha=0.3 if dim else 1.0,
                    edgecolors="white" if category != "idle" else "none",
                    linewidth=0.3,
                    hatch=TIMELINE_HATCHES.get(category),
                    label=category if stage == rows["stage"].min() and not dim else None,
                )
    _label_microbatches(axes, frame[~faded], (end_s - start_s) * MIN_LABEL_FRACTION)
    axes.set_xlim(start_s, end_s)
    axes.set_ylim(num_stages - 0.5, -0.5)
    axes.set_yticks(range(num_stages), [f"stage {s}" for s in range(num_stages)])
    axes.set_xlabel("time (s)")
    axes.set_title(title)
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    return figure


def _label_microbatches(axes, frame: pd.DataFrame, min_width_s: float) -> None:
    """Write the task (F<microbatch>.<chunk>) inside forward and backward bars at least
    `min_width_s` wide."""
    tasks = frame[frame["category"].isin(["forward", "backward"]) & (frame["duration_s"] >= min_width_s)]
    columns = (tasks["stage"], tasks["start_s"], tasks["duration_s"], tasks["name"])
    for stage, start, duration, name in zip(*columns):
        axes.text(start + duration / 2, stage, name, ha="center", va="center", fontsize=5, color="white",
                  clip_on=True)  # fmt: skip


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


def _text(value: object) -> str:
    return str(value.value) if isinstance(value, enum.Enum) else str(value)


HEATMAP_STATES = {
    CellState.NO_FIT: ("#B0B0B0", None, "does not fit in memory"),
    CellState.ERROR: ("#F2B8B8", None, "every configuration raised"),
    CellState.INVALID: ("#FFFFFF", "xx", "invalid layout (the scenario rules reject it)"),
}
"""Cells without a fitting configuration: face colour, hatch, legend text."""


def _cell_label(cell: pd.Series, row: pd.Series | None, key: str) -> str:
    if cell["state"] == CellState.NO_FIT.value:
        return f"no fit\nneeds {units.bytes_to_gb(cell['min_peak_memory_bytes']):.0f} GB"
    if row is None:
        return str(cell["state"])
    sp = "SP " if row["sequence_parallel"] else ""
    return (
        f"{100 * row[key]:.1f}%\nvpp {row['vpp']} b {row['micro_batch_size']}\n{sp}{_text(row['recompute'])}"
    )


def sweep_heatmap_figure(
    sweep: pd.DataFrame,
    metric: HeatmapMetric = HeatmapMetric.MFU,
    invalid_cells: Sequence[tuple[int, int]] = (),
) -> Figure:
    """tp × pp heatmap of the best `metric` over fitting configurations; each cell names
    its best configuration (vpp, micro batch, SP, recompute). A cell with valid layouts
    none of which fits is grey with the smallest peak they need; a tp × pp the scenario
    rules reject (no valid configuration, or listed in `invalid_cells`) is hatched
    "invalid". The title names the model, GPU count and hardware from the table."""
    key = HeatmapMetric(metric).value
    cells = heatmap_frame(sweep, key, invalid_cells)
    tps, pps = sorted(cells["tp"].unique()), sorted(cells["pp"].unique())
    by_cell = cells.set_index(["pp", "tp"])
    grid = [[100 * by_cell.loc[(pp, tp), "value"] for tp in tps] for pp in pps]
    figure = new_figure(1.6 * len(tps) + 3.0, 0.9 * len(pps) + 2.2)
    axes = figure.add_subplot()
    image = axes.imshow(grid, cmap="viridis", aspect="auto")
    for i, pp in enumerate(pps):
        for j, tp in enumerate(tps):
            cell = by_cell.loc[(pp, tp)]
            state = CellState(cell["state"])
            row = sweep.loc[cell["best_index"]] if state is CellState.FITS else None
            if state in HEATMAP_STATES:
                face, hatch, _ = HEATMAP_STATES[state]
                axes.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=face, hatch=hatch,
                                         edgecolor="#808080", linewidth=0))  # fmt: skip
            dark = row is not None and float(image.norm(100 * float(row[key]))) <= 0.6  # type: ignore[arg-type]
            axes.text(j, i, _cell_label(cell, row, key), ha="center", va="center", fontsize="x-small",
                      color="white" if dark else "black")  # fmt: skip
    axes.set_xticks(range(len(tps)), [str(t) for t in tps])
    axes.set_yticks(range(len(pps)), [str(p) for p in pps])
    axes.set_xlabel("tensor parallel (tp)")
    axes.set_ylabel("pipeline parallel (pp)")
    subject = sweep_subject(sweep)
    axes.set_title(f"best {key.upper()} of fitting configurations" + (f"\n{subject}" if subject else ""))
    shown = [state for state in HEATMAP_STATES if (cells["state"] == state.value).any()]
    if shown:
        handles = [Patch(facecolor=HEATMAP_STATES[s][0], hatch=HEATMAP_STATES[s][1], edgecolor="#808080",
                         label=HEATMAP_STATES[s][2]) for s in shown]  # fmt: skip
        figure.legend(handles=handles, loc="outside lower center", fontsize="x-small", ncols=len(handles))
    figure.colorbar(image, ax=axes, label=f"{key.upper()} (%)")
    return figure


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
    subject = sweep_subject(sweep)
    axes.set_title("memory vs iteration time" + (f": {subject}" if subject else ""))
    axes.legend(fontsize="small")
    return figure
