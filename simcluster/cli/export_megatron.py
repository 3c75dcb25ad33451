"""`simcluster export-megatron SCENARIO`: a scenario -> the Megatron-LM launch flags."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated

import typer

from simcluster.cli._app import app, fail, scenario_file
from simcluster.cli._hwprofiles import HwProfiles, load_profile, use_hwprofiles
from simcluster.config.errors import ConfigError


@app.command("export-megatron")
def export_megatron(
    scenario: Annotated[
        Path, typer.Argument(help="a scenario YAML file or a shipped scenario's name", show_default=False)
    ],
    json_output: Annotated[
        bool, typer.Option("--json", help="print JSON: the command line, its words and the world size")
    ] = False,
    gpus_per_node: Annotated[
        int | None,
        typer.Option(min=1, help="torchrun --nproc_per_node (default: the hardware profile's GPUs per node)"),
    ] = None,
    hwprofiles: HwProfiles = None,
) -> None:
    """Print the torchrun + pretrain_gpt.py flags that run SCENARIO under Megatron-LM
    (`import-megatron` reads them back to the same scenario). Keys the simulator does not
    price yet are exported too: the flags describe the run, nothing is simulated."""
    from simcluster.config.megatron_args import to_megatron_args
    from simcluster.config.scenario import load_scenario

    use_hwprofiles(hwprofiles)
    path = scenario_file(scenario)
    try:
        spec = load_scenario(path, refuse_unpriced=False)
        per_node = gpus_per_node or load_profile(spec.hardware, relative_to=path).network.gpus_per_node
        command = to_megatron_args(spec, per_node)
    except ConfigError as error:
        fail(error)
    if json_output:
        payload = {
            "scenario": spec.name,
            "num_gpus": spec.num_gpus,
            "command": command,
            "args": shlex.split(command),
        }
        typer.echo(json.dumps(payload, indent=2))
    else:
        typer.echo(command)
