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

`moe_cases` (issue 18) time the torch MoE MLP block (`profiler.layer.moe.MoEBlock`: router,
top-k, permute, one GEMM per local expert, weighted SwiGLU, unpermute; eager, bf16) at the
busiest expert rank's shapes of the shipped MoE layouts, the same way: `eager_s` from an idle
GPU with the host issuing (the block's token counts are copied to the host mid-forward, as
Megatron's dropless dispatchers do), `host_issue_s`, and `graph_s` (capture fails on that
copy: `graph_error` says so). One rank of an EP group is stood in for by an ep = 1 block of
G = E/ep experts with top-k = G over T tokens, so each local expert gets T rows: the op
graph's G and tokens per expert M (`calibration.grouped_shapes`), not its router width.
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


# (name, hidden, local experts G, tokens T = rows per expert M, expert FFN f, shared FFN):
# calibration.grouped_shapes' G and M of the shipped layouts (scenarios/moe/)
MoECase = tuple[str, int, int, int, int, int]


def moe_cases(quick: bool) -> list[MoECase]:
    if quick:
        return [("tiny-moe", 64, 4, 32, 32, 32)]
    return [
        ("qwen3-30b-a3b", 2048, 8, 4096, 768, 0),
        ("qwen3-235b-a22b", 4096, 4, 4096, 1536, 0),
        ("gpt-oss-120b", 2880, 8, 1024, 2880, 0),
        ("deepseek-v3", 7168, 4, 4096, 2048, 2048),
        ("mixtral-8x7b", 4096, 1, 8192, 14336, 0),
    ]


def measure_moe_case(case: MoECase, dev: torch.device, repeats: int) -> dict[str, Any]:
    """eager_s, host_issue_s and graph_s of one MoE block's forward + backward (bf16)."""
    from simcluster.profiler.layer.moe import MoEBlock
    from simcluster.workload.moe_config import MoEConfig

    name, h, g, t, f, fs = case
    moe = MoEConfig(num_experts=g, router_topk=g, ffn_hidden_size=f, shared_expert_ffn_hidden_size=fs)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    block = MoEBlock(h, moe, dtype=dtype).to(dev)
    x = torch.randn((t, h), device=dev, dtype=dtype).requires_grad_()
    grad = torch.randn((t, h), device=dev, dtype=dtype)

    def eager() -> None:
        x.grad = None
        block.zero_grad(set_to_none=True)
        block(x).backward(grad)

    expert_flops = 3 * 2 * g * t * h * 3 * f  # fc1 (2f) + fc2 (f), forward + two backward GEMMs
    row: dict[str, Any] = {
        "name": name, "hidden_size": h, "local_experts": g, "tokens_per_expert": t,
        "ffn_hidden_size": f, "shared_expert_ffn_hidden_size": fs, "dtype": str(dtype),
        "expert_gemm_flops": expert_flops,
    }  # fmt: skip
    row["eager_s"], row["host_issue_s"] = _times(eager, dev, repeats)
    row["graph_s"] = None
    if dev.type == "cuda":
        try:
            graphed = torch.cuda.make_graphed_callables(block, (x.detach().clone().requires_grad_(),))
            out = graphed(x)
            assert isinstance(out, torch.Tensor)
            out.backward(grad)
        except Exception as error:  # the host copy of the token counts cannot be captured
            row["graph_error"] = str(error).splitlines()[0][:200]
    return row


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
    moe_rows = []
    for moe_case in moe_cases(quick):  # first: the dense cases were measured before (2026-11-26)
        try:
            moe_row = measure_moe_case(moe_case, dev, 3 if quick else 10)
        except Exception as error:  # one failing block must not lose the rest of the file
            moe_row = {"name": moe_case[0], "error": str(error).splitlines()[0][:200]}
        moe_row["sm_clock_mhz"], moe_row["power_w"] = sensors.read()
        moe_rows.append(moe_row)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
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
        "moe_cases": moe_rows,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = entry_point_parser(__doc__.splitlines()[0], Path("out/host_graph.json"))
    add_run_options(parser)
    args = parse_entry_point_args(parser, argv)
    command = "python -m simcluster.profiler.bench.host_graph " + " ".join(argv or sys.argv[1:])
    result = run_host_graph(args.device, args.quick, args.layer_mode, command)
    write_text_atomically(args.out, json.dumps(result, indent=1))
    print(
        f"wrote {args.out}: {len(result['cases'])} cases ({result['layer_mode']}), "
        f"{len(result['moe_cases'])} MoE blocks"
    )
    return result


if __name__ == "__main__":
    main()
