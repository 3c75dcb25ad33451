"""A sweep end to end: load the spec, expand and filter (nothing valid is an error), check
the output and lock it against a second sweep, skip what the output already has (`resume`),
run the rest (serial, process pool or Dask) with a progress bar, and stream the rows to
Parquet. Whatever stops the sweep, the rows that finished are flushed first."""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Generator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from tqdm import tqdm

from simcluster.config.errors import ConfigError
from simcluster.sweep.evaluate import Row
from simcluster.sweep.execute import available_cores, run_dask, run_pool, run_serial
from simcluster.sweep.expand import Expansion, SweepConfig, expand
from simcluster.sweep.lock import SweepLock
from simcluster.sweep.spec import SweepSpec, load_sweep_spec
from simcluster.sweep.store import ResultStore, check_targets

if TYPE_CHECKING:
    from distributed import Client


@dataclass(frozen=True, slots=True)
class SweepOutcome:
    """The final table and how the sweep went."""

    table: pd.DataFrame
    spec: SweepSpec
    expansion: Expansion
    num_resumed: int  # valid configurations already in the output, not run again
    num_run: int  # configurations evaluated by this call
    elapsed_s: float

    @property
    def status_counts(self) -> dict[str, int]:
        return {status: int(n) for status, n in self.table["status"].value_counts().items()}


def _rows(
    todo: list[SweepConfig], spec: SweepSpec, workers: int, dask: str | Client | None, steady_state: bool
) -> Generator[list[Row], None, None]:
    if dask is not None:
        return run_dask(todo, spec.hardware, dask, steady_state)
    if workers <= 1:
        return run_serial(todo, spec.hardware, steady_state)
    return run_pool(todo, spec.hardware, workers, steady_state)


def execute_sweep(
    spec_path: str | Path,
    out_path: str | Path,
    *,
    workers: int | None = None,
    dask: str | Client | None = None,
    csv: bool = False,
    resume: bool = False,
    progress: bool = True,
    flush_every_s: float = 2.0,
    on_row: Callable[[Row], None] | None = None,
    full_simulation: bool = False,
) -> SweepOutcome:
    """Run the sweep in `spec_path`, writing `out_path` (Parquet) and, with `csv`, its .csv twin.

    `on_row` is called with each finished row after it is stored (a hook for tests and
    front-ends; if it raises, the sweep stops after flushing what finished). By default the
    engine's certified steady state is extended from one short run (`simcluster.steady_state`);
    `full_simulation` simulates every microbatch of every configuration."""
    start_s = time.perf_counter()
    spec = load_sweep_spec(spec_path)
    expansion = expand(spec)
    if not expansion.configs:
        raise ConfigError(spec.source, _nothing_to_run(spec, expansion))
    out = Path(out_path)
    csv_path = out.with_suffix(".csv") if csv else None
    check_targets(out, csv_path, spec, resume)
    with SweepLock(out):
        store = ResultStore(out, spec, csv=csv_path, flush_every_s=flush_every_s)
        done = store.resume() if resume else set()
        todo = [config for config in expansion.configs if config.config_id not in done]
        steady_state = not full_simulation
        _stream(todo, spec, store, workers or available_cores(), dask, steady_state, progress, on_row)
    return SweepOutcome(
        table=store.table(),
        spec=spec,
        expansion=expansion,
        num_resumed=len(expansion.configs) - len(todo),
        num_run=len(todo),
        elapsed_s=time.perf_counter() - start_s,
    )


def _nothing_to_run(spec: SweepSpec, expansion: Expansion) -> list[str]:
    return [
        f"axes: none of the {expansion.num_combinations} combinations is a valid configuration "
        f"on num_gpus {spec.num_gpus}; the most common reasons (change the axes, the base or num_gpus):",
        *expansion.common_problems(),
    ]


def _stream(
    todo: list[SweepConfig],
    spec: SweepSpec,
    store: ResultStore,
    workers: int,
    dask: str | Client | None,
    steady_state: bool,
    progress: bool,
    on_row: Callable[[Row], None] | None,
) -> None:
    """Run `todo`, storing rows as they arrive; whatever stops it, flush what finished."""
    counts: Counter[str] = Counter()
    bar = tqdm(total=len(todo), unit="cfg", file=sys.stderr, disable=not progress, smoothing=0.1)
    try:
        # closing(): whatever stops the loop stops the executor at once, not when the
        # traceback that holds this frame is freed
        with closing(_rows(todo, spec, workers, dask, steady_state)) as rows:
            for batch in rows:
                store.add(batch)
                counts.update(row["status"] for row in batch)
                bar.update(len(batch))
                bar.set_postfix(counts, refresh=False)
                for row in batch:
                    if on_row is not None:
                        on_row(row)
    finally:
        bar.close()
        store.flush()


def run_sweep(
    spec_path: str | Path,
    out_path: str | Path,
    *,
    workers: int | None = None,
    dask: str | Client | None = None,
    csv: bool = False,
    resume: bool = False,
    progress: bool = True,
) -> pd.DataFrame:
    """The sweep's table, one row per valid configuration (see `execute_sweep`)."""
    outcome = execute_sweep(
        spec_path, out_path, workers=workers, dask=dask, csv=csv, resume=resume, progress=progress
    )
    return outcome.table


def best_by_mfu(table: pd.DataFrame, count: int) -> pd.DataFrame:
    """The `count` simulated configurations with the highest MFU that fit with memory headroom."""
    fitting = table[(table["status"] == "ok") & (table["memory_headroom_bytes"] > 0)]
    return fitting.sort_values("mfu", ascending=False, kind="stable").head(count)
