"""Sweep results on disk: one Parquet file (and optionally a CSV twin) rewritten atomically
(write a temporary file, then rename) every few seconds as rows arrive, so the output is
always one complete, readable table and an interrupted sweep loses only rows that had not
been flushed. The file's metadata records a fingerprint of the sweep's inputs (each whole
base scenario, the GPU count, each hardware profile's content, the memory headroom):
`--resume` refuses a file from other inputs, and a fresh sweep overwrites only a file that
is a sweep table. It also records the (tp, pp) cells the loader rejected outright, so a
heatmap can tell "invalid" from "does not fit".
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from simcluster.config.errors import ConfigError
from simcluster.headroom import DEFAULT_HEADROOM_FRACTION
from simcluster.output_files import OutputPathError, check_output_file, write_atomically
from simcluster.sweep.axes import AXES, LAYOUT_COLUMNS, MODEL_COLUMN, choice_order
from simcluster.sweep.evaluate import Row
from simcluster.sweep.spec import SweepSpec

METADATA_KEY = b"simcluster.sweep"


def _arrow_type(column: str) -> pa.DataType:
    axis = AXES.get(column)
    if axis is None:
        return pa.string() if column == MODEL_COLUMN else pa.int64()  # dp
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
        pa.field("capacity_bytes", pa.float64()),  # usable: driver capacity less CUDA/NCCL reserve
        pa.field("headroom_fraction", pa.float64()),  # fits: peak <= (1 - headroom) * capacity
    ]
)
"""Result columns (a public contract: add, never rename). NaN/null where not measured."""


_NULLABLE_DTYPES = {"fits": "boolean", "fullest_stage": "Int64"}


def _digest(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


SHARED_INPUTS = ("num_gpus", "headroom_fraction")
"""Inputs every row of a table shares: a resumed table must have been written with them."""


def input_digests(spec: SweepSpec, headroom_fraction: float = DEFAULT_HEADROOM_FRACTION) -> dict[str, str]:
    """A hash of each input rows depend on besides their layout: each whole resolved base
    scenario by name (not only the model: a base field that is not an axis, say dtype,
    changes every row's id, and resuming would keep the old rows beside the new), the GPU
    count, each hardware profile's content by reference (not only its name), and the
    memory headroom (it decides `fits`). The axes are not inputs: resuming with more axis
    values, another base or another profile extends the table."""
    return {
        **{f"base scenario {base.name}": _digest(base.model_dump(mode="json")) for base in spec.bases},
        "num_gpus": _digest(spec.num_gpus),
        **{f"hardware profile {ref}": _digest(p.model_dump(mode="json")) for ref, p in spec.profiles.items()},
        "headroom_fraction": _digest(headroom_fraction),
    }


def fingerprint(spec: SweepSpec, headroom_fraction: float = DEFAULT_HEADROOM_FRACTION) -> str:
    """One hash of `input_digests`: equal for two sweeps of the same inputs."""
    return _digest(input_digests(spec, headroom_fraction))


def differing_inputs(found: dict[str, Any], digests: dict[str, str]) -> list[str] | None:
    """The inputs a table's metadata `found` records otherwise than `digests` (a base, a
    profile, the GPU count, the headroom); None if it predates per-input digests or lacks
    one every row shares. Inputs only one side has (a new base or profile) do not differ."""
    parts = found.get("inputs")
    if not isinstance(parts, dict) or any(name not in parts for name in SHARED_INPUTS):
        return None
    return [name for name, digest in digests.items() if name in parts and parts[name] != digest]


def read_metadata(path: Path) -> dict[str, Any] | None:
    """The sweep metadata of the Parquet file at `path`; None if it is not a sweep table
    (not Parquet, unreadable, or Parquet written by something else)."""
    try:
        metadata = pq.read_schema(path).metadata or {}
        found = json.loads(metadata[METADATA_KEY])
    except (OSError, pa.ArrowException, KeyError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _differing(names: list[str] | None) -> str:
    if names is None:
        return "written before simcluster recorded each input with the headroom"
    return f"the {' and the '.join(names)} {'differs' if len(names) == 1 else 'differ'}"


def _is_sweep_csv(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as file:
            return file.readline().startswith(f"{SCHEMA.names[0]},")
    except (OSError, UnicodeDecodeError):
        return False


def check_targets(out: Path, csv: Path | None, spec: SweepSpec, resume: bool) -> None:
    """Before any work: `out` (and `csv`) can be written, and writing them destroys nothing
    but an earlier sweep's table. With `resume`, `ResultStore.resume` checks that an existing
    `out` is a table of this sweep."""
    check_output_file(out, "--out")
    if out.resolve() == spec.source.resolve():
        raise OutputPathError(out, "--out", "is the sweep spec itself; give a new file, e.g. results.parquet")
    if not resume and out.exists() and read_metadata(out) is None:
        raise OutputPathError(
            out, "--out", "exists and is not a sweep table (Parquet with simcluster's sweep metadata); "
            "refusing to overwrite it: give a new file, or delete it first",
        )  # fmt: skip
    if csv is None:
        return
    if csv.resolve() == out.resolve():
        raise OutputPathError(out, "--csv", "the CSV twin would be --out itself; give --out a .parquet name")
    check_output_file(csv, "--csv")
    if csv.exists() and not _is_sweep_csv(csv):
        raise OutputPathError(
            csv, "--csv", "exists and is not a sweep table (its header does not start with config_id); "
            "refusing to overwrite it: give another --out, or delete it first",
        )  # fmt: skip


def rows_to_frame(rows: list[Row]) -> pd.DataFrame:
    """Rows -> a DataFrame with `SCHEMA`'s columns (nullable fits / fullest_stage)."""
    frame = pa.Table.from_pylist(rows, schema=SCHEMA).to_pandas()
    return frame.astype(_NULLABLE_DTYPES)


