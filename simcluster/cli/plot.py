"""`simcluster plot KIND …`: the paper's figures, a run's timeline and sweep plots.

The output format follows the suffix of `--out` (.png, .svg or .pdf).
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from simcluster.cli._app import Force, app, fail, output_file, scenario_file
from simcluster.cli._hwprofiles import HwProfiles, load_profile, use_hwprofiles
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
Where = Annotated[
    list[str] | None,
    typer.Option(help="keep rows whose COLUMN reads VALUE, e.g. model=gpt3-175b (repeatable)"),
]


def _range(option: str, text: str | None, kind: type[int] | type[float]) -> tuple[float, float] | None:
    """'A:B' as two numbers (exit 2 naming the option otherwise)."""
    if text is None:
        return None
    try:
        first, last = (kind(part) for part in text.split(":"))
    except ValueError:
        fail(f"{option}: value {text!r}: give A:B, e.g. {'8:15' if kind is int else '2.0:3.5'}")
    if not 0 <= first <= last:
        fail(f"{option}: value {text!r}: needs 0 <= A <= B")
    return first, last


def _where(sweep: pd.DataFrame, where: list[str] | None) -> pd.DataFrame:
    from simcluster.report.figure_data import select_rows

    pairs = {}
    for item in where or []:
        column, sep, value = item.partition("=")
        if not sep:
            fail(f"--where: value {item!r}: give COLUMN=VALUE, e.g. model=gpt3-175b")
        pairs[column] = value
    try:
        return select_rows(sweep, pairs)
    except ValueError as error:
        fail(error)


def _checked(out: Path, force: bool, inputs: list[Path] | None = None) -> Path:
    """Before drawing: a known figure format, and a path that can be written (a new file,
    or an existing one with --force; never the command's input)."""
    from simcluster.report.plots import check_figure_path

    try:
        check_figure_path(out)
    except ValueError as error:
        fail(error)
    return output_file(out, "--out", force, inputs or [])


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


def _invalid_cells(path: Path, sweep: pd.DataFrame) -> list[tuple[int, int]]:
    """The (tp, pp) cells the sweep recorded as rejected outright (Parquet metadata), for
    the models left in `sweep`; none for a CSV or an older table."""
    from simcluster.sweep.store import read_metadata

    found = read_metadata(path) if path.suffix.lower() != ".csv" else None
    cells = (found or {}).get("invalid_cells", [])
    models = set(sweep["model"]) if "model" in sweep.columns else None
    return [(int(tp), int(pp)) for model, tp, pp in cells if models is None or model in models]


@plot_app.command("memory-ladder")
def memory_ladder(out: Out = Path("memory-ladder.png"), force: Force = False) -> None:
    """Figure 7: per-layer activation memory as % of the tensor-parallel baseline."""
    from simcluster.report import plots

    _checked(out, force)
    _save(plots.memory_ladder_figure(plots.memory_ladder_frame()), out)


@plot_app.command("table5")
def table5(
    out: Out = Path("table5.png"),
    hardware: Hardware = None,
    hwprofiles: HwProfiles = None,
    force: Force = False,
) -> None:
    """Table 5: full recompute vs SP + selective iteration time, predicted next to measured."""
    from simcluster.report import plots
    from simcluster.validation import table5_comparisons

    use_hwprofiles(hwprofiles)
    _checked(out, force)
    try:
        profile = load_profile(hardware) if hardware else None
    except ConfigError as error:
        fail(error)
    _save(plots.table5_figure(table5_comparisons(profile)), out)


@plot_app.command("timeline")
def timeline(
    scenario: Annotated[Path, typer.Argument(help="a scenario YAML file or a shipped scenario's name")],
    out: Out = Path("timeline.png"),
    hardware: Hardware = None,
    microbatches: Annotated[
        str | None, typer.Option(help="draw only microbatches A:B (inclusive, from 0), e.g. 8:15")
    ] = None,
    window_s: Annotated[
        str | None, typer.Option("--window-s", help="draw only seconds A:B of the iteration, e.g. 2.0:3.5")
    ] = None,
    hwprofiles: HwProfiles = None,
    force: Force = False,
) -> None:
    """Pipeline Gantt chart per stage (forward, backward, recompute hatched, comms, idle) of
    one run; --microbatches or --window-s zoom in on part of a long one."""
    from simcluster.config.profiles import find_profile
    from simcluster.config.scenario import load_scenario, require_hardware_fits
    from simcluster.report import plots
    from simcluster.report.tables import format_duration
    from simcluster.simulation import run_simulation

    use_hwprofiles(hwprofiles)
    path = scenario_file(scenario)
    _checked(out, force, [path])
    try:
        spec = load_scenario(path)
        profile = load_profile(hardware or spec.hardware, relative_to=path)
        require_hardware_fits(spec, profile, path)
        _checked(out, force, [find_profile(hardware or spec.hardware, path)])  # the profile is an input too
    except ConfigError as error:
        fail(error)
    if microbatches is not None and window_s is not None:
        fail("--microbatches and --window-s: give one of them")
    chosen = _range("--microbatches", microbatches, int)
    window = _range("--window-s", window_s, float)
    simulation = run_simulation(spec, profile, record=True)
    frame = plots.timeline_frame(simulation)
    try:
        if chosen is not None:
            window = plots.microbatch_window_s(frame, int(chosen[0]), int(chosen[1]))
        elif window is not None and window[0] >= simulation.result.iteration_time_s:
            raise ValueError(f"--window-s: value {window_s!r}: the iteration ends at "
                             f"{simulation.result.iteration_time_s:.3f} s")  # fmt: skip
    except ValueError as error:
        fail(error)
    title = (
        f"{spec.name}: {spec.num_gpus} GPUs of {profile.name}, {spec.num_microbatches} microbatches, "
        f"{format_duration(simulation.result.iteration_time_s)} per iteration"
        + (f"\nmicrobatches {microbatches}" if microbatches else f"\n{window_s} s" if window_s else "")
    )
    highlight = (int(chosen[0]), int(chosen[1])) if chosen is not None else None
    _save(plots.timeline_figure(frame, title, window, highlight), out)


@plot_app.command("sweep-heatmap")
def sweep_heatmap(
    table: Annotated[Path, typer.Argument(help="a sweep's Parquet (or CSV) output")],
    out: Out = Path("sweep-heatmap.png"),
    metric: Annotated[Metric, typer.Option(help="what to colour")] = Metric.MFU,
    where: Where = None,
    force: Force = False,
) -> None:
    """tp × pp heatmap of the best MFU (or HFU) among configurations that fit; invalid
    layouts hatched, layouts that do not fit grey."""
    from simcluster.report import plots

    _checked(out, force, [table])
    sweep = _where(_read_sweep(table), where)
    if (problem := plots.mixed_subject(sweep)) is not None:
        fail(f"{table}: {problem}")
    invalid = _invalid_cells(table, sweep)
    figure = plots.sweep_heatmap_figure(sweep, plots.HeatmapMetric(metric.value), invalid)
    _save(figure, out)


@plot_app.command("pareto")
def pareto(
    table: Annotated[Path, typer.Argument(help="a sweep's Parquet (or CSV) output")],
    out: Out = Path("pareto.png"),
    capacity_gb: Annotated[float | None, typer.Option(help="draw the GPU memory line (GB)")] = None,
    where: Where = None,
    force: Force = False,
) -> None:
    """Peak memory vs iteration time of a sweep, with the Pareto front highlighted."""
    from simcluster import units
    from simcluster.report import plots

    _checked(out, force, [table])
    capacity = units.gb_to_bytes(capacity_gb) if capacity_gb is not None else None
    _save(plots.pareto_figure(_where(_read_sweep(table), where), capacity), out)
