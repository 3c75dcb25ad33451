"""`simcluster run FILE|FOLDER`: simulate one iteration of each scenario."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from simcluster.cli._app import Force, app, fail, output_file, scenario_file
from simcluster.cli._hwprofiles import HwProfiles, load_profile, use_hwprofiles
from simcluster.config.errors import ConfigError


def _scenario_files(target: Path) -> list[Path]:
    target = scenario_file(target, folders=True)  # a path, or a shipped name (`paper`, a stem)
    if target.is_dir():
        files = sorted(target.glob("*.yaml")) + sorted(target.glob("*.yml"))
        if not files:
            fail(f"{target}: no scenario files (*.yaml) in this folder")
        return files
    return [target]


@app.command()
def run(
    target: Annotated[
        Path, typer.Argument(help="a scenario YAML file, a folder of them, or a shipped scenario's name")
    ],
    json_output: Annotated[bool, typer.Option("--json", help="print JSON (one object per scenario)")] = False,
    trace: Annotated[Path | None, typer.Option(help="write a Chrome trace-event JSON (Perfetto)")] = None,
    hardware: Annotated[
        str | None, typer.Option(help="hardware profile stem or path, instead of the scenario's")
    ] = None,
    steady_state: Annotated[
        bool,
        typer.Option(
            "--steady-state",
            help="simulate a short run and extend its certified steady state to every microbatch "
            "(for huge batches; same numbers to float rounding; no --trace)",
        ),
    ] = False,
    hwprofiles: HwProfiles = None,
    force: Force = False,
) -> None:
    """Simulate one training iteration: time, MFU/HFU, time breakdown, per-stage memory."""
    from simcluster.config.profiles import find_profile
    from simcluster.config.scenario import load_scenario, require_hardware_fits
    from simcluster.engine.trace import write_trace
    from simcluster.report.tables import format_result, format_summary, format_time_by_kind
    from simcluster.simulation import require_finite, run_simulation

    use_hwprofiles(hwprofiles)
    files = _scenario_files(target)
    if trace is not None and len(files) > 1:
        fail("--trace needs a single scenario file, not a folder")
    if trace is not None and steady_state:
        fail("--trace needs every task simulated; leave out --steady-state")
    if trace is not None:
        output_file(trace, "--trace", force, inputs=files)
    results, problems = [], []
    for path in files:
        # One bad file in a folder must not stop the others: run every good one, then
        # report every bad one and exit 2.
        try:
            spec = load_scenario(path)
            profile = load_profile(hardware or spec.hardware, relative_to=path)
            if trace is not None:  # the profile file is an input too
                output_file(trace, "--trace", force, inputs=[find_profile(hardware or spec.hardware, path)])
            require_hardware_fits(spec, profile, path)  # names the file, not only the scenario
            # Every microbatch by default: bit-for-bit the published numbers, and a trace on request.
            sim = run_simulation(spec, profile, record=trace is not None, steady_state=steady_state)
            require_finite(sim.result, path)
        except ConfigError as error:
            if len(files) == 1:
                fail(error)
            problems.append(error)
            continue
        if trace is not None:
            write_trace(sim.engine, trace)
        results.append(sim.result)
    if json_output:
        payload = [r.to_json_dict() for r in results]
        if results:
            single = len(payload) == 1 and not problems
            typer.echo(json.dumps(payload[0] if single else payload, indent=2, allow_nan=False))
    elif len(files) == 1:
        typer.echo(format_result(results[0]))
        typer.echo("\n" + format_time_by_kind(results[0]))
        if trace is not None:
            typer.echo(f"\ntrace written to {trace} (open in https://ui.perfetto.dev)")
    elif results:
        typer.echo(format_summary(results))
    for problem in problems:
        typer.echo(f"error: {problem}", err=True)
    if problems:
        fail(f"{len(problems)} of {len(files)} scenario files in {target} could not be run (above)")
