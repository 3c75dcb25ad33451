"""Assemble a calibrated hardware profile and write it so that no partial file can exist.

The `gpu` and `compute` sections come from the measurements (`fit`); the `network`
section is the base profile's (datasheet and public measurements), unless an all-reduce
sweep was measured (`--network`), which replaces the NVLink bus-bandwidth table. The
provenance says which, with the device, driver, CUDA and torch versions, the date, the
command and the shapes measured.

Writing: the YAML is validated first (the same parser as `load_hardware`), then written
to a hidden temporary file beside the target, flushed to disk and renamed over the
target (atomic on POSIX), then loaded back with `load_hardware`. An interrupted run
leaves either no file or the previous one, never half a profile.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from simcluster import units
from simcluster.calibration.attention_fit import flash_section, other_head_dims
from simcluster.calibration.datasheets import base_profile_for
from simcluster.calibration.fit import compute_section, gpu_section, measured_grid
from simcluster.calibration.grouped_fit import grouped_measured_grid, with_grouped_points
from simcluster.calibration.host_fit import host_section
from simcluster.calibration.records import AllReducePoint, Measurements
from simcluster.config.hardware import HardwareProfile, load_hardware, parse_hardware


def profile_name(meas: Measurements) -> str:
    """e.g. 'nvidia-h100-80gb-hbm3-measured', 'cpu-intel-r-xeon-r-processor-measured'."""
    slug = re.sub(r"[^a-z0-9]+", "-", meas.device.name.lower()).strip("-")
    prefix = "" if meas.device.device_type == "cuda" else "cpu-"
    return f"{prefix}{slug}-measured"


def default_output_folder(device_type: str) -> Path:
    """GPU profiles go to the user's profile folder (`config.profiles.user_profiles_dir`: the
    checkout's hwprofiles/ in a source checkout); CPU ones to out/calibration/ (not a GPU
    system)."""
    from simcluster.config.profiles import user_profiles_dir

    return user_profiles_dir() if device_type == "cuda" else Path("out/calibration")


def default_output(meas: Measurements) -> Path:
    return default_output_folder(meas.device.device_type) / f"{profile_name(meas)}.yaml"


def build_profile(
    meas: Measurements,
    base: str | None = None,
    network: list[AllReducePoint] | None = None,
    host_graph: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The profile as a YAML-ready mapping; `host_graph` (a `profiler.bench.host_graph` JSON)
    fits the host's issue time per op in place of the microbench's tiny layers (GPU only)."""
    base = base or base_profile_for(meas.device.device_type, meas.device.name)
    base_profile = load_hardware(base)
    gpu = gpu_section(meas)
    compute = _with_flash_tables(
        meas, compute_section(meas, gpu, [list(t) for t in base_profile.compute.gemm_tiles])
    )
    compute = with_grouped_points(meas, compute)  # the experts' grouped GEMMs, where measured
    host_detail: dict[str, Any] = {}
    if meas.device.device_type == "cuda":  # a CPU's kernel_launch_us already is its per-op cost
        compute, host_detail = _with_host(meas, compute, host_graph)
    net = _network_section(base_profile, base, network)
    dev = meas.device
    return {
        "name": profile_name(meas),
        "description": f"{dev.name}, calibrated by simcluster calibrate ({meas.grid} grid)",
        "provenance": {
            "kind": "measured",
            "summary": (
                f"Compute model measured on one {dev.name} on {dev.date}: "
                f"{len(meas.gemms)} GEMMs and {len(meas.elementwise)} memory-bound kernels of the "
                f"layer's op graph at the shard shapes of t in (1, 2, 4, 8), plus a device copy, an "
                f"empty-kernel launch, a square GEMM"
                + (
                    f" and {len(meas.attention)} fused-attention (SDPA) shapes"
                    if "flash_attention_fwd_tflop_per_s" in compute
                    else ""
                )
                + ". Network: "
                + ("measured all-reduce sweep." if network else f"copied from {base} (datasheet).")
            ),
            "device": dev.name,
            "device_memory_gb": round(dev.memory_gb, 2),
            "driver": dev.driver_version,
            "cuda": dev.cuda_version,
            "torch": dev.torch_version,
            "platform": dev.platform,
            "host_cpu": dev.host_cpu or "not recorded",  # the host issue costs are this CPU's
            "intra_op_threads": dev.num_threads,
            "date": dev.date,
            "command": meas.command,
            "dtype": meas.dtype,
            "dropout_prob": meas.dropout_prob,
            "layer_mode": meas.layer_mode,
            "load": meas.load,
            "timing": meas.policy,
            "grid": meas.grid,
            "shapes": [
                {
                    k: s[k]
                    for k in (
                        "hidden_size",
                        "num_attention_heads",
                        "seq_length",
                        "micro_batch_size",
                        "tokens",
                        "tp",
                        "kernels",  # "attention bmm": that shape's batched GEMMs alone
                    )
                    if k in s
                }
                for s in meas.shapes
            ],
        },
        "gpu": gpu,
        "compute": compute,
        "network": net,
        "calibration": {
            "network_from": "measured" if network else base,
            "network_measured": bool(network),
            "launch_us": round(meas.launch_s / units.SECONDS_PER_US, 3),
            "layer_overhead_us": round(meas.layer_overhead_s / units.SECONDS_PER_US, 3),
            "held_out_check": "simcluster check-profile <this profile> --device "
            f"{dev.device_type}" + (" --quick" if meas.grid == "quick" else ""),
            "measured_grid": {
                **measured_grid(meas),
                **({"grouped_gemm": grouped} if (grouped := grouped_measured_grid(meas)) else {}),
            },
            **_other_head_dims(meas),
            **({"host_issue": host_detail} if host_detail else {}),
        },
    }


