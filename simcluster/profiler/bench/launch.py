"""Run a function on every rank of a fresh torch.distributed group of `world_size` processes.

`run_distributed(fn, world_size, arg)` spawns the processes (torch.multiprocessing, 'spawn'),
joins them into one group through a file:// rendezvous in a temporary folder (no port to
pick, nothing to clash with), calls `fn(comm, arg)` on each with a `DistributedComm`, and
returns the per-rank results in rank order. gloo on CPU (tests), NCCL for GPUs (one GPU per
rank). Spawn one group and loop over configurations inside `fn`: a spawn costs seconds.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from simcluster.profiler.layer.parallel import Comm, DistributedComm

R = TypeVar("R")


def run_distributed(
    fn: Callable[[Comm, Any], R],
    world_size: int,
    arg: Any = None,
    backend: str = "gloo",
    num_threads: int = 1,
) -> list[R]:
    """`[fn(comm_rank_0, arg), ..., fn(comm_rank_{t-1}, arg)]`, each in its own process.

    `fn` must be importable by name (a module-level function) so 'spawn' can find it. An
    exception on any rank is raised here (torch.multiprocessing.ProcessRaisedException).
    """
    with tempfile.TemporaryDirectory(prefix="simcluster-dist-") as folder:
        mp.spawn(
            _rank_main, args=(fn, world_size, arg, folder, backend, num_threads), nprocs=world_size, join=True
        )
        return [pickle.loads((Path(folder) / f"rank{r}.pkl").read_bytes()) for r in range(world_size)]


def _rank_main(
    rank: int,
    fn: Callable[[Comm, Any], Any],
    world_size: int,
    arg: Any,
    folder: str,
    backend: str,
    num_threads: int,
) -> None:
    torch.set_num_threads(num_threads)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend, init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world_size
    )
    result = fn(DistributedComm(), arg)
    (Path(folder) / f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    dist.barrier()  # every rank's result is on disk before any rank leaves
    # Leave without tearing gloo down: its destructors occasionally abort the process
    # ("terminate called without an active exception", seen on the 2-core CI machine) after
    # all work is done. The result is already written; exit code 0 tells spawn all is well.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
