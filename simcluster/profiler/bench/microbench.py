"""Micro-benchmarks of the layer's kernels: what `simcluster calibrate` fits a profile to.

    python -m simcluster.profiler.bench.microbench --device cuda --out out/microbench.json
    python -m simcluster.profiler.bench.microbench --device cpu --quick --out /tmp/mb.json

Torch and the standard library only (it runs on a bare GPU machine); the fit and the YAML
live in `simcluster.calibration`, which reads the JSON this writes (or the `Measurements`
object directly, in one process).

For every calibration shape (`shapes.calibration_shapes`), t in {1, 2, 4, 8} and sequence
parallelism off and on, the op graph of `simcluster.workload.layer.layer_ops` (forward and
backward) lists the kernels; each distinct one is timed once (`kernels.benchmark_for`):
every linear GEMM in forward, input-grad and weight-grad at the rank's shard shapes, the
batched attention GEMMs, the memory-bound sites (layer norm, softmax, dropout, GeLU,
bias-dropout-add, residual add, layout copies) and the stand-in comm's copies. Then the
device constants: a large device-to-device copy (bytes read + written over time), an
empty-kernel launch (32 one-element in-place adds, time per add), a large square GEMM in
bf16 and fp32 (the best rate this device reaches, for the peak and max efficiency), and
the eager framework's cost per op (a real layer too small for its kernels to matter).
Attention kernels over MAX_SCORE_ELEMENTS score elements are skipped (memory). Last, the
fused attention op (`attention`: SDPA forward and forward + backward over the attention
grid, head dim 128 and `--attention-head-dim`), for the profile's flash tables.

Issue 20 adds, all recorded in the same JSON (new fields are optional for readers):
`--layer-mode fused` (the default on CUDA) runs the memory-bound sites and the tiny layer
with the layer's torch.compile'd regions (`layer.regions`), as Megatron-core / TE run fused
kernels; `--sustained` settles the GPU's clock under a GEMM loop first and keeps it warm
between kernels (`sustained`), and every kernel carries the SM clock and power NVML reported
after it (null where unavailable); `--modern` times the modern kinds (`modern_kernels`:
RMSNorm, RoPE, SwiGLU, GQA flash, FP8 and bf16 GEMMs, AdamW), and, in a fused run, RMSNorm,
RoPE and SwiGLU eager as well (records say their layer_mode), so one GPU run measures both.
`--limit N` times only the first N planned kernels (a smoke test of the plumbing).

Issue 18 adds `--grouped-gemm`: the routed experts' grouped GEMMs (`grouped_gemm`: fc1 / fc2
forward, dgrad and wgrad over the shipped MoE models' expert shapes, G local experts and M
tokens per expert, `calibration.grouped_shapes`), `torch._grouped_mm` where it runs, else a
loop of GEMMs (`--grouped-impl` forces one), at most `--grouped-max-s` seconds of them,
recorded in `grouped_gemms` (each with the implementation that ran).
"""

from __future__ import annotations

import itertools
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from simcluster.calibration.grouped_shapes import GroupedShape, grouped_grid
from simcluster.calibration.host_fit import checkpoint_regions
from simcluster.calibration.records import (
    ElementwiseRecord,
    GemmRecord,
    GroupedGemmRecord,
    Measurements,
    TinyLayerRecord,
    write_text_atomically,
)
from simcluster.calibration.shapes import (
    DROPOUT_PROB,
    TP_DEGREES,
    LayerShape,
    attention_bmm_shapes,
    attention_grid,
    calibration_shapes,
    grid_name,
    standin_ops,
)
from simcluster.config.choices import LayerMode, Recompute
from simcluster.profiler.bench.attention import attention_steps, time_attention
from simcluster.profiler.bench.command_line import entry_point_parser, parse_entry_point_args
from simcluster.profiler.bench.device_info import describe_device
from simcluster.profiler.bench.grouped_gemm import IMPLS, time_grouped
from simcluster.profiler.bench.kernels import Benchmark, BuildContext, benchmark_for
from simcluster.profiler.bench.layer_timing import default_layer_mode, time_layer
from simcluster.profiler.bench.modern_kernels import plan_modern, time_modern
from simcluster.profiler.bench.progress import Progress, StderrProgress
from simcluster.profiler.bench.sustained import GpuSensors, SustainedLoad, add_run_options
from simcluster.profiler.bench.timing import (
    Timer,
    TimingPolicy,
    cpu_threads,
    device_generator,
    median_and_spread,
    random_tensor,
)
from simcluster.profiler.layer.spec import LayerSpec
from simcluster.workload.layer import layer_ops

