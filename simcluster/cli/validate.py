"""`simcluster validate`: predicted vs measured for the paper's Tables 4 and 5."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated

import typer

from simcluster.cli._app import app
from simcluster.cli._hwprofiles import HwProfiles, use_hwprofiles


@app.command()
def validate(
    hardware: Annotated[
        str | None, typer.Option(help="profile to validate (default: each scenario's own)")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print a JSON list of comparisons")] = False,
    fit_table4: Annotated[
        bool,
        typer.Option("--fit-table4", help="fit gemm_max_efficiency and tp_overlap_fraction to Table 4"),
    ] = False,
    hwprofiles: HwProfiles = None,
) -> None:
    """Compare predictions with Tables 4 and 5 (exits non-zero only if a run breaks)."""
    from simcluster.config.hardware import HardwareProfile, load_hardware
    from simcluster.report.validation import format_validation
    from simcluster.validation import (
        fit_table4 as fit,
    )
    from simcluster.validation import (
        table4_comparisons,
        table5_comparisons,
        with_constants,
    )

    use_hwprofiles(hwprofiles)
    profile: HardwareProfile | None = load_hardware(hardware or "a100-sxm4-80gb")
    if fit_table4 and profile is not None:
        result = fit(profile)
        typer.echo(
            f"fitted to Table 4 from {profile.name}: compute.gemm_max_efficiency = "
            f"{result.gemm_max_efficiency}, network.tp_overlap_fraction = {result.tp_overlap_fraction} "
            f"(rms relative error {100 * result.rms_error:.2f} %)"
        )
        profile = with_constants(profile, result.gemm_max_efficiency, result.tp_overlap_fraction)
        profile = profile.model_copy(update={"calibration": {"fitted_to": "Table 4 (this run)"}})
    elif hardware is None:
        profile = None  # each scenario's own profile
    rows = table4_comparisons(profile) + table5_comparisons(profile)
    if json_output:
        typer.echo(json.dumps([{**asdict(row), "error": row.error} for row in rows], indent=2))
    else:
        typer.echo(format_validation(rows, profile))
