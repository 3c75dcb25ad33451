"""`simcluster sweep SPEC.yaml --out FILE.parquet`: run a parameter sweep."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from simcluster.cli._app import app, fail
from simcluster.cli._hwprofiles import HwProfiles, use_hwprofiles
from simcluster.config.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

    from simcluster.sweep import SweepOutcome


def _top_table(table: pd.DataFrame, count: int) -> str:
    from simcluster import units
    from simcluster.report.tables import format_table
    from simcluster.sweep import best_by_mfu

    best = best_by_mfu(table, count)
    rows = [
        [
            row.tp, row.pp, row.dp, row.vpp, row.micro_batch_size,
            "yes" if row.sequence_parallel else "no", row.recompute,
            f"{100 * row.mfu:.1f}", f"{row.iteration_time_s:.3f}",
            f"{units.bytes_to_gb(row.max_stage_peak_memory_bytes):.1f}",
            f"{units.bytes_to_gb(row.memory_headroom_bytes):.1f}",
        ]
        for row in best.itertuples()
    ]  # fmt: skip
    headers = ["tp", "pp", "dp", "vpp", "mbs", "sp", "recompute", "MFU %", "iter s", "peak GB", "headroom GB"]
    return format_table(headers, rows) if rows else "no simulated configuration fits with memory headroom"


def _summary(outcome: SweepOutcome, out: Path, show_invalid: bool) -> str:
    expansion = outcome.expansion
    lines = (
        [f"invalid {key}: {'; '.join(problems)}" for key, problems in expansion.invalid]
        if show_invalid
        else []
    )
    by_field = ", ".join(f"{field} {n}" for field, n in expansion.invalid_by_field().items())
    counts = ", ".join(f"{status} {n}" for status, n in sorted(outcome.status_counts.items()))
    lines.append(
        f"{expansion.num_combinations} combinations: {len(expansion.configs)} valid, "
        f"{len(expansion.invalid)} invalid{f' ({by_field})' if by_field else ''}"
    )
    lines.append(
        f"ran {outcome.num_run} ({outcome.num_resumed} already in {out}) in {outcome.elapsed_s:.1f} s; "
        f"table: {counts or 'empty'} -> {out}"
    )
    return "\n".join(lines)


@app.command()
def sweep(
    spec: Annotated[Path, typer.Argument(help="a sweep spec YAML (base, num_gpus, axes)")],
    out: Annotated[
        Path, typer.Option("--out", help="Parquet file the rows stream to (new, or an earlier sweep's)")
    ],
    csv: Annotated[bool, typer.Option("--csv", help="also write the table as CSV next to --out")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="skip configurations already in --out")] = False,
    workers: Annotated[int | None, typer.Option(min=1, help="local processes (default: every core)")] = None,
    dask: Annotated[str | None, typer.Option(help="Dask scheduler address, e.g. tcp://host:8786")] = None,
    top: Annotated[int | None, typer.Option(min=1, help="print the best N by MFU that fit")] = None,
    show_invalid: Annotated[
        bool, typer.Option("--show-invalid", help="list every filtered-out combination")
    ] = False,
    progress: Annotated[bool, typer.Option(help="progress bar on stderr")] = True,
    full_simulation: Annotated[
        bool,
        typer.Option(
            "--full-simulation",
            help="simulate every microbatch instead of extending the engine's certified steady "
            "state from one short run (same numbers to float rounding, slower)",
        ),
    ] = False,
    hwprofiles: HwProfiles = None,
) -> None:
    """Simulate every valid configuration of a spec's axes; rows stream to Parquet."""
    from simcluster.sweep import execute_sweep

    use_hwprofiles(hwprofiles)

    try:
        outcome = execute_sweep(
            spec, out, workers=workers, dask=dask, csv=csv, resume=resume, progress=progress,
            full_simulation=full_simulation,
        )
    except (ConfigError, OSError) as error:  # OSError: --out not writable, --dask unreachable
        fail(error)
    except KeyboardInterrupt:
        fail(f"interrupted: the finished rows are in {out}; run again with --resume", code=130)
    typer.echo(_summary(outcome, out, show_invalid))
    if top is not None:
        typer.echo(_top_table(outcome.table, top))