DTYPE = torch.bfloat16
MAX_SCORE_ELEMENTS = 2**30  # skip attention kernels over b·(a/t)·s² elements (memory)
LAUNCHES_PER_CALL = 32
OVERHEAD_SHAPE = LayerShape(64, 8, 8, 1)  # h, a, s, b: kernels of a few µs at most


def plan_benchmarks(shapes: Sequence[LayerShape], bmm_only: Sequence[LayerShape] = ()) -> list[Benchmark]:
    """Distinct kernels of the op graphs of `shapes` × t × SP, then the attention core's
    batched GEMMs alone of `bmm_only` (`shapes.attention_bmm_shapes`), in first-seen order."""
    seen: dict[tuple[str, tuple[int, ...]], Benchmark] = {}
    for shape in shapes:
        for tp in TP_DEGREES:
            for sp in (False, True):
                if shape.num_attention_heads % tp or (sp and shape.seq_length % tp):
                    continue
                cfg = shape.config(tp, sp)
                ops = layer_ops(cfg)
                too_big = cfg.score_elements > MAX_SCORE_ELEMENTS
                for op in ops.forward + ops.backward:
                    bench = benchmark_for(op, cfg)
                    if bench is None or bench.key in seen:
                        continue
                    if too_big and _touches_scores(bench):
                        continue
                    seen[bench.key] = bench
    for shape in bmm_only:
        for bench in plan_benchmarks([shape]):
            if bench.name.startswith("bmm") and bench.key not in seen:
                seen[bench.key] = bench
    return list(seen.values())


def _touches_scores(bench: Benchmark) -> bool:
    return bench.name.startswith(("bmm", "softmax", "attention_dropout"))


def run_calibration(
    device: str,
    quick: bool = False,
    command: str = "",
    progress: Progress | None = None,
    num_threads: int | None = 1,
    seed: int = 0,
    attention_head_dim: int | None = None,
    mode: LayerMode | None = None,
    load: SustainedLoad | None = None,
    modern: bool = False,
    limit: int | None = None,
    grouped: GroupedOptions | None = None,
) -> Measurements:
    """Time every planned kernel, the device constants and the fused attention grid on
    `device` (CPU: on `num_threads` intra-op threads, see `timing.cpu_threads`);
    `attention_head_dim`, the layer's head dim, is timed beside 128 where given. The sites
    run in `mode` (default `default_layer_mode`), at sustained `load` where given, the
    modern kinds too where `modern`, the grouped expert GEMMs where `grouped` is given;
    `limit` keeps the first planned kernels only."""
    dev = torch.device(device)
    run = _Run(LayerMode(mode or default_layer_mode(dev.type)), load, modern, limit, grouped)
    with cpu_threads(dev, num_threads):
        return _run_calibration(dev, quick, command, progress, seed, attention_head_dim, run)


@dataclass(frozen=True)
class GroupedOptions:
    """The grouped expert GEMMs to time (`grouped_gemm`): implementation ("auto", "grouped_mm",
    "loop") and a bound on their seconds (None: all)."""

    impl: str = "auto"
    max_s: float | None = None


GROUPED_BUDGET_S = 0.02  # timed seconds per grouped GEMM: 420 shapes, ~10 s of kernels on an H100


