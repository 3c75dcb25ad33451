"""`simcluster calibrate`: measure this device's kernels and write a hardware profile."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from simcluster.calibration import DeviceKind
from simcluster.cli._app import Force, app, fail, output_file, output_folder
from simcluster.cli._hwprofiles import HwProfiles, use_hwprofiles
from simcluster.config.choices import LayerMode
from simcluster.output_files import OutputPathError, check_output_file, write_text_atomically

# The measuring options calibrate and check-profile share.
LayerModeOption = Annotated[
    LayerMode | None,
    typer.Option(
        help="eager, or fused (memory-bound regions torch.compile'd); default fused on cuda, eager on cpu"
    ),
]
SustainedOption = Annotated[
    bool, typer.Option("--sustained", help="warm the GPU until its clock settles, keep it warm")
]


def require_device(device: DeviceKind) -> None:
    """Exit 2 with a message when CUDA is asked for and torch sees no GPU."""
    from simcluster.profiler.bench.device_info import cuda_device_count

    if device is DeviceKind.CUDA and cuda_device_count() == 0:
        fail("--device cuda: torch sees no CUDA device (try --device cpu)")


def command_line(name: str, args: dict[str, object]) -> str:
    """The command as a person would type it, for provenance."""
    parts = [f"simcluster {name}"]
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif value not in (None, False):
            parts.append(f"{flag} {value.value if isinstance(value, DeviceKind | LayerMode) else value}")
    return " ".join(parts)


@app.command()
def calibrate(
    device: Annotated[DeviceKind, typer.Option(help="where to measure")] = DeviceKind.CUDA,
    out: Annotated[
        Path | None,
        typer.Option(
            help="profile file or folder (default: hwprofiles/<device>-measured.yaml; CPU: out/calibration/)"
        ),
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="a tiny grid of shapes (a smoke test)")] = False,
    base: Annotated[
        str | None,
        typer.Option(
            help="profile whose network section is kept (default: h100-sxm5-80gb for H100/H200, "
            "else a100-sxm4-80gb-public)"
        ),
    ] = None,
    network: Annotated[
        bool, typer.Option("--network", help="measure NCCL all-reduce on all local GPUs (needs ≥ 2)")
    ] = False,
    measurements: Annotated[
        Path | None,
        typer.Option(help="fit a saved `python -m simcluster.profiler.bench.microbench` JSON instead"),
    ] = None,
    save_measurements: Annotated[
        Path | None, typer.Option(help="also write the raw measurements JSON")
    ] = None,
    threads: Annotated[int, typer.Option(help="CPU intra-op threads while measuring")] = 1,
    attention_head_dim: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="the layer's head dim: also time fused attention at it (recorded under "
            "calibration:; the flash tables are at head dim 128)",
        ),
    ] = None,
    hwprofiles: HwProfiles = None,
    force: Force = False,
    layer_mode: LayerModeOption = None,
    sustained: SustainedOption = False,
    host_graph: Annotated[
        Path | None,
        typer.Option(
            help="fit compute.host_issue_us_per_op from a saved `python -m "
            "simcluster.profiler.bench.host_graph` JSON (default: the microbench's tiny layers)"
        ),
    ] = None,
    extra_kernels: Annotated[
        Path | None,
        typer.Option(
            help="memory-bound kernels timed on the same GPU by measure2.py (its JSON: RMSNorm, "
            "RoPE, SwiGLU rows), added to the microbench's records with their provenance"
        ),
    ] = None,
    tiny_layers: Annotated[
        Path | None,
        typer.Option(
            help="the host terms' tiny-layer runs of the same kind of GPU, in place of the "
            "microbench's (a JSON with tiny_layers_<mode>, e.g. followup.json, or a microbench "
            "JSON of the same layer mode); a second machine is declared in the profile"
        ),
    ] = None,
) -> None:
    """Time the layer's kernels (GEMMs, memory-bound ops, fused attention, copy, launch) and
    fit a profile."""
    from simcluster.calibration.profile import build_profile, default_output, write_profile
    from simcluster.calibration.records import Measurements
    from simcluster.config.errors import ConfigError

    use_hwprofiles(hwprofiles)
    inputs = _inputs(measurements, base) + [
        p for p in (host_graph, extra_kernels, tiny_layers) if p is not None
    ]
    if tiny_layers is not None and save_measurements is not None:
        fail("--tiny-layers with --save-measurements: the saved file would hold another run's tiny layers")
    host_doc = _host_graph(host_graph)
    tiny_text = None if tiny_layers is None else _read(tiny_layers, "--tiny-layers")  # before measuring
    num_gpus = _gpu_count() if network else 0
    if network and (device is not DeviceKind.CUDA or num_gpus < 2):
        fail(f"--network needs ≥ 2 GPUs (found {num_gpus} CUDA device(s) for --device {device.value})")
    if measurements is not None:
        meas = Measurements.from_json(measurements.read_text())
        _check_outputs(meas.device.device_type, out, save_measurements, force, inputs)
    else:
        _check_outputs(device.value, out, save_measurements, force, inputs)  # before measuring for minutes
        from simcluster.profiler.bench.microbench import run_calibration
        from simcluster.profiler.bench.progress import StderrProgress

        require_device(device)
        command = command_line(
            "calibrate",
            {
                "device": device,
                "out": out,
                "quick": quick,
                "base": base,
                "network": network,
                "threads": threads,
                "attention_head_dim": attention_head_dim,
                "layer_mode": layer_mode,
                "sustained": sustained,
            },
        )
        with StderrProgress("calibrate") as progress:
            meas = run_calibration(
                device.value,
                quick,
                command,
                progress,
                threads,
                attention_head_dim=attention_head_dim,
                mode=layer_mode,
                load=_load(device, sustained),
            )
    extra: dict[str, Any] | None = None
    if extra_kernels is not None:
        from simcluster.calibration.extra_kernels import with_extra_kernels

        try:
            text = _read(extra_kernels, "--extra-kernels")
            meas, extra = with_extra_kernels(meas, text, str(extra_kernels))
        except ValueError as error:
            fail(f"--extra-kernels {error}")
    tiny: dict[str, Any] | None = None
    if tiny_text is not None:
        from simcluster.calibration.tiny_layers import with_tiny_layers

        try:
            meas, tiny = with_tiny_layers(meas, tiny_text, str(tiny_layers))
        except ValueError as error:
            fail(f"--tiny-layers {error}")
    if save_measurements is not None:
        write_text_atomically(save_measurements, meas.to_json())
    allreduce = _measure_network(num_gpus, quick) if network else None
    path = out or default_output(meas)
    if path.is_dir():
        path = path / default_output(meas).name
    if path != out:  # named only now that the device is known
        kept = save_measurements if measurements is None else measurements
        _check_named_output(path, force, inputs, meas, kept)
    try:
        doc = build_profile(meas, base, allreduce, host_doc)
        if extra is not None:
            doc["calibration"]["extra_kernels"] = extra
        if tiny is not None:
            from simcluster.calibration.tiny_layers import declare

            doc = declare(doc, tiny, host_doc is not None)
        profile = write_profile(doc, path)
    except (ConfigError, ValueError) as error:
        fail(error)
    c = profile.compute
    typer.echo(
        f"wrote {path} ({profile.name})\n"
        f"  device: {meas.device.name}; torch {meas.device.torch_version}, CUDA {meas.device.cuda_version}\n"
        f"  peak bf16 {profile.gpu.peak_bf16_tflop_per_s} TFLOP/s, best GEMM "
        f"{c.gemm_max_efficiency * profile.gpu.peak_bf16_tflop_per_s:.4g} TFLOP/s "
        f"(gemm_max_efficiency {c.gemm_max_efficiency})\n"
        f"  copy {profile.gpu.memory_bandwidth_gb_per_s * c.memory_bound_efficiency:.4g} GB/s, "
        f"kernel_launch_us {c.kernel_launch_us}\n"
        f"  {len(c.gemm_points)} GEMM points, {len(c.elementwise_points)} element-wise points, "
        f"{len(c.flash_attention_fwd_tflop_per_s or [])} flash-attention lengths; network "
        f"{'measured' if allreduce else 'from ' + str(profile.calibration['network_from'])}\n"
        + (
            f"  host terms: {tiny['runs']} tiny-layer runs from {tiny['file']}; {tiny['machines']}\n"
            if tiny
            else ""
        )
        + f"next: simcluster check-profile {path} --device {meas.device.device_type}"
        + (" --quick" if meas.grid == "quick" else "")
    )


def _read(path: Path, option: str) -> str:
    """A file's text (exit 2 naming the option and the file where it is unreadable)."""
    try:
        return path.read_text()
    except OSError as error:
        fail(f"{option} {path}: {error}")


