"""`simcluster check-profile PROFILE`: the real layer at held-out shapes vs the prediction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from simcluster.calibration import DeviceKind
from simcluster.cli._app import Force, app, fail, output_file, output_folder
from simcluster.cli._hwprofiles import HwProfiles, use_hwprofiles
from simcluster.cli.calibrate import LayerModeOption, SustainedOption, _load, command_line, require_device
from simcluster.output_files import write_text_atomically


@app.command("check-profile")
def check_profile(
    profile: Annotated[str, typer.Argument(help="hardware profile stem or path")],
    device: Annotated[DeviceKind, typer.Option(help="where to run the layer")] = DeviceKind.CUDA,
    quick: Annotated[bool, typer.Option("--quick", help="the tiny held-out grid (a smoke test)")] = False,
    out_dir: Annotated[Path, typer.Option(help="folder for <profile>-<device>.csv and .md")] = Path(
        "hwprofiles/reports"
    ),
    measurements: Annotated[
        Path | None, typer.Option(help="use a saved `python -m simcluster.profiler.bench.layer_timing` JSON")
    ] = None,
    save_measurements: Annotated[Path | None, typer.Option(help="also write the raw timings JSON")] = None,
    threads: Annotated[int, typer.Option(help="CPU intra-op threads while measuring")] = 1,
    json_output: Annotated[
        bool, typer.Option("--json", help="print the summary, the by-kind split and every run as JSON")
    ] = False,
    hwprofiles: HwProfiles = None,
    force: Force = False,
    layer_mode: LayerModeOption = None,
    sustained: SustainedOption = False,
) -> None:
    """Time the real layer forward+backward (t 1-8, SP on/off, each recompute) and compare."""
    from simcluster.calibration.check import compare, gpu_bound_kind_summary, kind_summary, summarize
    from simcluster.calibration.records import LayerRun
    from simcluster.calibration.report import format_summary, format_table, to_json, write_reports
    from simcluster.config.errors import ConfigError
    from simcluster.config.hardware import load_hardware
    from simcluster.config.profiles import find_profile

    use_hwprofiles(hwprofiles)
    try:
        profile_file = find_profile(profile)
        stem = profile_file.stem
        hw = load_hardware(profile)
    except ConfigError as error:
        fail(error)
    inputs = [profile_file, *([measurements] if measurements is not None else [])]
    saved = LayerRun.from_json(measurements.read_text()) if measurements is not None else None
    # before measuring for minutes: the folder, the two reports write_reports names, the JSON
    output_folder(out_dir, "--out-dir")
    report = f"{stem}-{saved.device.device_type if saved else device.value}"
    for target in (out_dir / f"{report}.csv", out_dir / f"{report}.md"):
        output_file(target, "--out-dir", force, inputs)
    if save_measurements is not None:
        output_file(save_measurements, "--save-measurements", force, inputs)
    if saved is not None:
        run = saved
    else:
        from simcluster.profiler.bench.layer_timing import run_check
        from simcluster.profiler.bench.progress import StderrProgress

        require_device(device)
        command = command_line(
            f"check-profile {profile}",
            {
                "device": device,
                "quick": quick,
                "threads": threads,
                "layer_mode": layer_mode,
                "sustained": sustained,
            },
        )
        with StderrProgress("check-profile") as progress:
            run = run_check(
                device.value, quick, command, progress, threads, layer_mode, _load(device, sustained)
            )
    if save_measurements is not None:
        write_text_atomically(save_measurements, run.to_json())
    checks = compare(run, hw)
    csv_path, md_path = write_reports(checks, run, stem, hw.provenance.summary, out_dir)
    if json_output:
        typer.echo(
            json.dumps({**to_json(checks, run, stem), "files": [str(csv_path), str(md_path)]}, indent=1)
        )
        return
    typer.echo(format_table(checks))
    typer.echo(format_summary(summarize(checks), kind_summary(checks), gpu_bound_kind_summary(checks)))
    typer.echo(f"wrote {csv_path} and {md_path}")