class _Run:
    """How this calibration runs: layer mode, load, what else to time; reads the sensors."""

    def __init__(
        self, mode: LayerMode, load: SustainedLoad | None, modern: bool, limit: int | None,
        grouped: GroupedOptions | None = None,
    ) -> None:  # fmt: skip
        self.mode, self.load, self.modern, self.limit, self.grouped = mode, load, modern, limit, grouped
        self.sensors: GpuSensors | None = None

    def before_kernel(self) -> None:
        if self.load is not None:
            self.load.maintain()

    def read(self) -> tuple[float | None, float | None]:
        return self.sensors.read() if self.sensors is not None else (None, None)


def _run_calibration(
    dev: torch.device,
    quick: bool,
    command: str,
    progress: Progress | None,
    seed: int,
    attention_head_dim: int | None,
    run: _Run,
) -> Measurements:
    timer = Timer(dev, TimingPolicy.for_device(dev.type, quick))
    shapes = calibration_shapes(dev.type, quick)
    bmm_only = attention_bmm_shapes(dev.type, quick)
    plan = plan_benchmarks(shapes, bmm_only)[: run.limit]
    attention = attention_grid(dev.type, quick, attention_head_dim)
    modern_plan = plan_modern(quick) if run.modern else []
    grouped_plan = grouped_grid(quick) if run.grouped is not None else []
    eager_modern = sum(b.kind == "memory_bound" for b in modern_plan) if run.mode is LayerMode.FUSED else 0
    if progress is not None:
        progress.start(
            len(plan) + 5 + attention_steps(attention) + len(modern_plan) + eager_modern + len(grouped_plan)
        )
    run.sensors = GpuSensors(dev)
    warmup = run.load.settle() if run.load is not None else None
    ctx = BuildContext(dev, DTYPE, device_generator(dev, seed), DROPOUT_PROB, run.mode)
    gemms, elementwise = [], []
    for bench in plan:
        run.before_kernel()
        seconds, spread = _time_benchmark(timer, bench, ctx)
        clock, power = run.read()
        if bench.gemm is not None:
            gemms.append(GemmRecord(bench.name, *bench.gemm, seconds, spread, clock, power))
        else:
            elementwise.append(
                ElementwiseRecord(
                    bench.name, bench.dims, bench.bytes_moved, seconds, spread, bench.op, clock, power
                )
            )
        _step(progress, f"{bench.name} {bench.dims}")
    launch_s = _launch_s(timer, ctx)
    _step(progress, "empty-kernel launch")
    copy_bytes, copy_s = _copy(timer, ctx, quick)
    _step(progress, "device copy")
    size = _peak_gemm_size(dev.type, quick)
    peak = _square_gemm(timer, ctx, size, DTYPE)
    _step(progress, f"square GEMM {size} bf16")
    peak_fp32 = _square_gemm(timer, ctx, size, torch.float32)
    _step(progress, f"square GEMM {size} fp32")
    overhead_s, tiny_layers = layer_overhead_s(dev, quick, run.mode, run.limit)
    _step(progress, "tiny-layer overhead")
    run.before_kernel()
    attention_records = time_attention(timer, ctx, attention, progress)
    modern, skipped = time_modern(
        timer, ctx, modern_plan, run.read, run.before_kernel, lambda label: _step(progress, label)
    )
    if run.mode is LayerMode.FUSED and modern_plan:  # the eager RMSNorm / RoPE / SwiGLU too
        eager = [b for b in modern_plan if b.kind == "memory_bound"]
        more, more_skipped = time_modern(
            timer, replace(ctx, mode=LayerMode.EAGER), eager, run.read, run.before_kernel,
            lambda label: _step(progress, f"{label} eager"),
        )  # fmt: skip
        modern, skipped = modern + more, skipped + more_skipped
    grouped, grouped_skipped = _time_grouped(timer, ctx, grouped_plan, run, progress)
    return Measurements(
        device=describe_device(dev),
        command=command,
        grid=grid_name(dev.type, quick),
        dtype="bf16",
        dropout_prob=DROPOUT_PROB,
        shapes=[
            *({**asdict(s), "tokens": s.tokens, "tp": list(TP_DEGREES)} for s in shapes),
            *(
                {**asdict(s), "tokens": s.tokens, "tp": list(TP_DEGREES), "kernels": "attention bmm"}
                for s in bmm_only
            ),
        ],
        policy=asdict(timer.policy),
        launch_s=launch_s,
        copy_bytes=copy_bytes,
        copy_s=copy_s,
        peak_gemm=peak,
        peak_gemm_fp32=peak_fp32,
        layer_overhead_s=overhead_s,
        tiny_layers=tiny_layers,
        gemms=gemms,
        elementwise=elementwise,
        attention=attention_records,
        layer_mode=run.mode.value,
        load="sustained" if run.load is not None else "burst",
        warmup=warmup,
        modern=modern,
        skipped=skipped + grouped_skipped,
        grouped_gemms=grouped,
    )


