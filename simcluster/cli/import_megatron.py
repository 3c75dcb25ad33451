"""`simcluster import-megatron "ARGS"`: a Megatron-LM launch command line -> scenario YAML."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from simcluster.cli._app import Force, app, fail, output_file
from simcluster.cli._hwprofiles import HwProfiles, use_hwprofiles
from simcluster.config.errors import ConfigError
from simcluster.config.megatron_flags import SOURCE


@app.command(
    "import-megatron",
    # Megatron's flags arrive as arguments: unknown options must not be parsed as ours.
    context_settings={"ignore_unknown_options": True},
)
def import_megatron(
    args: Annotated[
        list[str],
        typer.Argument(
            help='the launch command line, quoted: "torchrun … pretrain_gpt.py --num-layers 96 …" '
            '("-" reads it from stdin)',
            show_default=False,
        ),
    ],
    out: Annotated[Path | None, typer.Option(help="write the scenario here instead of stdout")] = None,
    hardware: Annotated[
        str | None,
        typer.Option(help="hardware profile stem or path (default a100-sxm4-80gb, said in a note)"),
    ] = None,
    name: Annotated[str | None, typer.Option(help="scenario name (default: --out's stem)")] = None,
    num_gpus: Annotated[
        int | None, typer.Option(min=1, help="world size, for dp = num_gpus / (tp * cp * pp)")
    ] = None,
    hwprofiles: HwProfiles = None,
    force: Force = False,
) -> None:
    """Turn Megatron-LM arguments into a scenario; unknown and ignored flags are listed."""
    from simcluster.config.hardware import load_hardware
    from simcluster.config.megatron_args import DEFAULT_HARDWARE, parse_megatron_args
    from simcluster.config.megatron_import import hardware_refusals
    from simcluster.output_files import write_text_atomically

    use_hwprofiles(hwprofiles)
    if out is not None:
        output_file(out, "--out", force)
    command = sys.stdin.read() if args == ["-"] else args
    try:
        profile = load_hardware(hardware or DEFAULT_HARDWARE)
        imported = parse_megatron_args(
            command, hardware, name or (out.stem if out else "megatron-import"), num_gpus
        )
        if refusals := hardware_refusals(imported, profile):
            raise ConfigError(SOURCE, refusals)
    except ConfigError as error:
        fail(error)
    for line in imported.comment_lines():
        typer.echo(line, err=True)
    if out is None:
        typer.echo(imported.to_yaml(), nl=False)
        return
    write_text_atomically(out, imported.to_yaml())
    typer.echo(f"wrote {out}", err=True)