def _host_graph(path: Path | None) -> dict[str, Any] | None:
    """The --host-graph JSON, read (exit 2 naming the file where it is unreadable)."""
    import json

    if path is None:
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        fail(f"--host-graph {path}: {error}")
    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list):
        fail(f"--host-graph {path}: field 'cases': missing (allowed: a profiler.bench.host_graph JSON)")
    return doc


def _inputs(measurements: Path | None, base: str | None) -> list[Path]:
    """The files this run reads: the saved measurements and the --base profile."""
    from simcluster.config.errors import ConfigError
    from simcluster.config.profiles import find_profile

    found = [measurements] if measurements is not None else []
    if base is not None:
        try:
            found.append(find_profile(base, field="--base"))
        except ConfigError as error:
            fail(error)
    return found


def _check_outputs(
    device_type: str, out: Path | None, save_measurements: Path | None, force: bool, inputs: list[Path]
) -> None:
    """Every file this run will write can be written (exit 2 naming it if not): new, or
    replaced with --force; never an input, and never both outputs at once."""
    from simcluster.calibration.profile import default_output_folder

    if out is None:
        output_folder(default_output_folder(device_type), "--out (default)")
    elif out.is_dir():
        output_folder(out, "--out")
    else:
        output_file(out, "--out", force, inputs)
    if save_measurements is not None:
        named_out = [out] if out is not None and not out.is_dir() else []
        output_file(save_measurements, "--save-measurements", force, [*inputs, *named_out])