def _time_grouped(
    timer: Timer, ctx: BuildContext, plan: list[GroupedShape], run: _Run, progress: Progress | None
) -> tuple[list[GroupedGemmRecord], list[str]]:
    """The grouped expert GEMMs (none where not asked for), at most `GROUPED_BUDGET_S` of timed
    calls each."""
    if run.grouped is None:
        return [], []
    policy = replace(timer.policy, budget_s=min(timer.policy.budget_s, GROUPED_BUDGET_S))
    return time_grouped(
        Timer(timer.device, policy), ctx, plan, run.read, run.before_kernel,
        lambda label: _step(progress, label), run.grouped.impl, run.grouped.max_s,
    )  # fmt: skip


def _step(progress: Progress | None, label: str) -> None:
    if progress is not None:
        progress.step(label)


def _time_benchmark(timer: Timer, bench: Benchmark, ctx: BuildContext) -> tuple[float, float]:
    calls = [bench.build(ctx) for _ in range(timer.num_buffers(bench.bytes_moved))]
    times = timer.times_s(calls)
    del calls
    return median_and_spread(times)


def _launch_s(timer: Timer, ctx: BuildContext) -> float:
    """Seconds per launch of a one-element kernel, launched back to back as eager code does."""

    def build() -> Any:
        x = random_tensor((1,), torch.float32, ctx.device, ctx.generator)

        def call() -> None:
            for _ in range(LAUNCHES_PER_CALL):
                x.add_(1.0)

        return call

    median, _ = median_and_spread(timer.times_s([build()]))
    return median / LAUNCHES_PER_CALL


