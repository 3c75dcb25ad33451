"""A sweep end to end: load the spec, expand and filter (nothing valid is an error), check
the output and lock it against a second sweep, skip what the output already has (`resume`),
run the rest (serial, process pool or Dask) with a progress bar, and stream the rows to
Parquet part files (`store`). Whatever stops the sweep, the rows that finished are flushed
and combined into the output first."""

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
from simcluster.headroom import DEFAULT_HEADROOM_FRACTION, headroom_problem
from simcluster.sweep.evaluate import Row, SweepInputs
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
    headroom_fraction: float = DEFAULT_HEADROOM_FRACTION
    replaced: str | None = None  # what a fresh sweep replaced at its output (with force), for the user

    @property
    def status_counts(self) -> dict[str, int]:
        return {status: int(n) for status, n in self.table["status"].value_counts().items()}


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C (or another KeyboardInterrupt) during `execute_sweep`: `rows` finished rows are
    in `out`, or None when it stopped before writing `out` (loading, expanding, checking), so
    nothing of this sweep is there and an earlier file at `out` is as it was."""

    def __init__(self, out: Path, rows: int | None) -> None:
        super().__init__(f"{out}: {rows} rows" if rows is not None else f"{out}: not written")
        self.out, self.rows = out, rows


def _rows_in(path: Path) -> int | None:
    import pyarrow.parquet as pq

    try:
        return int(pq.read_metadata(path).num_rows)
    except (OSError, ValueError):
        return None


def _rows(
    todo: list[SweepConfig], inputs: SweepInputs, workers: int, dask: str | Client | None
) -> Generator[list[Row], None, None]:
    if dask is not None:
        return run_dask(todo, inputs, dask)
    if workers <= 1:
        return run_serial(todo, inputs)
    return run_pool(todo, inputs, workers)


def invalid_cells(expansion: Expansion) -> list[list[object]]:
    """The (model, tp, pp) cells where the loader rejected every combination: a heatmap
    draws them as invalid, not as "does not fit"."""
    valid = {(c.layout["model"], c.layout["tp"], c.layout["pp"]) for c in expansion.configs}
    cells: dict[tuple[object, ...], None] = {}
    for key, _ in expansion.invalid:
        fields = dict(part.split("=", 1) for part in key.split(","))
        cell = (fields["model"], int(fields["tp"]), int(fields["pp"]))
        if cell not in valid:
            cells[cell] = None
    return [list(cell) for cell in cells]


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
    headroom_fraction: float = DEFAULT_HEADROOM_FRACTION,
    full_simulation: bool = False,
    force: bool = False,
) -> SweepOutcome:
    """Run the sweep in `spec_path`, writing `out_path` (Parquet) and, with `csv`, its .csv twin.
    A configuration fits only if it leaves `headroom_fraction` of the usable memory free.

    `on_row` is called with each finished row after it is stored (a hook for tests and
    front-ends; if it raises, the sweep stops after flushing what finished). By default the
    engine's certified steady state is extended from one short run (`simcluster.steady_state`);
    `full_simulation` simulates every microbatch of every configuration. An existing `out`
    is refused unless `resume` (continue it) or `force` (replace it: `SweepOutcome.replaced`
    says what was there). A KeyboardInterrupt leaves as `SweepInterrupted`, saying whether
    `out` holds this sweep's finished rows."""
    start_s = time.perf_counter()
    out = Path(out_path)
    written: list[bool] = []  # non-empty once the store has written `out`
    try:
        spec = load_sweep_spec(spec_path)
        if (problem := headroom_problem(headroom_fraction)) is not None:
            raise ConfigError(spec.source, [problem])
        expansion = expand(spec)
        if not expansion.configs:
            raise ConfigError(spec.source, _nothing_to_run(spec, expansion))
        csv_path = out.with_suffix(".csv") if csv else None
        replaced = check_targets(out, csv_path, spec, resume, force, headroom_fraction)
        with SweepLock(out):
            store = ResultStore(
                out, spec, csv=csv_path, flush_every_s=flush_every_s, headroom_fraction=headroom_fraction,
                extra_metadata={"invalid_cells": invalid_cells(expansion)},
            )  # fmt: skip
            if resume:
                done = store.resume()
            else:
                store.start_fresh()
                done = set()
            written.append(True)
            todo = [config for config in expansion.configs if config.config_id not in done]
            inputs = SweepInputs(spec.profiles, headroom_fraction, steady_state=not full_simulation)
            _stream(todo, inputs, store, workers or available_cores(), dask, progress, on_row)
    except KeyboardInterrupt as interrupt:
        raise SweepInterrupted(out, _rows_in(out) if written else None) from interrupt
    return SweepOutcome(
        table=store.table(),
        spec=spec,
        expansion=expansion,
        num_resumed=len(expansion.configs) - len(todo),
        num_run=len(todo),
        elapsed_s=time.perf_counter() - start_s,
        headroom_fraction=headroom_fraction,
        replaced=replaced,
    )


