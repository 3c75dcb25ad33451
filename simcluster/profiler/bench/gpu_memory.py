"""Measure the activation memory of a stack of real layers on one GPU, against Table 2.

    python -m simcluster.profiler.bench.gpu_memory --out-dir out/gpu_memory        # 22B, t=8
    python -m simcluster.profiler.bench.gpu_memory --hidden-size 1024 --num-attention-heads 16 \\
        --seq-length 512 --micro-batch-size 2 --tp 2 --num-layers 2 --device cpu

Builds `num_layers` layers at rank-0 shard shapes with `ShardStandInComm` (one device plays
one rank of t), runs their forward and records what stays allocated. On CUDA: after a warm-up
forward/backward (cuBLAS workspace, allocator pools), `retained_bytes` is
memory_allocated after the forward minus before it, and `peak_bytes` the rise of
max_memory_allocated over the same baseline. The input is allocated before the baseline and
the output after it, and both are [s(/t), b, h], so retained = L × (Table 2 + negligible)
up to the caching allocator's 512-byte rounding per block. On CPU there are no allocator
statistics: `retained_bytes` comes from the saved-tensor hooks of `accounting` instead and
`peak_bytes` is 0. Default shape: the 22B model of Table 3 (h=6144, a=64, s=2048, b=4, t=8).

Needs only torch and the standard library. Writes `gpu_memory.csv` (appending) and
`gpu_memory.md` (one markdown table row per run) under --out-dir.
"""

from __future__ import annotations

import argparse
import csv
import datetime
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from simcluster.config.choices import Dtype, Recompute
from simcluster.profiler.layer.accounting import SavedTensorCounter, expected_saved_bytes, table2_row
from simcluster.profiler.layer.parallel import ShardStandInComm
from simcluster.profiler.layer.spec import LayerSpec
from simcluster.profiler.layer.transformer import local_layer


@dataclass(frozen=True)
class StackMemory:
    """One measurement: the run's identity, its shape, and measured vs predicted bytes."""

    date: str
    device: str
    device_name: str
    torch_version: str
    cuda_version: str
    method: str
    table2_row: str
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    micro_batch_size: int
    tp: int
    sequence_parallel: bool
    recompute: str
    dtype: str
    num_layers: int
    retained_bytes: int
    predicted_bytes: int
    peak_bytes: int

    @property
    def ratio(self) -> float:
        """retained / predicted."""
        return self.retained_bytes / self.predicted_bytes


def measure_stack(spec: LayerSpec, num_layers: int, device: str = "cuda", seed: int = 0) -> StackMemory:
    """Forward `num_layers` stand-in layers of `spec` on `device` and measure what stays."""
    dev = torch.device(device)
    comm = ShardStandInComm(spec.tp)
    stack = nn.Sequential(*[local_layer(spec, comm, seed + i, device) for i in range(num_layers)])
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    x = torch.randn(
        spec.local_seq_length,
        spec.micro_batch_size,
        spec.hidden_size,
        generator=gen,
        device=dev,
        dtype=spec.torch_dtype,
    ).requires_grad_()
    if dev.type == "cuda":
        retained, peak, method = _cuda_bytes(stack, x)
    else:
        retained, peak, method = _hook_bytes(stack, x)
    return StackMemory(
        date=datetime.date.today().isoformat(),
        device=dev.type,
        device_name=_device_name(dev),
        torch_version=torch.__version__,
        cuda_version=str(torch.version.cuda),
        method=method,
        table2_row=table2_row(spec),
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_attention_heads,
        seq_length=spec.seq_length,
        micro_batch_size=spec.micro_batch_size,
        tp=spec.tp,
        sequence_parallel=spec.sequence_parallel,
        recompute=spec.recompute.value,
        dtype=spec.dtype.value,
        num_layers=num_layers,
        retained_bytes=retained,
        predicted_bytes=num_layers * expected_saved_bytes(spec, dev.type),
        peak_bytes=peak,
    )


def _cuda_bytes(stack: nn.Module, x: Tensor) -> tuple[int, int, str]:
    stack(x).sum().backward()  # warm-up: workspaces and pools, then drop the grads
    stack.zero_grad(set_to_none=True)
    x.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = stack(x)
    torch.cuda.synchronize()
    retained = torch.cuda.memory_allocated() - base
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return retained, peak, "cuda_memory_stats"


def _hook_bytes(stack: nn.Module, x: Tensor) -> tuple[int, int, str]:
    with SavedTensorCounter(stack) as counter:
        out = stack(x)
    del out
    return counter.result().total_bytes, 0, "saved_tensor_hooks"


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"{dev.type} ({torch.get_num_threads()} threads)"


def write_results(rows: Sequence[StackMemory], out_dir: Path) -> tuple[Path, Path]:
    """Append rows to out_dir/gpu_memory.csv and out_dir/gpu_memory.md (headers once)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / "gpu_memory.csv", out_dir / "gpu_memory.md"
    fields = list(asdict(rows[0])) + ["ratio"]
    new_csv = not csv_path.exists()
    with csv_path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        if new_csv:
            writer.writeheader()
        for row in rows:
            writer.writerow({**asdict(row), "ratio": f"{row.ratio:.6f}"})
    new_md = not md_path.exists()
    with md_path.open("a") as f:
        if new_md:
            f.write("| " + " | ".join(fields) + " |\n" + "|---" * len(fields) + "|\n")
        for row in rows:
            values = [str(v) for v in asdict(row).values()] + [f"{row.ratio:.4f}"]
            f.write("| " + " | ".join(values) + " |\n")
    return csv_path, md_path


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden-size", type=int, default=6144)
    p.add_argument("--num-attention-heads", type=int, default=64)
    p.add_argument("--seq-length", type=int, default=2048)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--dtype", choices=[d.value for d in Dtype], default=Dtype.BF16.value)
    p.add_argument("--dropout-prob", type=float, default=0.1)
    p.add_argument(
        "--recompute",
        choices=[r.value for r in Recompute],
        action="append",
        help="repeatable; default: every Table 2 row, with and without SP",
    )
    p.add_argument("--sequence-parallel", choices=["on", "off"], action="append")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out-dir", type=Path, default=Path("out/gpu_memory"))
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[StackMemory]:
    """Measure each requested (recompute, SP) row, write the files, print one line each."""
    args = _parse(argv)
    recomputes = [Recompute(r) for r in args.recompute] if args.recompute else list(Recompute)
    sps = [s == "on" for s in args.sequence_parallel] if args.sequence_parallel else [False, True]
    rows = []
    for recompute in recomputes:
        for sp in sps:
            spec = LayerSpec(
                args.hidden_size,
                args.num_attention_heads,
                args.seq_length,
                args.micro_batch_size,
                tp=args.tp,
                sequence_parallel=sp,
                recompute=recompute,
                dtype=Dtype(args.dtype),
                dropout_prob=args.dropout_prob,
            )
            row = measure_stack(spec, args.num_layers, args.device)
            print(
                f"{row.table2_row}: retained {row.retained_bytes} B, predicted "
                f"{row.predicted_bytes} B (x{row.ratio:.4f}), peak {row.peak_bytes} B"
            )
            rows.append(row)
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    csv_path, md_path = write_results(rows, args.out_dir)
    print(f"wrote {csv_path} and {md_path}")
    return rows


if __name__ == "__main__":
    main()
