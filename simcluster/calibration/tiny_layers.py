"""Tiny-layer runs measured apart from the microbench, taken as its host records.

    simcluster calibrate --measurements microbench.json --tiny-layers FILE --out p.yaml

The host terms of a calibrated profile (`host_fit`: seconds per priced op, per
torch.utils.checkpoint region and per replayed op) are fitted from the microbench's tiny
layers (`records.TinyLayerRecord`, kept run by run). A microbench written before the runs
were kept holds only their median (no checkpoint terms), and a fused microbench holds the
fused layer's: FILE gives the runs of the measurement's own layer mode instead, from

- a follow-up JSON whose field `tiny_layers_<mode>` lists them
  (docs/calibration/h100-2026-11-27-script/followup.py writes `tiny_layers_eager`), or
- a microbench JSON whose `layer_mode` is the measurement's (its field `tiny_layers`).

The runs replace the microbench's (and its median per op, `Measurements.layer_overhead_s`).
They must come from the same kind of GPU (`device.name`); where FILE's device record (date,
driver, torch, host threads, platform) is not the microbench's, the kernels and the host
were measured on two machines, and the profile says so (`calibration.tiny_layers.machines`
and the source of `compute.host_issue_us_per_op`): a host's issue time is its CPU's and
its software's, not the GPU's.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from typing import Any

from simcluster.calibration.records import DeviceInfo, Measurements, TinyLayerRecord

DEVICE_KEYS = ("date", "driver_version", "torch_version", "num_threads", "platform")
"""The device record's fields that tell one measuring run's machine and software from another's."""


def tiny_layer_field(doc: dict[str, Any], mode: str, source: str) -> str:
    """The field of `doc` holding `mode`'s tiny-layer runs (module docstring). Raises
    ValueError naming `source` and the fields allowed where there is none."""
    if f"tiny_layers_{mode}" in doc:
        return f"tiny_layers_{mode}"
    if "tiny_layers" in doc and doc.get("layer_mode", "eager") == mode:
        return "tiny_layers"
    raise ValueError(
        f"{source}: field 'tiny_layers_{mode}': missing (allowed: a follow-up JSON with "
        f"'tiny_layers_{mode}', or a microbench JSON of layer_mode {mode} with 'tiny_layers')"
    )


def tiny_layer_runs(doc: dict[str, Any], mode: str, source: str) -> tuple[str, list[TinyLayerRecord]]:
    """(the field read, its runs). Raises ValueError naming `source`, the field and the run for
    a run that is not a `TinyLayerRecord`, has no priced op or no time, and where no run
    is without a checkpoint (the per-op cost is fitted from those, `host_fit`)."""
    field = tiny_layer_field(doc, mode, source)
    rows = doc[field]
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{source}: field {field!r}: not a non-empty list of tiny-layer runs")
    runs = []
    for i, row in enumerate(rows):
        try:
            run = TinyLayerRecord(**row)
        except TypeError as error:
            raise ValueError(f"{source}: {field}[{i}]: {error}") from error
        if run.priced_ops <= 0 or run.total_s <= 0:
            raise ValueError(f"{source}: {field}[{i}]: priced_ops and total_s must be > 0 ({row})")
        runs.append(run)
    if not any(r.checkpoints == 0 for r in runs):
        raise ValueError(
            f"{source}: field {field!r}: no run without a checkpoint to fit the per-op cost from"
        )
    return field, runs


def machines(kernels: DeviceInfo, host: dict[str, Any]) -> str:
    """One line: whether the kernels and the tiny layers share a device record (module docstring)."""
    differ = [key for key in DEVICE_KEYS if host.get(key) != getattr(kernels, key)]
    if not differ:
        return f"one device record: {kernels.name}, {kernels.date}"
    return (
        f"mixed: kernels measured on one {kernels.name} on {kernels.date}, the host terms on another "
        f"run of the same kind on {host.get('date')} (differing: {', '.join(differ)})"
    )


def with_tiny_layers(meas: Measurements, text: str, source: str) -> tuple[Measurements, dict[str, Any]]:
    """`meas` with the tiny-layer runs of the file `source` (its `text`) in place of its own,
    and the provenance the profile keeps (`calibration.tiny_layers`). Raises ValueError when the
    file is not JSON, has no runs of `meas`'s layer mode, or is from another kind of GPU."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{source}: not JSON ({error})") from error
    if not isinstance(doc, dict):
        raise ValueError(f"{source}: not a JSON object")
    device: dict[str, Any] = doc["device"] if isinstance(doc.get("device"), dict) else {}
    if device.get("name") != meas.device.name:
        raise ValueError(
            f"{source}: field 'device.name': {device.get('name')!r} is not the microbench's device "
            f"({meas.device.name!r}); tiny layers must come from the same kind of GPU"
        )
    field, runs = tiny_layer_runs(doc, meas.layer_mode, source)
    provenance = {
        "file": source,
        "field": field,
        "runs": len(runs),
        "layer_mode": meas.layer_mode,
        "device": device.get("name"),
        **{key: device.get(key) for key in DEVICE_KEYS},
        "machines": machines(meas.device, device),
    }
    per_op = statistics.median(r.total_s / r.priced_ops for r in runs)
    return dataclasses.replace(meas, tiny_layers=runs, layer_overhead_s=per_op), provenance


def declare(doc: dict[str, Any], provenance: dict[str, Any], host_graph: bool) -> dict[str, Any]:
    """The profile mapping `doc` (`profile.build_profile`) with the tiny layers' provenance
    under `calibration.tiny_layers`, and the source of `compute.host_issue_us_per_op` naming
    their file and machine (from them alone, or, with a `host_graph`, its checkpoint terms)."""
    where = (
        f"tiny-layer runs from {provenance['file']} ({provenance['field']}: {provenance['device']}, "
        f"{provenance['date']}, layer_mode {provenance['layer_mode']}); {provenance['machines']}"
    )
    calibration = {**doc["calibration"], "tiny_layers": provenance}
    sources = dict(doc["compute"]["sources"])
    if "host_issue_us_per_op" not in sources:  # a CPU profile: its launch cost is the per-op cost
        return {**doc, "calibration": calibration}
    if host_graph:
        sources["host_issue_us_per_op"] += f"; checkpoint terms (calibration.host_issue) from {where}"
    else:
        sources["host_issue_us_per_op"] = (
            "host seconds per priced op of this torch layer (simcluster.calibration.host_fit): tiny "
            "layers (h 64, s 8) forward + backward over their stand-in ops, the GPU waiting for the "
            f"host throughout: {where}; not Megatron's own per-kernel cost"
        )
    compute = {**doc["compute"], "sources": sources}
    return {**doc, "compute": compute, "calibration": calibration}