def sort_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Deterministic order: by model, then layout (tp, pp, dp, vpp, ...; enums in
    declaration order)."""
    if table.empty:
        return table.reset_index(drop=True)

    def rank(column: pd.Series) -> pd.Series:
        order = choice_order(str(column.name))
        return column if order is None else column.map(order)

    columns = [MODEL_COLUMN, *(column for column in LAYOUT_COLUMNS if column != MODEL_COLUMN)]
    ordered = table.sort_values(columns, key=rank, kind="stable")
    return ordered.reset_index(drop=True)


class ResultStore:
    """Rows kept in memory and flushed to `out` (and `csv`) at most every `flush_every_s`,
    but no sooner than ten times the last flush took (rewriting a large table must not slow
    the sweep by more than about a tenth); `flush_every_s = 0` flushes every batch."""

    def __init__(
        self,
        out: Path,
        spec: SweepSpec,
        csv: Path | None = None,
        flush_every_s: float = 2.0,
        headroom_fraction: float = DEFAULT_HEADROOM_FRACTION,
        extra_metadata: dict[str, Any] | None = None,
    ) -> None:
        self.out, self.csv, self.flush_every_s = Path(out), csv, flush_every_s
        self.spec = spec
        self.inputs = input_digests(spec, headroom_fraction)
        self.fingerprint = fingerprint(spec, headroom_fraction)
        self.extra_metadata = extra_metadata or {}
        self.frame = rows_to_frame([])
        self.pending: list[Row] = []
        self._last_flush_s = time.monotonic()
        self._flush_cost_s = 0.0

    def resume(self) -> set[str]:
        """Load the rows already in `out` (if any); return their configuration ids."""
        if not self.out.exists():
            return set()
        found = read_metadata(self.out)
        if found is None:
            raise ConfigError(
                self.out,
                ["--resume: not a simcluster sweep table (not Parquet, or no sweep metadata); "
                 "resume needs the --out of an earlier sweep, or give a new --out"],
            )  # fmt: skip
        differing = differing_inputs(found, self.inputs)
        if differing != []:
            raise ConfigError(
                self.out,
                [
                    f"--resume: written by a sweep with other inputs ({_differing(differing)}; "
                    f"fingerprint {found.get('fingerprint')}, this sweep {self.fingerprint}): its rows "
                    "would mix with this sweep's; write to a new --out, or drop --resume to start over"
                ],
            )
        try:
            self.frame = self._read_back()
        except (OSError, pa.ArrowException, KeyError, ValueError, TypeError) as error:
            message = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
            raise ConfigError(
                self.out, [f"--resume: the table cannot be read back ({message}); give a new --out"]
            ) from None
        return set(self.frame["config_id"])

    def _read_back(self) -> pd.DataFrame:
        """The rows in `out`, checked to convert back to `SCHEMA` as `flush` will write them
        (a column missing or null where none is allowed fails here, not at the first flush)."""
        table = pq.read_table(self.out)
        missing = [name for name in SCHEMA.names if name not in table.column_names]
        if missing:
            raise ValueError(f"missing columns: {', '.join(missing)}")
        frame = rows_to_frame(table.to_pylist())
        pa.Table.from_pandas(frame, schema=SCHEMA, preserve_index=False)
        return frame

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
            METADATA_KEY: json.dumps(
                {"fingerprint": self.fingerprint, "inputs": self.inputs, **self.extra_metadata}
            ),
        }
        table = table.replace_schema_metadata(metadata)
        write_atomically(self.out, lambda path: pq.write_table(table, path))
        if self.csv is not None:
            write_atomically(self.csv, lambda path: frame.to_csv(path, index=False))
        self._last_flush_s = time.monotonic()
        self._flush_cost_s = self._last_flush_s - start_s