def _copy(timer: Timer, ctx: BuildContext, quick: bool) -> tuple[float, float]:
    """(bytes read + written, seconds) of one large device-to-device copy."""
    num_bytes = {"cuda": 2 * 1024**3}.get(ctx.device.type, 32 * 1024**2 if quick else 256 * 1024**2)
    src = random_tensor((num_bytes // 2,), torch.bfloat16, ctx.device, ctx.generator)
    dst = torch.empty_like(src)
    median, _ = median_and_spread(timer.times_s([lambda: dst.copy_(src)]))
    return 2.0 * num_bytes, median


def layer_overhead_s(
    dev: torch.device, quick: bool, mode: LayerMode = LayerMode.EAGER, limit: int | None = None
) -> tuple[float, list[TinyLayerRecord]]:
    """Seconds per op-graph op of real layers too small for their kernels to matter, and
    the runs it is the median of.

    `OVERHEAD_SHAPE` forward + backward (t 1 and 8, SP off / on, every recompute) over the
    number of ops the simulator prices for it: the eager framework's cost per op (Python
    autograd functions, graph recording, dispatch, views) on top of the bare launch. Each
    run is kept with its torch.utils.checkpoint regions, so the fit can tell the per-op cost
    from the checkpoint's own (`calibration.host_fit.checkpoint_host_s`).
    """
    timer = Timer(
        dev,
        TimingPolicy(warmup=3, min_repeats=10, max_repeats=10 if quick else 30, budget_s=0.05, max_buffers=1),
    )
    shape = OVERHEAD_SHAPE
    runs = []
    combos = list(itertools.product((1, 8), (False, True), Recompute))
    for tp, sp, recompute in combos[:limit]:
        config = shape.config(tp, sp, recompute)
        spec = LayerSpec.from_layer_config(config, dropout_prob=DROPOUT_PROB)
        ops = layer_ops(config)
        num_ops = sum(len(standin_ops(seq, tp)) for seq in (ops.forward, ops.backward, ops.recompute))
        replayed = len(standin_ops(ops.recompute, tp))
        total_s = time_layer(spec, timer, mode=mode).total_s
        runs.append(
            TinyLayerRecord(tp, sp, recompute.value, num_ops, replayed, checkpoint_regions(config), total_s)
        )
    return statistics.median(r.total_s / r.priced_ops for r in runs), runs


def _peak_gemm_size(device_type: str, quick: bool) -> int:
    if device_type == "cuda":
        return 4096 if quick else 8192
    return 256 if quick else 1024


def _square_gemm(timer: Timer, ctx: BuildContext, size: int, dtype: torch.dtype) -> GemmRecord:
    def build() -> Any:
        a = random_tensor((size, size), dtype, ctx.device, ctx.generator)
        b = random_tensor((size, size), dtype, ctx.device, ctx.generator)
        return lambda: a @ b

    element = torch.finfo(dtype).bits // 8
    calls = [build() for _ in range(timer.num_buffers(3 * element * size * size))]
    median, spread = median_and_spread(timer.times_s(calls))
    name = "square" if dtype == DTYPE else "square_fp32"
    return GemmRecord(name, size, size, size, 1, median, spread)


def main(argv: Sequence[str] | None = None) -> Measurements:
    parser = entry_point_parser(__doc__.splitlines()[0], Path("out/microbench.json"))
    parser.add_argument(
        "--attention-head-dim", type=int, default=None, help="the layer's head dim, timed beside 128"
    )
    add_run_options(parser)
    parser.add_argument("--modern", action="store_true", help="also time the modern kinds (modern_kernels)")
    parser.add_argument("--limit", type=int, default=None, help="time only the first N planned kernels")
    parser.add_argument("--grouped-gemm", action="store_true", help="also time the experts' grouped GEMMs")
    parser.add_argument(
        "--grouped-impl", choices=IMPLS, default="auto", help="torch._grouped_mm, a loop of GEMMs, or auto"
    )
    parser.add_argument(
        "--grouped-max-s", type=float, default=None, help="start no grouped GEMM after this many s"
    )
    args = parse_entry_point_args(parser, argv)
    command = "python -m simcluster.profiler.bench.microbench " + " ".join(argv or sys.argv[1:])
    with StderrProgress("calibrate") as progress:
        result = run_calibration(
            args.device,
            args.quick,
            command,
            progress,
            args.threads,
            attention_head_dim=args.attention_head_dim,
            mode=args.layer_mode,
            load=SustainedLoad.from_args(torch.device(args.device), args),
            modern=args.modern,
            limit=args.limit,
            grouped=GroupedOptions(args.grouped_impl, args.grouped_max_s) if args.grouped_gemm else None,
        )
    write_text_atomically(args.out, result.to_json())
    print(
        f"wrote {args.out}: {len(result.gemms)} GEMMs, {len(result.elementwise)} "
        f"memory-bound kernels, {len(result.attention)} attention shapes, {len(result.modern)} modern "
        f"kernels, {len(result.grouped_gemms)} grouped GEMMs ({result.layer_mode}, {result.load}) on "
        f"{result.device.name}"
    )
    return result


if __name__ == "__main__":
    main()
