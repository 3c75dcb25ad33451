"""Sweep results on disk: one Parquet file (and optionally a CSV twin) rewritten atomically
(write a temporary file, then rename) every few seconds as rows arrive, so the output is
always one complete, readable table and an interrupted sweep loses only rows that had not
been flushed. The file's metadata records a fingerprint of the sweep's inputs (base
scenario, GPU count, hardware profile): `--resume` refuses a file from other inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from simcluster.config.errors import ConfigError
from simcluster.sweep.axes import AXES, LAYOUT_COLUMNS, choice_order
from simcluster.sweep.evaluate import Row
from simcluster.sweep.spec import SweepSpec

METADATA_KEY = b"simcluster.sweep"


def _arrow_type(column: str) -> pa.DataType:
    axis = AXES.get(column)
    if axis is None:
        return pa.int64()  # dp
    return pa.bool_() if axis.kind is bool else pa.int64() if axis.kind is int else pa.string()


SCHEMA = pa.schema(
    [pa.field("config_id", pa.string(), nullable=False)]
    + [pa.field(column, _arrow_type(column), nullable=False) for column in LAYOUT_COLUMNS]
    + [
        pa.field("num_gpus", pa.int64(), nullable=False),
        pa.field("num_microbatches", pa.int64(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("iteration_time_s", pa.float64()),
        pa.field("mfu", pa.float64()),
        pa.field("hfu", pa.float64()),
        pa.field("bubble_fraction", pa.float64()),
        pa.field("tflops_per_gpu", pa.float64()),
        pa.field("max_stage_peak_memory_bytes", pa.float64()),
        pa.field("memory_headroom_bytes", pa.float64()),
        pa.field("fullest_stage", pa.int64()),
        pa.field("fits", pa.bool_()),
        pa.field("stage_peak_memory_bytes", pa.list_(pa.float64())),
        pa.field("num_events", pa.int64(), nullable=False),
        pa.field("message", pa.string(), nullable=False),
    ]
)
"""Result columns (a public contract: add, never rename). NaN/null where not measured."""


_NULLABLE_DTYPES = {"fits": "boolean", "fullest_stage": "Int64"}


def fingerprint(spec: SweepSpec) -> str:
    """Hash of what every row depends on besides its layout (the model, the GPU count and
    the hardware profile; every parallel and training field is in the layout)."""
    inputs = {
        "model": spec.base.model.model_dump(mode="json"),
        "num_gpus": spec.num_gpus,
        "hardware": spec.hardware.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def rows_to_frame(rows: list[Row]) -> pd.DataFrame:
    """Rows -> a DataFrame with `SCHEMA`'s columns (nullable fits / fullest_stage)."""
    frame = pa.Table.from_pylist(rows, schema=SCHEMA).to_pandas()
    return frame.astype(_NULLABLE_DTYPES)


def sort_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Deterministic order: by layout (tp, pp, dp, vpp, ...; enums in declaration order)."""
    if table.empty:
        return table.reset_index(drop=True)

    def rank(column: pd.Series) -> pd.Series:
        order = choice_order(str(column.name))
        return column if order is None else column.map(order)

    ordered = table.sort_values(list(LAYOUT_COLUMNS), key=rank, kind="stable")
    return ordered.reset_index(drop=True)


def _write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(temporary)
    os.replace(temporary, path)


class ResultStore:
    """Rows kept in memory and flushed to `out` (and `csv`) at most every `flush_every_s`,
    but no sooner than ten times the last flush took (rewriting a large table must not slow
    the sweep by more than about a tenth); `flush_every_s = 0` flushes every batch."""

    def __init__(
        self, out: Path, spec: SweepSpec, csv: Path | None = None, flush_every_s: float = 2.0
    ) -> None:
        self.out, self.csv, self.flush_every_s = Path(out), csv, flush_every_s
        self.fingerprint = fingerprint(spec)
        self.frame = rows_to_frame([])
        self.pending: list[Row] = []
        self._last_flush_s = time.monotonic()
        self._flush_cost_s = 0.0

    def resume(self) -> set[str]:
        """Load the rows already in `out` (if any); return their configuration ids."""
        if not self.out.exists():
            return set()
        metadata = pq.read_schema(self.out).metadata or {}
        found = json.loads(metadata.get(METADATA_KEY, b"{}")).get("fingerprint")
        if found != self.fingerprint:
            raise ConfigError(
                self.out,
                [
                    f"--resume: written by a sweep with other inputs (fingerprint {found}, this "
                    f"sweep {self.fingerprint}): model, num_gpus or hardware profile differ; "
                    "write to a new --out"
                ],
            )
        self.frame = rows_to_frame(pq.read_table(self.out).to_pylist())
        return set(self.frame["config_id"])

    def add(self, rows: list[Row]) -> None:
        self.pending.extend(rows)
        interval_s = max(self.flush_every_s, 10 * self._flush_cost_s) if self.flush_every_s > 0 else 0.0
        if time.monotonic() - self._last_flush_s >= interval_s:
            self.flush()

    def table(self) -> pd.DataFrame:
        """Every row so far, sorted."""
        if self.pending:
            self.frame = sort_rows(pd.concat([self.frame, rows_to_frame(self.pending)], ignore_index=True))
            self.pending = []
        return self.frame

    def flush(self) -> None:
        """Rewrite the output with every row so far (sorted), atomically."""
        start_s = time.monotonic()
        frame = self.table()
        table = pa.Table.from_pandas(frame, schema=SCHEMA, preserve_index=False)
        metadata = {
            **(table.schema.metadata or {}),
            METADATA_KEY: json.dumps({"fingerprint": self.fingerprint}),
        }
        table = table.replace_schema_metadata(metadata)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(self.out, lambda path: pq.write_table(table, path))
        if self.csv is not None:
            _write_atomically(self.csv, lambda path: frame.to_csv(path, index=False))
        self._last_flush_s = time.monotonic()
        self._flush_cost_s = self._last_flush_s - start_s
