"""`simcluster run FILE|FOLDER`: simulate one iteration of each scenario."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from simcluster.cli._app import app, fail, output_file
from simcluster.config.errors import ConfigError


def _scenario_files(target: Path) -> list[Path]:
    if target.is_dir():
        files = sorted(target.glob("*.yaml")) + sorted(target.glob("*.yml"))
        if not files:
            fail(f"{target}: no scenario files (*.yaml) in this folder")
        return files
    if not target.exists():
        fail(f"{target}: no such file or folder")
    return [target]


@app.command()
def run(
    target: Annotated[Path, typer.Argument(help="a scenario YAML file, or a folder of them")],
    json_output: Annotated[bool, typer.Option("--json", help="print JSON (one object per scenario)")] = False,
    trace: Annotated[Path | None, typer.Option(help="write a Chrome trace-event JSON (Perfetto)")] = None,
    hardware: Annotated[
        str | None, typer.Option(help="hardware profile stem or path, instead of the scenario's")
    ] = None,
) -> None:
    """Simulate one training iteration: time, MFU/HFU, time breakdown, per-stage memory."""
    from simcluster.config.hardware import load_hardware
    from simcluster.config.scenario import load_scenario
    from simcluster.engine.trace import write_trace
    from simcluster.report.tables import format_result, format_summary
    from simcluster.simulation import run_simulation

    files = _scenario_files(target)
    if trace is not None and len(files) > 1:
        fail("--trace needs a single scenario file, not a folder")
    if trace is not None:
        output_file(trace, "--trace")
    results = []
    for path in files:
        try:
            spec = load_scenario(path)
            profile = load_hardware(hardware or spec.hardware, relative_to=path.parent)
        except ConfigError as error:
            fail(error)
        sim = run_simulation(spec, profile, record=trace is not None)
        if trace is not None:
            write_trace(sim.engine, trace)
        results.append(sim.result)
    if json_output:
        payload = [r.to_json_dict() for r in results]
        typer.echo(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2))
    elif len(results) == 1:
        typer.echo(format_result(results[0]))
        if trace is not None:
            typer.echo(f"\ntrace written to {trace} (open in https://ui.perfetto.dev)")
    else:
        typer.echo(format_summary(results))