def _nothing_to_run(spec: SweepSpec, expansion: Expansion) -> list[str]:
    return [
        f"axes: none of the {expansion.num_combinations} combinations is a valid configuration "
        f"on num_gpus {spec.num_gpus}; the most common reasons (change the axes, the base or num_gpus):",
        *expansion.common_problems(),
    ]


def _stream(
    todo: list[SweepConfig],
    inputs: SweepInputs,
    store: ResultStore,
    workers: int,
    dask: str | Client | None,
    progress: bool,
    on_row: Callable[[Row], None] | None,
) -> None:
    """Run `todo`, storing rows as they arrive; whatever stops it, flush what finished."""
    counts: Counter[str] = Counter()
    bar = tqdm(total=len(todo), unit="cfg", file=sys.stderr, disable=not progress, smoothing=0.1)
    try:
        # closing(): whatever stops the loop stops the executor at once, not when the
        # traceback that holds this frame is freed
        with closing(_rows(todo, inputs, workers, dask)) as rows:
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
        store.finish()


def run_sweep(
    spec_path: str | Path,
    out_path: str | Path,
    *,
    workers: int | None = None,
    dask: str | Client | None = None,
    csv: bool = False,
    resume: bool = False,
    progress: bool = True,
    headroom_fraction: float = DEFAULT_HEADROOM_FRACTION,
    force: bool = False,
) -> pd.DataFrame:
    """The sweep's table, one row per valid configuration (see `execute_sweep`)."""
    outcome = execute_sweep(
        spec_path, out_path, workers=workers, dask=dask, csv=csv, resume=resume, progress=progress,
        headroom_fraction=headroom_fraction, force=force,
    )  # fmt: skip
    return outcome.table


def _fitting(table: pd.DataFrame) -> pd.DataFrame:
    return table[(table["status"] == "ok") & table["fits"].fillna(False).astype(bool)]


def best_by_mfu(table: pd.DataFrame, count: int) -> pd.DataFrame:
    """The `count` simulated configurations with the highest MFU that fit (leave the
    sweep's headroom free)."""
    return _fitting(table).sort_values("mfu", ascending=False, kind="stable").head(count)


RANK_BY_MFU = "mfu"
RANK_BY_TOKENS = "tokens_per_s_per_gpu"


def tokens_per_s_per_gpu(table: pd.DataFrame) -> pd.Series:
    """global_batch_size · seq_length / iteration time / GPUs of each row (NaN where the row
    was not simulated), as `SimulationResult.tokens_per_s_per_gpu`."""
    tokens = table["global_batch_size"].astype(float) * table["seq_length"].astype(float)
    return tokens / table["iteration_time_s"] / table["num_gpus"].astype(float)


def ranking(table: pd.DataFrame) -> str:
    """What the best rows are ranked by: MFU while every fitting row runs on one hardware
    profile; tokens/s per GPU once profiles differ, because MFU divides by each GPU's own
    peak (an A100 row at 50 % MFU is slower than an H100 row at 40 %). The GPU count is fixed
    within a sweep, so this is the fastest iteration for a given batch."""
    hardware = _fitting(table)["hardware"] if "hardware" in table else pd.Series(dtype=object)
    return RANK_BY_TOKENS if hardware.nunique() > 1 else RANK_BY_MFU


def best_rows(table: pd.DataFrame, count: int) -> tuple[pd.DataFrame, str]:
    """The `count` best configurations that fit and what they are ranked by (`ranking`):
    highest MFU, or highest tokens/s per GPU when the hardware varies; each row gains a
    `tokens_per_s_per_gpu` column."""
    fitting = _fitting(table).assign(tokens_per_s_per_gpu=lambda rows: tokens_per_s_per_gpu(rows))
    key = ranking(table)
    return fitting.sort_values(key, ascending=False, kind="stable").head(count), key
