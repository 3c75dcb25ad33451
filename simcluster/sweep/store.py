"""Sweep results on disk: one Parquet file `OUT` (and optionally a CSV twin), written so that
a flush costs the batch, not the table. Each flush writes only the rows that arrived since
the last one, as one small, complete Parquet file `OUT.parts/part-NNNNNN.parquet` (written to
a temporary name and renamed, so every part is readable with its footer); earlier parts are
never touched. When the sweep stops (done, failed or Ctrl-C), the parts are combined with the
rows already in `OUT` into one sorted table, written atomically over `OUT` (CSV twin too),
and `OUT.parts/` is removed. A sweep killed outright (SIGKILL, power loss) leaves `OUT` as it
was plus the parts: `--resume` reads both (a row found twice, killed between the combine and
the removal, is kept once), combines them into `OUT` at once and continues, so at most the
rows of the batch in flight are lost. (One ParquetWriter appending row groups to a single
open file would be unreadable until closed: its footer is written last.)

The file's metadata (each part's too) records a fingerprint of the sweep's inputs (each
whole base scenario, the GPU count, each hardware profile's content, the memory headroom):
`--resume` refuses a file or part from other inputs. A fresh sweep never overwrites a file
unless told to (`force`, the CLI's `--force`; the rule of `simcluster.output_files`), and
then says what it replaced (an earlier sweep's table, of the same inputs or not, or another
file); it discards parts left by a killed one. It also records the
(tp, pp) cells the loader rejected outright, so a heatmap can tell "invalid" from "does not
fit".
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from simcluster.config.errors import ConfigError
from simcluster.headroom import DEFAULT_HEADROOM_FRACTION
from simcluster.output_files import (
    OutputPathError,
    check_output_file,
    refuse_existing,
    write_atomically,
)
from simcluster.sweep.axes import AXES, EXPERT_AXIS_DEFAULTS, LAYOUT_COLUMNS, MODEL_COLUMN, choice_order
from simcluster.sweep.evaluate import Row
from simcluster.sweep.expand import config_id
from simcluster.sweep.spec import SweepSpec

METADATA_KEY = b"simcluster.sweep"
PART_GLOB = "part-*.parquet"


def parts_folder(out: Path) -> Path:
    """Where the flushes of a sweep writing `out` go until they are combined into `out`."""
    return out.with_name(f"{out.name}.parts")


def _arrow_type(column: str) -> pa.DataType:
    axis = AXES.get(column)
    if axis is None:
        return pa.string() if column == MODEL_COLUMN else pa.int64()  # dp
    return pa.bool_() if axis.kind is bool else pa.int64() if axis.kind is int else pa.string()


SCHEMA = pa.schema(
    [pa.field("config_id", pa.string(), nullable=False)]
    + [pa.field(column, _arrow_type(column), nullable=column == "etp") for column in LAYOUT_COLUMNS]
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


_NULLABLE_DTYPES = {"fits": "boolean", "fullest_stage": "Int64", "etp": "Int64"}  # etp null = tp


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


def describe_table(path: Path, digests: dict[str, str]) -> str:
    """What the file at `path` is, for a message about replacing it: an earlier sweep's
    table (its rows, and whether it came from this sweep's inputs) or another file."""
    found = read_metadata(path)
    if found is None:
        return "a file that is not a sweep table"
    try:
        rows = f" of {pq.read_metadata(path).num_rows} rows"
    except (OSError, pa.ArrowException):
        rows = ""
    differing = differing_inputs(found, digests)
    inputs = "the same inputs as this sweep" if differing == [] else f"other inputs ({_differing(differing)})"
    return f"an earlier sweep's table{rows}, from {inputs}"


def check_targets(
    out: Path,
    csv: Path | None,
    spec: SweepSpec,
    resume: bool,
    force: bool = False,
    headroom_fraction: float = DEFAULT_HEADROOM_FRACTION,
) -> str | None:
    """Before any work: `out` (and `csv`) can be written under the rule of
    `simcluster.output_files`: never an input of the sweep (the spec, a base, a profile);
    an existing file only with `resume` (`ResultStore.resume` then checks it is a table of
    this sweep) or `force`. Returns what a fresh sweep will replace, for the user, or None."""
    inputs = spec.input_files or (spec.source,)
    check_output_file(out, "--out", force=True, inputs=inputs)
    replaced = None
    if not resume and os.path.lexists(out):
        what = describe_table(out, input_digests(spec, headroom_fraction))
        refuse_existing(out, "--out", force, f"exists ({what})", ", --resume to continue this sweep's table")
        replaced = f"replaced {out}: {what}"
    if csv is None:
        return replaced
    if csv.resolve() == out.resolve():
        raise OutputPathError(out, "--csv", "the CSV twin would be --out itself; give --out a .parquet name")
    check_output_file(csv, "--csv", force=True, inputs=inputs)
    if os.path.lexists(csv) and not (resume and _is_sweep_csv(csv)):
        what = (
            "a sweep table"
            if _is_sweep_csv(csv)
            else "not a sweep table (its header does not start with config_id)"
        )
        refuse_existing(csv, "--csv", force, f"exists ({what})")
        replaced = f"{replaced + '; ' if replaced else ''}replaced {csv}: {what}"
    return replaced


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
    """Rows kept in memory and flushed to part files (see the module) at most every
    `flush_every_s`, but no sooner than ten times the last flush took; `flush_every_s = 0`
    flushes every batch. `finish` combines the parts into `out` (and `csv`)."""

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
        self.parts = parts_folder(self.out)
        self.spec = spec
        self.inputs = input_digests(spec, headroom_fraction)
        self.fingerprint = fingerprint(spec, headroom_fraction)
        self.extra_metadata = extra_metadata or {}
        self.frame = rows_to_frame([])
        self.pending: list[Row] = []
        self.unsorted: list[pd.DataFrame] = []  # flushed to parts, not yet in `frame`
        self.num_parts = 0
        self._last_flush_s = time.monotonic()
        self._flush_cost_s = 0.0

    def _metadata(self) -> dict[bytes, bytes]:
        return {
            METADATA_KEY: json.dumps(
                {"fingerprint": self.fingerprint, "inputs": self.inputs, **self.extra_metadata}
            ).encode()
        }

    def _part_files(self) -> list[Path]:
        return sorted(self.parts.glob(PART_GLOB)) if self.parts.is_dir() else []

    def discard_parts(self) -> None:
        """Remove the parts folder (a fresh sweep's start, or once combined into `out`):
        parts and any temporary file a killed flush left in it."""
        if not self.parts.is_dir():
            return
        for path in self.parts.iterdir():
            if path.name.startswith(("part-", ".part-")):
                path.unlink(missing_ok=True)
        try:
            self.parts.rmdir()
        except OSError:
            pass  # something else is in there: not ours to delete

    def start_fresh(self) -> None:
        """A sweep without `--resume`: discard parts a killed sweep left and replace `out`
        (an earlier sweep's table, checked by `check_targets`) with this sweep's empty table,
        so a kill now leaves nothing of the old rows for `--resume` to mix in."""
        self.discard_parts()
        self._write_out()

    def resume(self) -> set[str]:
        """Load the rows already in `out` and in parts a killed sweep left (if any), combine
        them into `out`; return their configuration ids."""
        sources = ([self.out] if self.out.exists() else []) + self._part_files()
        frames = [self._read_checked(path) for path in sources]
        if not frames:
            self.discard_parts()
            return set()
        combined = pd.concat([self.frame, *frames], ignore_index=True)
        self.frame = sort_rows(combined.drop_duplicates("config_id", keep="first"))
        if len(sources) > 1 or not self.out.exists():
            self._write_out()
        self.discard_parts()
        return set(self.frame["config_id"])

    def _read_checked(self, path: Path) -> pd.DataFrame:
        found = read_metadata(path)
        if found is None:
            raise ConfigError(
                path,
                ["--resume: not a simcluster sweep table (not Parquet, or no sweep metadata); "
                 "resume needs the --out of an earlier sweep, or give a new --out"],
            )  # fmt: skip
        differing = differing_inputs(found, self.inputs)
        if differing != []:
            raise ConfigError(
                path,
                [
                    f"--resume: written by a sweep with other inputs ({_differing(differing)}; "
                    f"fingerprint {found.get('fingerprint')}, this sweep {self.fingerprint}): its rows "
                    "would mix with this sweep's; write to a new --out, or drop --resume to start over"
                ],
            )
        try:
            return self._read_back(path)
        except (OSError, pa.ArrowException, KeyError, ValueError, TypeError) as error:
            message = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
            raise ConfigError(
                path, [f"--resume: the table cannot be read back ({message}); give a new --out"]
            ) from None

    def _read_back(self, path: Path) -> pd.DataFrame:
        """The rows in `path`, checked to convert back to `SCHEMA` as they will be written
        (a column missing or null where none is allowed fails here, not at the first flush)."""
        table = pq.read_table(path)
        rows = table.to_pylist()
        if not set(EXPERT_AXIS_DEFAULTS) & set(table.column_names):
            rows = self._with_expert_columns(rows)
        missing = [
            name
            for name in SCHEMA.names
            if name not in table.column_names and name not in EXPERT_AXIS_DEFAULTS
        ]
        if missing:
            raise ValueError(f"missing columns: {', '.join(missing)}")
        frame = rows_to_frame(rows)
        pa.Table.from_pandas(frame, schema=SCHEMA, preserve_index=False)
        return frame

    def _with_expert_columns(self, rows: list[Row]) -> list[Row]:
        """Rows of a table written before ep / etp were axes: each row's base's expert
        layout (the fingerprint says the bases are the same), its id made again from the
        completed layout (unchanged for a dense model, `config_id`)."""
        bases = {base.name: base.parallel for base in self.spec.bases}
        completed = []
        for row in rows:
            par = bases.get(row.get(MODEL_COLUMN, ""))
            row = {**row, "ep": par.ep if par else 1, "etp": par.etp if par else None}
            if all(column in row for column in LAYOUT_COLUMNS):
                row["config_id"] = config_id(row)
            completed.append(row)
        return completed

    def add(self, rows: list[Row]) -> None:
        self.pending.extend(rows)
        interval_s = max(self.flush_every_s, 10 * self._flush_cost_s) if self.flush_every_s > 0 else 0.0
        if time.monotonic() - self._last_flush_s >= interval_s:
            self.flush()

    def table(self) -> pd.DataFrame:
        """Every row so far, sorted."""
        new = self.unsorted + ([rows_to_frame(self.pending)] if self.pending else [])
        if new:
            self.frame = sort_rows(pd.concat([self.frame, *new], ignore_index=True))
            self.unsorted, self.pending = [], []
        return self.frame

    def flush(self) -> None:
        """Write the rows that arrived since the last flush as the next part file (atomically);
        nothing written earlier is read or rewritten."""
        if not self.pending:
            return
        start_s = time.monotonic()
        table = pa.Table.from_pylist(self.pending, schema=SCHEMA).replace_schema_metadata(self._metadata())
        self.parts.mkdir(parents=True, exist_ok=True)
        part = self.parts / f"part-{self.num_parts:06d}.parquet"
        write_atomically(part, lambda path: pq.write_table(table, path))
        self.num_parts += 1
        self.unsorted.append(rows_to_frame(self.pending))
        self.pending = []
        self._last_flush_s = time.monotonic()
        self._flush_cost_s = self._last_flush_s - start_s

    def _write_out(self) -> None:
        frame = self.table()
        table = pa.Table.from_pandas(frame, schema=SCHEMA, preserve_index=False)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **self._metadata()})
        write_atomically(self.out, lambda path: pq.write_table(table, path))
        if self.csv is not None:
            write_atomically(self.csv, lambda path: frame.to_csv(path, index=False))

    def finish(self) -> None:
        """Flush, combine every row (sorted) into `out` (and `csv`) atomically, remove the parts."""
        self.flush()
        self._write_out()
        self.discard_parts()
