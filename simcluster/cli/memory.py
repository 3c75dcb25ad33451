"""`simcluster memory SCENARIO [--measure]`: per-stage memory, and the real layer's bytes."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from simcluster.cli._app import app, fail, scenario_file
from simcluster.cli._hwprofiles import HwProfiles, load_profile, use_hwprofiles
from simcluster.config.choices import Recompute
from simcluster.config.errors import ConfigError

# A one-layer CPU measurement holds the layer's weights (16-bit) and the activations of a
# forward without recompute; refuse shapes needing more than this share of free memory.
CPU_MEMORY_SHARE = 0.5


def _available_memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return float("inf")


@app.command()
def memory(
    scenario: Annotated[Path, typer.Argument(help="a scenario YAML file or a shipped scenario's name")],
    measure: Annotated[bool, typer.Option(help="count the real torch layer's saved bytes")] = False,
    device: Annotated[str, typer.Option(help="device for --measure: cpu or cuda")] = "cpu",
    seq_length: Annotated[int | None, typer.Option(help="override s for --measure")] = None,
    micro_batch_size: Annotated[int | None, typer.Option(help="override b for --measure")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    hwprofiles: HwProfiles = None,
) -> None:
    """Per-stage memory breakdown (Table 2 row, interleaving factor, extras); --measure adds
    the bytes autograd really keeps for one layer on one rank."""
    from simcluster.config.scenario import load_scenario, require_hardware_fits
    from simcluster.memory_plan import memory_report
    from simcluster.report.tables import format_memory_report

    if device not in ("cpu", "cuda"):
        fail(f"--device: value {device!r}: allowed: cpu, cuda")
    use_hwprofiles(hwprofiles)
    path = scenario_file(scenario)
    try:
        spec = load_scenario(path)
        hw = load_profile(spec.hardware, relative_to=path)
        require_hardware_fits(spec, hw, path)
        # `is not None`: 0 is a value to refuse (as -5 is), not "no override"
        if seq_length is not None or micro_batch_size is not None:
            spec = _override(spec, seq_length, micro_batch_size)
    except ConfigError as error:
        fail(error)
    if measure and spec.training.dtype.value == "fp8":
        # the real layer is plain torch (no Transformer Engine), so it has no FP8 linears
        fail(
            f"{scenario}: training.dtype: value fp8: --measure runs the torch layer, which has no "
            "Transformer Engine FP8 linears; measure the bf16 layer (dtype: bf16) or drop --measure"
        )
    report = memory_report(spec, hw)
    if measure and spec.model.moe is not None:
        fail("--measure: the torch layer it runs has no MoE block in it yet (docs/moe.md, Status); "
             "drop --measure for the op graph's prediction")  # fmt: skip
    measured = _measure(spec, device) if measure else None
    if json_output:
        payload = report.to_json_dict()
        payload["measured_bytes_per_layer"] = measured["activation_bytes"] if measured else None
        payload["measured"] = measured
        typer.echo(json.dumps(payload, indent=2, allow_nan=False))
        return
    typer.echo(format_memory_report(report))
    if measured:
        cp = spec.parallel.cp
        ring = f", rank 0 of the cp = {cp} K/V ring on s/cp = {spec.model.seq_length // cp} tokens"
        typer.echo(
            f"\nmeasured on {device} (real layer, rank 0 of t = {spec.parallel.tp}"
            + (ring if cp > 1 else "")
            + "): "
            f"{measured['activation_bytes']:,} bytes per layer kept for backward "
            f"(+ {measured['negligible_bytes']:,} of layer-norm statistics the paper neglects); "
            f"predicted {report.predicted_bytes_per_layer:,.0f}"
        )
        if measured["view_held_bytes"] and cp > 1 and spec.training.recompute is Recompute.NONE:
            typer.echo(
                f"of these, {measured['view_held_bytes']:,} bytes are the QKV output kept alive "
                "by Q's view (no RoPE) beside the K/V buffer the ring saves (TE's "
                "AttnFuncWithCPAndKVP2P), counted in predicted"
            )
        elif measured["view_held_bytes"]:
            # Counted, and named: the one term that comes from a view, not a saved tensor.
            typer.echo(
                f"of these, {measured['view_held_bytes']:,} bytes are the QKV output kept alive "
                "by V's view in the selective-recompute checkpoint while Q or K is a new tensor "
                "(Megatron-core's split; docs/memory.md), counted in predicted"
            )


def _override(spec, seq_length: int | None, micro_batch_size: int | None):
    from simcluster.config.scenario import parse_scenario

    data = spec.model_dump(mode="json")
    if seq_length is not None:
        data["model"]["seq_length"] = seq_length
    if micro_batch_size is not None:
        data["training"]["micro_batch_size"] = micro_batch_size
        data["training"]["global_batch_size"] = micro_batch_size * spec.parallel.dp * spec.num_microbatches
    return parse_scenario(data, "command-line overrides", default_name=spec.name)


def _measure(spec, device: str) -> dict[str, int]:
    from simcluster.workload.context_parallel import ring_held_bytes
    from simcluster.workload.layer import qkv_output_held_bytes
    from simcluster.workload.model import layer_config

    try:
        from simcluster.profiler.layer.accounting import measure_saved_bytes, negligible_buffers
        from simcluster.profiler.layer.spec import LayerSpec
    except ImportError:
        fail("--measure needs torch: pip install 'simcluster[torch]' (torch==2.13.0 for the CPU wheel)")
    if device == "cuda":
        from simcluster.calibration import DeviceKind
        from simcluster.cli.calibrate import require_device

        require_device(DeviceKind.CUDA)  # a clean exit 2 on CPU-only torch, as calibrate's
    cfg = layer_config(spec)
    # cfg is one rank's layer on s/cp tokens; cp > 1 runs it as rank 0 of the K/V ring.
    layer = LayerSpec.from_layer_config(cfg, dtype=spec.training.dtype, cp=spec.parallel.cp)
    if device == "cpu":
        _check_cpu_fits(spec, cfg)
    measured = measure_saved_bytes(layer, device=device)
    negligible = sum(negligible_buffers(layer, device).values())
    return {
        "total_bytes": measured.total_bytes,
        "activation_bytes": measured.total_bytes - negligible,
        "negligible_bytes": negligible,
        # part of the prediction (the op graph counts it): the QKV output the selective
        # checkpoint keeps through V's view, or (cp > 1, MHA, no RoPE) the ring keeps through Q's
        "view_held_bytes": int(
            qkv_output_held_bytes(cfg) + (ring_held_bytes(cfg) if spec.parallel.cp > 1 else 0)
        ),
        "dropout_mask_bytes": measured.dropout_mask_bytes,
        "num_storages": measured.num_storages,
    }


def _check_cpu_fits(spec, cfg) -> None:
    """Weights (fp32 master copy at most) plus a no-recompute forward's activations."""
    from simcluster.config.choices import Recompute
    from simcluster.workload.layer import layer_ops
    from simcluster.workload.model import layer_params_per_rank

    activations = layer_ops(replace(cfg, recompute=Recompute.NONE)).saved_bytes
    weights = layer_params_per_rank(spec.model.hidden_size, spec.model.ffn_size, spec.parallel.tp) * 4
    need = activations + weights
    available = _available_memory_bytes()
    if need > CPU_MEMORY_SHARE * available:
        fail(
            f"measuring one layer at the scenario's shapes needs about {need / 1e9:.1f} GB, more than "
            f"{CPU_MEMORY_SHARE:.0%} of the {available / 1e9:.1f} GB free here; try smaller shapes, "
            f"e.g. --seq-length {max(64, spec.model.seq_length // 8)} or --micro-batch-size 1"
        )
