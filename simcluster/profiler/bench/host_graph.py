"""Host time of the real layer: eager forward + backward against a CUDA-graph replay of it.

    python -m simcluster.profiler.bench.host_graph --device cuda --out out/host_graph.json

For each case (`modern_layers` shapes: Llama 3 8B t 8 SP, GPT-3 175B flash t 8 SP, Llama 3 8B
t 1, a tiny layer) it records medians over repeats: `eager_s`, forward + backward between
CUDA events with the host issuing as fast as it can; `host_issue_s`, the host's wall time to
issue that forward + backward (perf_counter around the call, no synchronisation inside);
`graph_s`, the same layer captured with `torch.cuda.make_graphed_callables` and replayed (no
per-op host cost). eager_s exceeds graph_s by about the host time when the layer is
host-bound (an H100 measured 6.83 vs 4.52 ms for Llama 3 8B t 8:
docs/calibration/h100-2026-11-26/README.md, finding 7). On a CPU there are no CUDA graphs:
`graph_s` is null and the times are wall times. The tiny layer (h 64) gives the framework's
own cost per forward + backward.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from simcluster.atomic_files import write_text_atomically
from simcluster.config.choices import LayerMode
from simcluster.profiler.bench.command_line import entry_point_parser, parse_entry_point_args
from simcluster.profiler.bench.device_info import describe_device
from simcluster.profiler.bench.layer_timing import default_layer_mode
from simcluster.profiler.bench.modern_layers import GPT3_175B_FLASH, LLAMA3_8B, TINY, Case, spec_of
from simcluster.profiler.bench.sustained import GpuSensors, add_run_options
from simcluster.profiler.layer.parallel import ShardStandInComm
from simcluster.profiler.layer.transformer import local_layer


def host_cases(quick: bool) -> list[Case]:
    if quick:
        return [("tiny", TINY, 32, 1, 2, "none")]
    return [
        ("llama3-8b", LLAMA3_8B, 8192, 1, 8, "none"),
        ("gpt3-175b-flash", GPT3_175B_FLASH, 2048, 1, 8, "none"),
        ("llama3-8b", LLAMA3_8B, 8192, 1, 1, "none"),
        ("tiny", TINY, 128, 1, 1, "none"),
    ]


def measure_case(case: Case, dev: torch.device, mode: LayerMode, repeats: int) -> dict[str, Any]:
    """eager_s, host_issue_s and graph_s (None on a CPU) of one case's forward + backward."""
    spec = spec_of(case)
    layer = local_layer(spec, ShardStandInComm(spec.tp), 0, str(dev), mode=mode)
    shape = (spec.local_seq_length, spec.micro_batch_size, spec.hidden_size)
    x = torch.randn(shape, device=dev, dtype=spec.torch_dtype).requires_grad_()
    grad = torch.randn(shape, device=dev, dtype=spec.torch_dtype)

    def eager() -> None:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(x).backward(grad)

    row: dict[str, Any] = {
        "name": case[0],
        "tp": spec.tp,
        "sequence_parallel": spec.sequence_parallel,
        "seq_length": spec.seq_length,
        "micro_batch_size": spec.micro_batch_size,
        "recompute": case[5],
        "layer": dict(case[1]),  # LayerConfig fields beyond the shape (calibration.host_fit)
        "layer_mode": mode.value,
    }
    row["eager_s"], row["host_issue_s"] = _times(eager, dev, repeats)
    row["graph_s"] = None
    if dev.type == "cuda":
        try:
            graphed = torch.cuda.make_graphed_callables(layer, (x.detach().clone().requires_grad_(),))

            def replay() -> None:
                x.grad = None
                out = graphed(x)
                assert isinstance(out, torch.Tensor)
                out.backward(grad)

            row["graph_s"] = _times(replay, dev, repeats)[0]
        except Exception as error:  # capture can fail (a host sync in a kernel): record why
            row["graph_error"] = str(error).splitlines()[0][:200]
    return row


def _times(step: Callable[[], None], dev: torch.device, repeats: int) -> tuple[float, float]:
    """(median device seconds, median host seconds to issue) of `step`."""
    for _ in range(3):
        step()
    device_s, host_s = [], []
    for _ in range(repeats):
        if dev.type == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        begin = time.perf_counter()
        step()
        host_s.append(time.perf_counter() - begin)
        if dev.type == "cuda":
            end.record()
            end.synchronize()
            device_s.append(start.elapsed_time(end) * 1e-3)
        else:
            device_s.append(host_s[-1])
    return statistics.median(device_s), statistics.median(host_s)


def run_host_graph(device: str, quick: bool, mode: LayerMode | None, command: str) -> dict[str, Any]:
    dev = torch.device(device)
    mode = LayerMode(mode or default_layer_mode(dev.type))
    sensors = GpuSensors(dev)
    rows = []
    for case in host_cases(quick):
        row = measure_case(case, dev, mode, 5 if quick else 20)
        row["sm_clock_mhz"], row["power_w"] = sensors.read()
        rows.append(row)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return {
        "device": asdict(describe_device(dev)),
        "command": command,
        "layer_mode": mode.value,
        "cases": rows,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = entry_point_parser(__doc__.splitlines()[0], Path("out/host_graph.json"))
    add_run_options(parser)
    args = parse_entry_point_args(parser, argv)
    command = "python -m simcluster.profiler.bench.host_graph " + " ".join(argv or sys.argv[1:])
    result = run_host_graph(args.device, args.quick, args.layer_mode, command)
    write_text_atomically(args.out, json.dumps(result, indent=1))
    print(f"wrote {args.out}: {len(result['cases'])} cases ({result['layer_mode']})")
    return result


if __name__ == "__main__":
    main()
