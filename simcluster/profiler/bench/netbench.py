"""All-reduce bus bandwidth inside one node, for `simcluster calibrate --network`.

One process per GPU (torch.multiprocessing spawn, NCCL; `launch.run_distributed`), each
all-reducing a bf16 buffer of random values; per message size: warm-up, then the median
over repeats of CUDA-event time on rank 0 (a barrier-free loop: NCCL orders the calls).
busbw = 2(n − 1)/n · bytes / time, nccl-tests' definition, which is what
`simcluster.costs.network` reads. With backend 'gloo' and device 'cpu' the same code runs
on CPU processes (tests); that measures nothing about a GPU.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from simcluster.calibration.records import AllReducePoint
from simcluster.profiler.bench.launch import run_distributed
from simcluster.profiler.layer.parallel import Comm

SIZES_BYTES = tuple(2**p for p in range(15, 31, 2))  # 32 KiB ... 1 GiB
QUICK_SIZES_BYTES = (2**15, 2**20, 2**24)


def measure_allreduce(num_ranks: int, quick: bool = False, backend: str = "nccl") -> list[AllReducePoint]:
    """The all-reduce sweep on `num_ranks` GPUs (NCCL) or CPU processes (gloo)."""
    sizes = QUICK_SIZES_BYTES if quick else SIZES_BYTES
    results = run_distributed(_sweep, num_ranks, (sizes, backend, 3 if quick else 20), backend)
    return results[0]


def _sweep(comm: Comm, arg: Any) -> list[AllReducePoint]:
    sizes, backend, repeats = arg
    device = torch.device("cuda", comm.rank) if backend == "nccl" else torch.device("cpu")
    gen = torch.Generator(device=device)
    gen.manual_seed(comm.rank)
    points = []
    for size in sizes:
        x = torch.randn(size // 2, generator=gen, device=device, dtype=torch.bfloat16)
        for _ in range(3):
            dist.all_reduce(x)
        times = [_timed_all_reduce(x, device) for _ in range(repeats)]
        points.append(AllReducePoint(size, statistics.median(times), comm.world_size))
    return points


def _timed_all_reduce(x: torch.Tensor, device: torch.device) -> float:
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_reduce(x)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3
    begin = time.perf_counter()
    dist.all_reduce(x)
    return time.perf_counter() - begin