def _check_named_output(path: Path, force: bool, inputs: list[Path], meas: object, kept: Path | None) -> None:
    """The profile file a folder (or the default) names, known once the device is: the
    same rule as a named --out. Refused after measuring, the measurements are kept in a new
    file (or the --save-measurements / --measurements one) so that no minutes are lost."""
    from simcluster.calibration.records import Measurements

    try:
        check_output_file(path, "--out", force, inputs)
    except OutputPathError as error:
        if kept is None and isinstance(meas, Measurements):
            kept = _free_name(path.with_name(f"{path.stem}.measurements.json"))
            write_text_atomically(kept, meas.to_json())
        fail(f"{error}; fit the measurements again: simcluster calibrate --measurements {kept} --out FILE")


def _free_name(path: Path) -> Path:
    """`path`, or `path` with -1, -2, … before its suffixes: a name no file has yet."""
    candidate, number = path, 0
    while candidate.exists():
        number += 1
        candidate = path.with_name(path.name.replace(".measurements.json", f"-{number}.measurements.json"))
    return candidate


def _load(device: DeviceKind, sustained: bool) -> Any:
    """The sustained load --sustained asks for (profiler.bench.sustained), else None."""
    if not sustained:
        return None
    from simcluster.profiler.bench.sustained import sustained_load

    return sustained_load(device.value)


def _gpu_count() -> int:
    from simcluster.profiler.bench.device_info import cuda_device_count

    return cuda_device_count()


def _measure_network(num_gpus: int, quick: bool) -> list:
    from simcluster.profiler.bench.device_info import release_cached_memory
    from simcluster.profiler.bench.netbench import measure_allreduce

    release_cached_memory()  # the kernel benchmarks' cached blocks, before NCCL allocates
    return measure_allreduce(num_gpus, quick)
