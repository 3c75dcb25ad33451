"""Time modern layers (GQA, SwiGLU, RMSNorm, RoPE, flash) at Llama / GPT-3 shard shapes,
eager or fused: the first records of a modern-layer check.

    python -m simcluster.profiler.bench.modern_layers --device cuda --layer-mode fused \
        --out out/modern_layers_fused.json

The cases are those measured on an H100 in docs/calibration/h100-2026-11-26/
(`measure.py`: 12 layers eager, t 1-8 with SP; `measure3.py`: three layers at t = 1), so a
new run compares with them: Llama 3 8B (s 8192, GQA 32/8, SwiGLU 14336, RMSNorm, RoPE,
flash), Llama 3 70B (h 8192, 64/8 heads, FFN 28672), GPT-3 175B with flash (h 12288, 96
heads, s 2048) and the paper's GPT-3 175B layer (unfused attention, dropout 0.1). Dropout 0
in the flash layers (Megatron's Llama recipes). Each is timed by `layer_timing.time_layer`
(rank 0 of t, stand-in collectives) and written as a `LayerRun` whose timings carry the
layer's name and its LayerConfig fields in `layer`. `--quick`: two tiny Llama-style layers.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from simcluster.calibration.named_layers import (  # one source for both sides
    GPT3_175B_FLASH,
    GPT3_175B_PAPER,
    LLAMA3_8B,
    LLAMA3_70B,
    TINY,
    dropout_of,
)

__all__ = ["GPT3_175B_FLASH", "GPT3_175B_PAPER", "LLAMA3_8B", "LLAMA3_70B", "TINY"]  # host_graph's cases
from simcluster.calibration.records import LayerRun, LayerTiming, write_text_atomically
from simcluster.config.choices import LayerMode, Recompute
from simcluster.profiler.bench.command_line import entry_point_parser, parse_entry_point_args
from simcluster.profiler.bench.device_info import describe_device
from simcluster.profiler.bench.layer_timing import default_layer_mode, time_layer
from simcluster.profiler.bench.progress import Progress, StderrProgress
from simcluster.profiler.bench.sustained import GpuSensors, SustainedLoad, add_run_options
from simcluster.profiler.bench.timing import Timer, TimingPolicy, cpu_threads
from simcluster.profiler.layer.spec import LayerSpec

# (name, model, seq_length, micro_batch_size, tp, recompute); SP whenever tp > 1
Case = tuple[str, dict[str, Any], int, int, int, str]


def cases(quick: bool) -> list[Case]:
    if quick:
        return [("tiny", TINY, 32, 1, t, "none") for t in (1, 2)]
    out: list[Case] = [("llama3-8b", LLAMA3_8B, 8192, 1, t, "none") for t in (1, 2, 4, 8)]
    out += [("llama3-70b", LLAMA3_70B, 8192, 1, t, "none") for t in (1, 4, 8)]
    out += [("llama3-8b", LLAMA3_8B, 8192, 2, 2, "none"), ("llama3-70b", LLAMA3_70B, 8192, 1, 8, "selective")]
    out += [("gpt3-175b-flash", GPT3_175B_FLASH, 2048, 1, t, "none") for t in (1, 4, 8)]
    out += [("gpt3-175b-paper", GPT3_175B_PAPER, 2048, 1, 8, r) for r in ("selective", "none")]
    return out


def spec_of(case: Case) -> LayerSpec:
    _, model, s, b, tp, recompute = case
    dropout = dropout_of(model)
    return LayerSpec(
        seq_length=s,
        micro_batch_size=b,
        tp=tp,
        sequence_parallel=tp > 1,
        recompute=Recompute(recompute),
        dropout_prob=dropout,
        **model,
    )


def run_modern(
    device: str,
    quick: bool = False,
    command: str = "",
    progress: Progress | None = None,
    mode: LayerMode | None = None,
    load: SustainedLoad | None = None,
    num_threads: int | None = 1,
    limit: int | None = None,
    max_s: float | None = None,
    skip: int = 0,
) -> LayerRun:
    """Time every case (the first `limit`, less the first `skip`: a run that continues an
    earlier one) in `mode` on `device`; none starts after `max_s`."""
    dev = torch.device(device)
    mode = LayerMode(mode or default_layer_mode(dev.type))
    todo = cases(quick)[skip:limit]
    policy = (
        TimingPolicy(warmup=3, min_repeats=10, max_repeats=30, budget_s=0.5)
        if dev.type == "cuda"
        else TimingPolicy(warmup=1, min_repeats=3, max_repeats=5, budget_s=0.1, max_buffers=1)
    )
    timer, sensors = Timer(dev, policy), GpuSensors(dev)
    if progress is not None:
        progress.start(len(todo))
    timings: list[LayerTiming] = []
    with cpu_threads(dev, num_threads):
        warmup = load.settle() if load is not None else None
        begin = time.perf_counter()
        for i, case in enumerate(todo):
            if max_s is not None and time.perf_counter() - begin > max_s:
                print(f"modern_layers: --max-s {max_s} reached after {i} of {len(todo)}", file=sys.stderr)
                break
            if load is not None:
                load.maintain()
            spec = spec_of(case)
            timing = time_layer(spec, timer, seed=i, mode=mode, sensors=sensors)
            timings.append(_with_layer(timing, case, spec))
            if progress is not None:
                progress.step(f"{case[0]} t={case[4]} {case[5]}")
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return LayerRun(
        describe_device(dev),
        command,
        "modern-quick" if quick else "modern",
        "bf16",
        0.0,
        timings,
        layer_mode=mode.value,
        load="sustained" if load else "burst",
        warmup=warmup,
    )


def _with_layer(timing: LayerTiming, case: Case, spec: LayerSpec) -> LayerTiming:
    from dataclasses import replace

    fields = {k: (v.value if hasattr(v, "value") else v) for k, v in case[1].items()}
    layer = {
        "name": case[0],
        **fields,
        "hidden_dropout": spec.hidden_dropout,
        "attention_dropout": spec.attention_dropout,
    }
    return replace(timing, layer=layer)


def main(argv: Sequence[str] | None = None) -> LayerRun:
    parser = entry_point_parser(__doc__.splitlines()[0], Path("out/modern_layers.json"))
    add_run_options(parser)
    parser.add_argument("--limit", type=int, default=None, help="time only the first N cases")
    parser.add_argument("--max-s", type=float, default=None, help="start no case after this many seconds")
    parser.add_argument("--skip", type=int, default=0, help="leave out the first N cases (timed before)")
    args = parse_entry_point_args(parser, argv)
    command = "python -m simcluster.profiler.bench.modern_layers " + " ".join(argv or sys.argv[1:])
    load = SustainedLoad.from_args(torch.device(args.device), args)
    with StderrProgress("modern layers") as progress:
        run = run_modern(
            args.device,
            args.quick,
            command,
            progress,
            args.layer_mode,
            load,
            args.threads,
            args.limit,
            args.max_s,
            args.skip,
        )
    write_text_atomically(args.out, run.to_json())
    print(f"wrote {args.out}: {len(run.timings)} modern layers ({run.layer_mode}, {run.load})")
    return run


if __name__ == "__main__":
    main()
