"""`simcluster compare A.yaml B.yaml [...]`: scenarios side by side, differences marked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from simcluster.cli._app import app, fail, scenario_file
from simcluster.cli._hwprofiles import HwProfiles, load_profile, use_hwprofiles
from simcluster.config.errors import ConfigError


@app.command()
def compare(
    files: Annotated[
        list[Path], typer.Argument(help="two or more scenario YAML files or shipped scenarios' names")
    ],
    json_output: Annotated[bool, typer.Option("--json", help="print the comparison as JSON")] = False,
    hardware: Annotated[
        str | None, typer.Option(help="hardware profile stem or path for every scenario, instead of theirs")
    ] = None,
    hwprofiles: HwProfiles = None,
) -> None:
    """Simulate each scenario; show time per category and memory per stage side by side,
    with each value's change relative to the first and the rows that differ marked."""
    from simcluster.config.scenario import load_scenario, require_hardware_fits
    from simcluster.report.compare import compare_results, format_comparison
    from simcluster.simulation import run_simulation

    if len(files) < 2:
        fail(f"compare: got {len(files)} scenario file; give two or more")
    use_hwprofiles(hwprofiles)
    scenarios, results = [], []
    for path in map(scenario_file, files):
        try:
            scenario = load_scenario(path)
            profile = load_profile(hardware or scenario.hardware, relative_to=path)
            require_hardware_fits(scenario, profile, path)
        except ConfigError as error:
            fail(error)
        scenarios.append(scenario)
        results.append(run_simulation(scenario, profile).result)
    comparison = compare_results(scenarios, results)
    if json_output:
        typer.echo(json.dumps(comparison.to_json_dict(), indent=2))
    else:
        typer.echo(format_comparison(comparison))
