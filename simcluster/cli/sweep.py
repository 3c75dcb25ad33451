"""`simcluster sweep SPEC.yaml --out FILE.parquet`: run a parameter sweep."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from simcluster.cli._app import Force, app, fail
from simcluster.cli._hwprofiles import HwProfiles, use_hwprofiles
from simcluster.config.errors import ConfigError
from simcluster.headroom import DEFAULT_HEADROOM_FRACTION

if TYPE_CHECKING:
    import pandas as pd

    from simcluster.sweep import SweepOutcome
    from simcluster.sweep.run import SweepInterrupted


_LABELS = {
    "micro_batch_size": "mbs",
    "global_batch_size": "gbs",
    "sequence_parallel": "sp",
    "use_distributed_optimizer": "dist-opt",
    "overlap_grad_reduce": "overlap-grad",
    "seq_length": "seq",
}


def _cell(value: object) -> str:
    import numpy as np

    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    return str(value)


def _top_table(outcome: SweepOutcome, count: int) -> str:
    """The best `count` that fit (by MFU; by tokens/s per GPU when the hardware varies), with
    every swept axis as a column (so two rows that differ only in, say, the distributed
    optimizer look different)."""
    from simcluster import units
    from simcluster.report.tables import format_duration, format_table
    from simcluster.sweep import best_rows
    from simcluster.sweep.run import RANK_BY_TOKENS
    from simcluster.sweep.summary import swept_columns

    columns = swept_columns(outcome)
    best, ranked_by = best_rows(outcome.table, count)
    rows = [
        [
            *(_cell(row[column]) for column in columns),
            f"{100 * row.mfu:.1f}", f"{row.tokens_per_s_per_gpu:,.0f}", format_duration(row.iteration_time_s),
            f"{units.bytes_to_gb(row.max_stage_peak_memory_bytes):.1f}",
            f"{units.bytes_to_gb(row.memory_headroom_bytes):.1f}",
        ]
        for _, row in best.iterrows()
    ]  # fmt: skip
    headers = [
        *(_LABELS.get(c, c) for c in columns),
        "MFU %",
        "tokens/s/GPU",
        "iteration",
        "peak GB",
        "headroom GB",
    ]
    if not rows:
        return f"no simulated configuration fits with headroom {outcome.headroom_fraction:g}"
    order = (
        "ranked by tokens/s per GPU: the hardware differs between rows, and MFU is of each GPU's own peak"
        if ranked_by == RANK_BY_TOKENS
        else "ranked by MFU (one hardware profile)"
    )
    return "\n".join([order, format_table(headers, rows), "", *_winner_flags(outcome, best.iloc[0])])


def _winner_flags(outcome: SweepOutcome, row: pd.Series) -> list[str]:
    """The best row's Megatron-LM launch line (as `plan` prints its winner's)."""
    from simcluster.sweep.summary import configs_by_id, row_megatron_args

    try:
        return ["Megatron-LM (the first row):", row_megatron_args(outcome, row, configs_by_id(outcome))]
    except ConfigError as error:
        return [f"Megatron-LM: the first row cannot be launched: {'; '.join(error.problems)}"]


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
        f"table: {counts or 'empty'} (fits: headroom {outcome.headroom_fraction:g} of usable memory) -> {out}"
    )
    return "\n".join(lines)


def _interrupted(interrupt: SweepInterrupted) -> str:
    """Where the finished rows are, only if a file holds them."""
    out = interrupt.out
    if interrupt.rows is None:
        kept = f" ({out} is as it was)" if out.exists() else ""
        return f"interrupted before the sweep started: nothing was written to {out}{kept}"
    return f"interrupted: the {interrupt.rows} finished rows are in {out}; run again with --resume"


@app.command()
def sweep(
    spec: Annotated[Path, typer.Argument(help="a sweep spec YAML (base, num_gpus, axes)")],
    out: Annotated[
        Path,
        typer.Option(
            "--out", help="Parquet file the rows stream to (new; an earlier one with --resume or --force)"
        ),
    ],
    csv: Annotated[bool, typer.Option("--csv", help="also write the table as CSV next to --out")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="skip configurations already in --out")] = False,
    workers: Annotated[int | None, typer.Option(min=1, help="local processes (default: every core)")] = None,
    dask: Annotated[str | None, typer.Option(help="Dask scheduler address, e.g. tcp://host:8786")] = None,
    top: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="print the best N that fit, by MFU (by tokens/s per GPU when the hardware varies; "
            "--json: default 10)",
        ),
    ] = None,
    headroom: Annotated[
        float,
        typer.Option(help="fraction of usable device memory a configuration must leave free, in [0, 1)"),
    ] = DEFAULT_HEADROOM_FRACTION,
    json_output: Annotated[
        bool, typer.Option("--json", help="print the summary and the best rows as JSON")
    ] = False,
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
    force: Force = False,
) -> None:
    """Simulate every valid configuration of a spec's axes; rows stream to Parquet."""
    from simcluster.sweep import execute_sweep
    from simcluster.sweep.run import SweepInterrupted

    use_hwprofiles(hwprofiles)

    try:
        outcome = execute_sweep(
            spec, out, workers=workers, dask=dask, csv=csv, resume=resume, progress=progress,
            headroom_fraction=headroom, full_simulation=full_simulation, force=force,
        )  # fmt: skip
    except (ConfigError, OSError) as error:  # OSError: --out not writable, --dask unreachable
        fail(error)
    except SweepInterrupted as interrupt:
        fail(_interrupted(interrupt), code=130)
    except KeyboardInterrupt:
        fail(f"interrupted before the sweep started: nothing was written to {out}", code=130)
    if outcome.replaced:
        typer.echo(outcome.replaced, err=True)
    if json_output:
        from simcluster.sweep.summary import DEFAULT_TOP, sweep_json

        typer.echo(json.dumps(sweep_json(outcome, out, top or DEFAULT_TOP), indent=2, allow_nan=False))
        return
    typer.echo(_summary(outcome, out, show_invalid))
    if top is not None:
        typer.echo(_top_table(outcome, top))
