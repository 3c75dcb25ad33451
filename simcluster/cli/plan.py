"""`simcluster plan SCENARIO --gpus N`: the fastest layouts that fit, with Megatron flags."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from simcluster.cli._app import app, fail, scenario_file
from simcluster.cli._hwprofiles import HwProfiles, load_profile, use_hwprofiles
from simcluster.config.errors import ConfigError

if TYPE_CHECKING:
    from simcluster.plan import PlanResult

_LABELS = {
    "micro_batch_size": "mbs",
    "sequence_parallel": "sp",
    "use_distributed_optimizer": "dist-opt",
    "overlap_grad_reduce": "overlap-grad",
}


def _int_list(name: str, text: str) -> list[int]:
    """`--ep 8,16,32`: the comma-separated positive integers (PlanError naming the option)."""
    from simcluster.plan import PlanError

    values = []
    for item in text.split(","):
        try:
            values.append(int(item.strip()))
        except ValueError:
            raise PlanError(
                f"--{name}: value {item.strip()!r} in {text!r}: allowed: positive integers, comma-separated"
            ) from None
    return values


def _value(scenario: object, column: str) -> str:
    from simcluster.plan.space import axis_section

    section = axis_section(column)
    value = getattr(getattr(scenario, section), column)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(getattr(value, "value", value))


def format_plan(result: PlanResult) -> str:
    from simcluster import units
    from simcluster.plan.search import describe_layout, differing_axes, layout_columns
    from simcluster.report.tables import format_duration, format_table

    differing = differing_axes(result)
    rows = [
        [
            rank, *(_value(c.scenario, column) for column in differing),
            format_duration(c.iteration_time_s), f"{100 * c.mfu:.1f}", f"{c.tokens_per_s_per_gpu:,.0f}",
            f"{units.bytes_to_gb(c.peak_memory_bytes):.1f}", f"{units.bytes_to_gb(c.headroom_bytes):.1f}",
            f"{100 * c.headroom_bytes / c.capacity_bytes:.1f}",
        ]
        for rank, c in enumerate(result.candidates, start=1)
    ]  # fmt: skip
    headers = ["#", *(_LABELS.get(column, column) for column in differing), "iteration", "MFU %",
               "tokens/s/GPU", "peak GB", "headroom GB", "headroom %"]  # fmt: skip
    winner = result.candidates[0]
    lines = [
        f"{result.searched} layouts of {result.num_gpus} GPUs ({result.hardware}, "
        f"{units.bytes_to_gb(result.capacity_bytes):.1f} GB, headroom {result.headroom_fraction:g}): "
        f"{result.pruned_memory} pruned by memory, {result.pruned_bound} by the time bound, "
        f"{result.simulated} simulated in {result.elapsed_s:.1f} s",
        "",
        format_table(headers, rows),
        "",
        f"best: {describe_layout(winner.scenario)}",
        "Megatron-LM:",
        winner.megatron_args or f"(not written: {winner.megatron_args_problem})",
    ]
    common = [column for column in layout_columns(result.axes) if column not in differing]
    if winner.scenario.parallel.cp == 1:
        common = [column for column in common if column != "cp"]  # cp shown only when used
    if len(result.candidates) > 1 and common:
        shown = ", ".join(f"{_LABELS.get(c, c)} {_value(winner.scenario, c)}" for c in common)
        lines.insert(1, f"same in all {len(result.candidates)}: {shown}")
    return "\n".join(lines)


@app.command()
def plan(
    scenario: Annotated[
        Path,
        typer.Argument(
            help="a scenario YAML (model, global batch, dtype, hardware) or a shipped scenario's name"
        ),
    ],
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="number of GPUs to plan for")],
    hardware: Annotated[
        str | None, typer.Option(help="hardware profile stem or path, instead of the scenario's")
    ] = None,
    headroom: Annotated[
        float, typer.Option(help="fraction of device memory a layout must leave free, in [0, 1)")
    ] = 0.1,
    top: Annotated[int, typer.Option(min=1, help="how many layouts to show")] = 10,
    json_output: Annotated[bool, typer.Option("--json", help="print the answer as JSON")] = False,
    workers: Annotated[int, typer.Option(min=1, help="local processes that simulate")] = 1,
    progress: Annotated[bool, typer.Option(help="progress bars on stderr")] = True,
    ep: Annotated[
        str | None,
        typer.Option(
            help="MoE: expert-parallel sizes to try, e.g. 8 or 8,16,32 (default: divisors of num_experts)"
        ),
    ] = None,
    etp: Annotated[
        str | None,
        typer.Option(
            help="MoE: expert tensor-parallel sizes to try, e.g. 1 (default: 1 and the layout's tp)"
        ),
    ] = None,
    hwprofiles: HwProfiles = None,
) -> None:
    """Search tp, pp, vpp, micro-batch, sequence parallelism, recompute and the distributed
    optimizer (and a MoE model's ep and etp) for the fastest layouts that fit; print them and
    the winner's Megatron flags."""
    from simcluster.plan import PlanError, plan_layouts
    from simcluster.plan.base import load_plan_scenario

    use_hwprofiles(hwprofiles)
    path = scenario_file(scenario)
    try:
        base = load_plan_scenario(path, hardware)
        profile = load_profile(base.hardware, relative_to=path)
        choices = {
            name: _int_list(name, text) for name, text in (("ep", ep), ("etp", etp)) if text is not None
        }
        result = plan_layouts(
            base, profile, gpus, headroom_fraction=headroom, top=top, workers=workers, progress=progress,
            choices=choices,
        )  # fmt: skip
    except (ConfigError, PlanError) as error:
        fail(error)
    if json_output:
        typer.echo(json.dumps(result.to_json_dict(), indent=2))
    else:
        typer.echo(format_plan(result))
