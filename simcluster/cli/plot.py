"""`simcluster plot KIND …`: the paper's figures, a run's timeline and sweep plots.

The output format follows the suffix of `--out` (.png, .svg or .pdf).
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from simcluster.cli._app import app, fail, output_file
from simcluster.cli._hwprofiles import HwProfiles, use_hwprofiles
from simcluster.config.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

    from simcluster.report.plots import Figure

plot_app = typer.Typer(no_args_is_help=True, help="Draw figures (PNG, SVG or PDF by the --out suffix).")
app.add_typer(plot_app, name="plot")


class Metric(str, enum.Enum):
    """`simcluster.report.plots.HeatmapMetric`, restated so that the CLI starts without
    importing matplotlib and pandas (about a second)."""

    MFU = "mfu"
    HFU = "hfu"


Out = Annotated[Path, typer.Option("--out", "-o", help="figure file (.png, .svg or .pdf)")]
Hardware = Annotated[
    str | None, typer.Option(help="hardware profile stem or path, instead of the scenario's")
]


def _checked(out: Path) -> Path:
    """Before drawing: a known figure format, and a path that can be written."""
    from simcluster.report.plots import check_figure_path

    try:
        check_figure_path(out)
    except ValueError as error:
        fail(error)
    return output_file(out, "--out")


def _save(figure: Figure, out: Path) -> None:
    from simcluster.report.plots import save_figure

    typer.echo(f"wrote {save_figure(figure, out)}")


def _read_sweep(path: Path) -> pd.DataFrame:
    import pandas as pd

    if not path.is_file():
        fail(f"{path}: no such file")
    try:
        table = pd.read_csv(path) if path.suffix.lower() == ".csv" else pd.read_parquet(path)
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid and pandas' parser errors are ValueErrors
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        fail(f"{path}: not a readable sweep table (Parquet, or CSV by its suffix): {reason}")
    needed = {"tp", "pp", "status", "fits", "mfu", "iteration_time_s", "max_stage_peak_memory_bytes"}
    missing = sorted(needed - set(table.columns))
    if missing:
        fail(f"{path}: not a sweep table; missing columns: {', '.join(missing)}")
    return table


@plot_app.command("memory-ladder")
def memory_ladder(out: Out = Path("memory-ladder.png")) -> None:
    """Figure 7: per-layer activation memory as % of the tensor-parallel baseline."""
    from simcluster.report import plots

    _checked(out)
    _save(plots.memory_ladder_figure(plots.memory_ladder_frame()), out)


@plot_app.command("table5")
def table5(out: Out = Path("table5.png"), hardware: Hardware = None) -> None:
    """Table 5: full recompute vs SP + selective iteration time, predicted next to measured."""
    from simcluster.config.hardware import load_hardware
    from simcluster.report import plots
    from simcluster.validation import table5_comparisons

    _checked(out)
    try:
        profile = load_hardware(hardware) if hardware else None
    except ConfigError as error:
        fail(error)
    _save(plots.table5_figure(table5_comparisons(profile)), out)


@plot_app.command("timeline")
def timeline(
    scenario: Annotated[Path, typer.Argument(help="a scenario YAML file")],
    out: Out = Path("timeline.png"),
    hardware: Hardware = None,
    hwprofiles: HwProfiles = None,
) -> None:
    """Pipeline Gantt chart per stage (forward, backward, recompute, comms, idle) of one run."""
    from simcluster.config.hardware import load_hardware
    from simcluster.config.scenario import load_scenario
    from simcluster.report import plots
    from simcluster.simulation import run_simulation

    _checked(out)
    use_hwprofiles(hwprofiles)
    try:
        spec = load_scenario(scenario)
        profile = load_hardware(hardware or spec.hardware, relative_to=scenario)
    except ConfigError as error:
        fail(error)
    simulation = run_simulation(spec, profile, record=True)
    title = f"{spec.name} on {profile.name}: {simulation.result.iteration_time_s:.3f} s per iteration"
    _save(plots.timeline_figure(plots.timeline_frame(simulation), title), out)


@plot_app.command("sweep-heatmap")
def sweep_heatmap(
    table: Annotated[Path, typer.Argument(help="a sweep's Parquet (or CSV) output")],
    out: Out = Path("sweep-heatmap.png"),
    metric: Annotated[Metric, typer.Option(help="what to colour")] = Metric.MFU,
) -> None:
    """tp × pp heatmap of the best MFU (or HFU) among configurations that fit."""
    from simcluster.report import plots

    _checked(out)
    figure = plots.sweep_heatmap_figure(_read_sweep(table), plots.HeatmapMetric(metric.value))
    _save(figure, out)


@plot_app.command("pareto")
def pareto(
    table: Annotated[Path, typer.Argument(help="a sweep's Parquet (or CSV) output")],
    out: Out = Path("pareto.png"),
    capacity_gb: Annotated[float | None, typer.Option(help="draw the GPU memory line (GB)")] = None,
) -> None:
    """Peak memory vs iteration time of a sweep, with the Pareto front highlighted."""
    from simcluster import units
    from simcluster.report import plots

    _checked(out)
    capacity = units.gb_to_bytes(capacity_gb) if capacity_gb is not None else None
    _save(plots.pareto_figure(_read_sweep(table), capacity), out)