def _with_host(
    meas: Measurements, compute: dict[str, Any], host_graph: dict[str, Any] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`compute` with `host_issue_us_per_op` (`host_fit`) before its sources, and its detail."""
    per_op_us, source, detail = host_section(meas, host_graph)
    head = {key: value for key, value in compute.items() if key != "sources"}
    sources = {**compute["sources"], "host_issue_us_per_op": source}
    return {**head, "host_issue_us_per_op": per_op_us, "sources": sources}, detail


def _with_flash_tables(meas: Measurements, compute: dict[str, Any]) -> dict[str, Any]:
    """`compute` with the measured flash-attention tables (`attention_fit`) before its
    sources, and their sources; unchanged where no attention was measured."""
    tables, sources = flash_section(meas)
    if not tables:
        return compute
    head = {key: value for key, value in compute.items() if key != "sources"}
    return {**head, **tables, "sources": {**compute["sources"], **sources}}


def _other_head_dims(meas: Measurements) -> dict[str, Any]:
    """The flash tables at the layer's head dim (`--attention-head-dim`), for reading only:
    the model prices every head dim with the head-dim-128 tables."""
    tables = other_head_dims(meas)
    if not tables:
        return {}
    return {"flash_attention_other_head_dims": {f"head_dim_{d}": rows for d, rows in tables.items()}}


def _network_section(
    base: HardwareProfile, base_stem: str, network: list[AllReducePoint] | None
) -> dict[str, Any]:
    net = base.network.model_dump(mode="json", exclude_none=True)
    net["sources"] = net.pop("sources")  # last, as in the shipped profiles
    if not network:
        net["measured"] = "datasheet"
        return net
    # The measured sweep is all-reduce only: the base's ring all-gather table would not match it.
    net.pop("nvlink_allgather_busbw", None)
    net["sources"].pop("nvlink_allgather_busbw", None)
    if net.get("nvlink_domain_size", 0) % network[0].num_ranks:
        net.pop("nvlink_domain_size")
        net["sources"].pop("nvlink_domain_size", None)
    net["nvlink_allreduce_busbw"] = [
        [round(p.message_bytes / units.BYTES_PER_MB, 6), round(units.bytes_to_gb(p.busbw_bytes_per_s), 2)]
        for p in network
    ]
    net["gpus_per_node"] = network[0].num_ranks
    net["measured"] = "measured"
    net["sources"]["nvlink_allreduce_busbw"] = (
        f"measured: torch.distributed NCCL all-reduce on {network[0].num_ranks} GPUs, "
        "busbw = 2(n-1)/n · bytes / median time (simcluster.profiler.bench.netbench)"
    )
    net["sources"]["gpus_per_node"] = "GPUs in the measured node (torch.cuda.device_count())"
    for key in net["sources"]:
        if key not in ("nvlink_allreduce_busbw", "gpus_per_node"):
            net["sources"][key] = f"{net['sources'][key]} [from {base_stem}]"
    return net


class _Dumper(yaml.SafeDumper):
    """Block style for sections, flow style for rows: `[256, 128, 1.0]`, `{m: 1024, ...}`."""


def _is_row(items: list[Any]) -> bool:
    return all(isinstance(v, (int, float, str, bool)) for v in items)


_Dumper.add_representer(
    list, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=_is_row(v))
)
_Dumper.add_representer(
    dict,
    lambda d, v: d.represent_mapping(
        "tag:yaml.org,2002:map", v, flow_style="tflop_per_s" in v and _is_row(list(v.values()))
    ),
)


def to_yaml(data: dict[str, Any]) -> str:
    header = (
        "# Calibrated by `simcluster calibrate`: every number below was measured on the\n"
        "# device named in provenance, except where its source says otherwise.\n"
    )
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    return header + body


def write_profile(data: dict[str, Any], path: Path) -> HardwareProfile:
    """Validate, write atomically (temp file + rename), load back with `load_hardware`."""
    text = to_yaml(data)
    parse_hardware(yaml.safe_load(text), path)  # raises ConfigError before anything is written
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return load_hardware(str(path.resolve()))
