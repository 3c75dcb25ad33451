"""Time the real layer forward and backward at held-out shapes: what check-profile predicts.

    python -m simcluster.profiler.bench.layer_timing --device cuda --out out/layer_timing.json
    python -m simcluster.profiler.bench.layer_timing --device cpu --quick --out /tmp/lt.json

Torch and the standard library only. For each held-out shape (`shapes.held_out_shapes`),
t in {1, 2, 4, 8}, sequence parallelism off / on and recompute none / selective / full, one
process plays rank 0 of t (`ShardStandInComm`: shard shapes, collectives as local copies)
and runs `out = layer(x); out.backward(grad)` on a stack of independent layers (own weights,
inputs and upstream gradients) that it rotates over, so no repeat finds the previous one's
weights in cache, as in a model of many layers. Each repeat records three points (CUDA
events, or perf_counter on a CPU): before the forward, between forward and backward, after
the backward; the medians of forward and of forward + backward over the repeats are kept.
Layers short enough for the host to matter (`ISSUE_MAX_S`) are also run a few times from an
idle device, recording the host's issue time of the forward and of forward + backward and
the GPU time of such a repeat (`host_forward_s`, `host_total_s`, `idle_start_total_s`):
what tells a host-bound layer from one whose host work does not overlap the device's.
Parameter gradients are set to None before each repeat, so backward assigns them (no
accumulation kernel), as on the first microbatch of an iteration.

`--layer-mode fused` runs the layer's memory-bound regions torch.compile'd (`layer.regions`),
as Megatron-core / TE run fused kernels; the default is fused on CUDA, eager on a CPU (where
Inductor's C++ compile takes minutes). Each layer is run (and compiled) in warm-up before it
is timed. `--sustained` first runs a GEMM loop until the GPU's clock settles and keeps it
warm between layers (`sustained`); the SM clock and power after each layer are recorded
where NVML answers.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from simcluster.calibration.records import LayerRun, LayerTiming, write_text_atomically
from simcluster.calibration.shapes import (
    DROPOUT_PROB,
    TP_DEGREES,
    grid_name,
    held_out_shapes,
)
from simcluster.config.choices import LayerMode, Recompute
from simcluster.profiler.bench.command_line import entry_point_parser, parse_entry_point_args
from simcluster.profiler.bench.device_info import describe_device
from simcluster.profiler.bench.progress import Progress, StderrProgress
from simcluster.profiler.bench.sustained import GpuSensors, SustainedLoad, add_run_options
from simcluster.profiler.bench.timing import Timer, TimingPolicy, cpu_threads, device_generator
from simcluster.profiler.layer.parallel import ShardStandInComm
from simcluster.profiler.layer.spec import LayerSpec
from simcluster.profiler.layer.transformer import local_layer

ISSUE_REPEATS = 3
ISSUE_MAX_S = 0.03
"""Layers whose fwd + bwd takes at most `ISSUE_MAX_S` also get `ISSUE_REPEATS` repeats each
started on an idle device (`Timer.issue_times_s`): the host's issue time of the forward and
of the whole, and the whole's time from an idle start. The host can limit only such layers
(the host-bound eager paper layers of docs/calibration/h100-2026-11-26/layer_timing.json take
4-8 ms on an H100 host); a larger one would spend more than a few % of its timing budget on
them."""


def default_layer_mode(device_type: str) -> LayerMode:
    """Fused on GPUs (what Megatron-core runs), eager elsewhere (Inductor's CPU compile is
    slow, and a CPU run is a dry run of the plumbing)."""
    return LayerMode.FUSED if device_type == "cuda" else LayerMode.EAGER


def layer_policy(device_type: str, quick: bool, budget_s: float | None = None) -> TimingPolicy:
    """Repeats of a whole layer: fewer than for a kernel, each one longer."""
    if device_type == "cuda":
        return TimingPolicy(warmup=3, min_repeats=10, max_repeats=50, budget_s=budget_s or 1.0)
    if quick:
        return TimingPolicy(warmup=1, min_repeats=5, max_repeats=9, budget_s=0.15, max_buffers=2)
    return TimingPolicy(warmup=2, min_repeats=5, max_repeats=20, budget_s=1.0, max_buffers=3)


def held_out_specs(device_type: str, quick: bool) -> list[LayerSpec]:
    """Every (shape, t, SP, recompute) that check-profile runs, in table order."""
    specs = []
    for shape in held_out_shapes(device_type, quick):
        for tp in TP_DEGREES:
            for sp in (False, True):
                for recompute in Recompute:
                    config = shape.config(tp, sp, recompute)
                    specs.append(LayerSpec.from_layer_config(config, dropout_prob=DROPOUT_PROB))
    return specs


def time_layer(
    spec: LayerSpec,
    timer: Timer,
    seed: int = 0,
    mode: LayerMode = LayerMode.EAGER,
    sensors: GpuSensors | None = None,
    issue_max_s: float = ISSUE_MAX_S,
) -> LayerTiming:
    """Median forward and forward + backward seconds of `spec` on rank 0 (stand-in comm),
    its memory-bound regions run as `mode`; the SM clock and power after it from `sensors`;
    the host's issue times where a repeat takes at most `issue_max_s`."""
    dev = timer.device
    comm = ShardStandInComm(spec.tp)
    gen = device_generator(dev, seed)
    weight_bytes = 2 * 12 * spec.hidden_size**2 / spec.tp
    act_bytes = 4 * spec.local_seq_length * spec.micro_batch_size * spec.hidden_size
    calls = [
        _layer_call(spec, comm, gen, seed + i, dev, mode)
        for i in range(timer.num_buffers(weight_bytes + act_bytes))
    ]
    for i in range(max(timer.policy.warmup, len(calls))):
        calls[i % len(calls)](lambda: None)
    estimate = statistics.median(total for _, total in timer.split_times_s(calls, 2))
    wanted = int(timer.policy.budget_s / max(estimate, 1e-9))
    repeats = max(timer.policy.min_repeats, min(timer.policy.max_repeats, wanted))
    times = timer.split_times_s(calls, repeats)
    totals = sorted(total for _, total in times)
    total = statistics.median(totals)
    spread = (totals[(3 * repeats) // 4] - totals[repeats // 4]) / total
    clock_mhz, power_w = sensors.read() if sensors is not None else (None, None)
    # after the sensors read the load the timed repeats left: these repeats idle the GPU
    issue = timer.issue_times_s(calls, ISSUE_REPEATS) if estimate <= issue_max_s else None
    return LayerTiming(
        spec.hidden_size,
        spec.num_attention_heads,
        spec.seq_length,
        spec.micro_batch_size,
        spec.tp,
        spec.sequence_parallel,
        spec.recompute.value,
        forward_s=statistics.median(fwd for fwd, _ in times),
        total_s=total,
        spread=spread,
        repeats=repeats,
        sm_clock_mhz=clock_mhz,
        power_w=power_w,
        host_forward_s=None if issue is None else statistics.median(f for f, _, _ in issue),
        host_total_s=None if issue is None else statistics.median(h for _, h, _ in issue),
        idle_start_total_s=None if issue is None else statistics.median(w for _, _, w in issue),
    )


def _layer_call(
    spec: LayerSpec,
    comm: ShardStandInComm,
    gen: torch.Generator,
    seed: int,
    dev: torch.device,
    mode: LayerMode = LayerMode.EAGER,
) -> Callable[[Callable[[], None]], object]:
    layer = local_layer(spec, comm, seed, str(dev), mode=mode)
    shape = (spec.local_seq_length, spec.micro_batch_size, spec.hidden_size)
    x = torch.randn(shape, generator=gen, device=dev, dtype=spec.torch_dtype).requires_grad_()
    grad = torch.randn(shape, generator=gen, device=dev, dtype=spec.torch_dtype)

    def call(mark: Callable[[], None]) -> object:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        out = layer(x)
        mark()
        out.backward(grad)
        return out

    return call


def run_check(
    device: str,
    quick: bool = False,
    command: str = "",
    progress: Progress | None = None,
    num_threads: int | None = 1,
    mode: LayerMode | None = None,
    load: SustainedLoad | None = None,
    budget_s: float | None = None,
    limit: int | None = None,
    max_s: float | None = None,
) -> LayerRun:
    """Time every held-out layer configuration on `device`, the layer in `mode` (default:
    `default_layer_mode`), at sustained load where `load` is given (settled first); with
    `max_s`, no layer starts after `max_s` seconds (the run keeps the layers timed so far)."""
    dev = torch.device(device)
    mode = LayerMode(mode or default_layer_mode(dev.type))
    specs = held_out_specs(dev.type, quick)[:limit]  # limit: a smoke test of the plumbing
    timer = Timer(dev, layer_policy(dev.type, quick, budget_s))
    # a quick CPU run tests the plumbing: every layer records its issue times, however slow
    # a shared CPU runs it
    issue_max_s = math.inf if quick and dev.type != "cuda" else ISSUE_MAX_S
    sensors = GpuSensors(dev)
    if progress is not None:
        progress.start(len(specs))
    timings = []
    with cpu_threads(dev, num_threads):
        warmup = load.settle() if load is not None else None
        begin = time.perf_counter()
        for i, spec in enumerate(specs):
            if max_s is not None and time.perf_counter() - begin > max_s:
                print(
                    f"layer_timing: --max-s {max_s} reached after {i} of {len(specs)} layers", file=sys.stderr
                )
                break
            if load is not None:
                load.maintain()
            timings.append(
                time_layer(spec, timer, seed=i, mode=mode, sensors=sensors, issue_max_s=issue_max_s)
            )
            if progress is not None:
                progress.step(
                    f"h={spec.hidden_size} t={spec.tp} sp={int(spec.sequence_parallel)} "
                    f"{spec.recompute.value}"
                )
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        info = describe_device(dev)
    return LayerRun(
        info,
        command,
        grid_name(dev.type, quick),
        "bf16",
        DROPOUT_PROB,
        timings,
        layer_mode=mode.value,
        load="sustained" if load is not None else "burst",
        warmup=warmup,
    )


def main(argv: Sequence[str] | None = None) -> LayerRun:
    parser = entry_point_parser(__doc__.splitlines()[0], Path("out/layer_timing.json"))
    add_run_options(parser)
    parser.add_argument(
        "--budget-s", type=float, default=None, help="seconds of timed repeats per layer (CUDA default 1.0)"
    )
    parser.add_argument("--limit", type=int, default=None, help="time only the first N layers")
    parser.add_argument("--max-s", type=float, default=None, help="start no layer after this many seconds")
    args = parse_entry_point_args(parser, argv)
    command = "python -m simcluster.profiler.bench.layer_timing " + " ".join(argv or sys.argv[1:])
    dev = torch.device(args.device)
    load = SustainedLoad.from_args(dev, args)
    with StderrProgress("check-profile") as progress:
        run = run_check(
            args.device,
            args.quick,
            command,
            progress,
            args.threads,
            args.layer_mode,
            load,
            args.budget_s,
            args.limit,
            args.max_s,
        )
    write_text_atomically(args.out, run.to_json())
    print(
        f"wrote {args.out}: {len(run.timings)} layer runs ({run.layer_mode}, {run.load}) on {run.device.name}"
    )
    return run


if __name__ == "__main__":
    main()
