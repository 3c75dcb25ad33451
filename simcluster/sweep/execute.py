"""Where configurations run: in this process (`workers=1`), a local process pool (default:
every core), or a Dask distributed cluster. Each yields batches of rows as they complete;
closing the generator (interrupt, error in the caller) cancels the work not yet started.
"""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Generator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import TYPE_CHECKING, Any

from simcluster.engine.gc_tuning import GC_THRESHOLDS, simulation_gc
from simcluster.sweep.evaluate import Row, SweepInputs, evaluate_batch
from simcluster.sweep.expand import SweepConfig

if TYPE_CHECKING:
    from distributed import Client

MAX_BATCH = 16  # configurations per message: IPC amortised, progress still smooth
BATCHES_PER_WORKER = 16  # enough batches that the last ones finish close together


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def estimated_cost(config: SweepConfig) -> int:
    """Engine work grows with the tasks simulated: pp stages × vpp chunks × m microbatches
    (a forward and a backward each). Out-of-memory configurations cost far less, but that is
    only known once the worker has estimated their memory."""
    par = config.scenario.parallel
    return par.pp * par.vpp * config.scenario.num_microbatches


def batches(configs: Sequence[SweepConfig], num_workers: int) -> list[list[SweepConfig]]:
    """Longest first (LPT scheduling: no long configuration starts last and leaves the other
    workers idle), grouped until a batch holds its share of the estimated cost or MAX_BATCH."""
    ordered = sorted(configs, key=estimated_cost, reverse=True)
    share = sum(map(estimated_cost, ordered)) / (num_workers * BATCHES_PER_WORKER)
    groups: list[list[SweepConfig]] = []
    current: list[SweepConfig] = []
    cost = 0
    for config in ordered:
        current.append(config)
        cost += estimated_cost(config)
        if cost >= share or len(current) == MAX_BATCH:
            groups.append(current)
            current, cost = [], 0
    return groups + [current] if current else groups


# The sweep keeps the collector tuned for its whole run (see simcluster.engine.gc_tuning).
sweep_gc = simulation_gc


def run_serial(configs: Sequence[SweepConfig], inputs: SweepInputs) -> Generator[list[Row], None, None]:
    """In this process, one configuration at a time (no messages to amortise)."""
    with sweep_gc():
        for config in configs:
            yield evaluate_batch([config], inputs)


_WORKER_INPUTS: SweepInputs | None = None


def _init_worker(inputs: SweepInputs) -> None:
    """Pool worker start: keep the profiles; leave Ctrl-C to the parent, which flushes."""
    global _WORKER_INPUTS
    _WORKER_INPUTS = inputs
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    gc.set_threshold(*GC_THRESHOLDS)


def _pool_task(batch: list[SweepConfig]) -> list[Row]:
    assert _WORKER_INPUTS is not None
    return evaluate_batch(batch, _WORKER_INPUTS)


def run_pool(
    configs: Sequence[SweepConfig], inputs: SweepInputs, num_workers: int
) -> Generator[list[Row], None, None]:
    pool = ProcessPoolExecutor(max_workers=num_workers, initializer=_init_worker, initargs=(inputs,))
    try:
        # Workers fork at the first submit. Frozen objects are never scanned by the workers'
        # garbage collector, so the pages they share with this process stay shared (about
        # 4x fewer page faults, -15 % CPU on a 171-configuration sweep).
        gc.freeze()
        try:
            pending: set[Future[list[Row]]] = {
                pool.submit(_pool_task, b) for b in batches(configs, num_workers)
            }
        finally:
            gc.unfreeze()
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def run_dask(
    configs: Sequence[SweepConfig], inputs: SweepInputs, dask: str | Client
) -> Generator[list[Row], None, None]:
    """Run on a Dask cluster at `dask` (a scheduler address) or through an open Client."""
    from distributed import Client, as_completed

    client = Client(dask) if isinstance(dask, str) else dask
    futures: list[Any] = []
    try:
        num_workers = max(1, sum(client.nthreads().values()))
        inputs_future = client.scatter(inputs, broadcast=True)
        futures = client.map(evaluate_batch, batches(configs, num_workers), inputs=inputs_future, pure=False)
        for future in as_completed(futures):
            yield future.result()
    finally:
        client.cancel(futures)
        if isinstance(dask, str):
            client.close()
