"""`simcluster` command line: thin commands over the library."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from simcluster.config.errors import ConfigError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


def _fail(error: Exception) -> None:
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(code=2)


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    json_output: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    trace: Annotated[Path | None, typer.Option(help="write a Chrome trace-event JSON (Perfetto)")] = None,
    hardware: Annotated[str | None, typer.Option(help="override the scenario's hardware profile")] = None,
) -> None:
    """Simulate one training iteration: time, MFU/HFU, breakdown, per-stage memory."""
    from simcluster.config.hardware import load_hardware
    from simcluster.config.scenario import load_scenario
    from simcluster.engine.trace import write_trace
    from simcluster.report.tables import format_result
    from simcluster.simulation import run_simulation

    try:
        spec = load_scenario(scenario)
        profile = load_hardware(hardware or spec.hardware, relative_to=scenario.parent)
    except ConfigError as error:
        _fail(error)
    sim = run_simulation(spec, profile, record=trace is not None)
    if trace is not None:
        write_trace(sim.engine, trace)
    if json_output:
        typer.echo(json.dumps(sim.result.to_json_dict(), indent=2))
    else:
        typer.echo(format_result(sim.result))
        if trace is not None:
            typer.echo(f"\ntrace written to {trace}")


@app.command()
def validate(
    hardware: Annotated[
        str | None, typer.Option(help="profile to validate (default: each scenario's)")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Predicted vs measured for the paper's Tables 4 and 5."""
    from simcluster.config.hardware import load_hardware
    from simcluster.report.validation import format_validation
    from simcluster.validation import table4_comparisons, table5_comparisons

    profile = load_hardware(hardware) if hardware else None
    rows = table4_comparisons(profile) + table5_comparisons(profile)
    if json_output:
        typer.echo(json.dumps([{**asdict(row), "error": row.error} for row in rows], indent=2))
    else:
        typer.echo(format_validation(rows))


def main() -> None:
    try:
        app()
    except ConfigError as error:
        typer.echo(f"error: {error}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
