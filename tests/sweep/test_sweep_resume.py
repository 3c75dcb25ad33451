"""Interruption and resume: a sweep stopped halfway and resumed gives the same final table
as one that ran through; resume refuses a file written from other inputs."""

from __future__ import annotations

import os

import pandas as pd
import pyarrow.parquet as pq
import pytest
from sweep_cases import SMALL_NUM_VALID

from simcluster.config.errors import ConfigError
from simcluster.sweep import execute_sweep, run_sweep
from simcluster.sweep.store import ResultStore, parts_folder


def _interrupt_after(count: int):
    seen: list[str] = []

    def hook(row):
        seen.append(row["config_id"])
        if len(seen) == count:
            raise KeyboardInterrupt

    return hook


@pytest.mark.parametrize("workers", [1, 2])
def test_killed_halfway_and_resumed_equals_uninterrupted(write_sweep, tmp_path, workers):
    """Stop after 7 rows (Ctrl-C), resume: same Parquet table as an uninterrupted sweep, and
    the resumed run evaluates only the configurations that were missing."""
    spec = write_sweep(memory_gb=2.0)
    whole = run_sweep(spec, tmp_path / "whole.parquet", workers=1, progress=False)
    out = tmp_path / "resumed.parquet"
    with pytest.raises(KeyboardInterrupt):
        execute_sweep(spec, out, workers=workers, progress=False, on_row=_interrupt_after(7))
    saved = len(pd.read_parquet(out))
    # in process one configuration at a time; a pool's batch that finished is kept whole
    assert saved == 7 if workers == 1 else 7 <= saved < SMALL_NUM_VALID
    resumed = execute_sweep(spec, out, workers=1, progress=False, resume=True)
    assert (resumed.num_resumed, resumed.num_run) == (saved, SMALL_NUM_VALID - saved)
    pd.testing.assert_frame_equal(pd.read_parquet(out), pd.read_parquet(tmp_path / "whole.parquet"))
    pd.testing.assert_frame_equal(resumed.table, whole)


def test_resume_of_a_finished_sweep_runs_nothing(write_sweep, tmp_path):
    """Everything is already in the output: nothing is evaluated, the table is unchanged."""
    spec, out = write_sweep(), tmp_path / "out.parquet"
    first = run_sweep(spec, out, workers=1, progress=False)
    again = execute_sweep(spec, out, workers=1, progress=False, resume=True)
    assert again.num_run == 0
    pd.testing.assert_frame_equal(again.table, first)


def test_resume_extends_a_sweep_with_new_axis_values(write_sweep, tmp_path):
    """Adding recompute = selective to a finished sweep runs only the new configurations;
    the result equals sweeping all three at once."""
    out, together = tmp_path / "out.parquet", tmp_path / "together.parquet"
    axes = {"tp": [1, 2], "recompute": ["none", "full"]}
    run_sweep(write_sweep(axes), out, workers=1, progress=False)
    axes["recompute"] = ["none", "selective", "full"]
    extended = execute_sweep(write_sweep(axes), out, workers=1, progress=False, resume=True)
    assert (extended.num_resumed, extended.num_run) == (4, 2)
    pd.testing.assert_frame_equal(
        extended.table, run_sweep(write_sweep(axes), together, workers=1, progress=False)
    )


def test_resume_refuses_output_from_other_inputs(write_sweep, tmp_path):
    """Another GPU memory size means other rows: resuming into that file is an error."""
    out = tmp_path / "out.parquet"
    run_sweep(write_sweep({"tp": [1]}), out, workers=1, progress=False)
    with pytest.raises(ConfigError, match="--resume: written by a sweep with other inputs"):
        run_sweep(write_sweep({"tp": [1]}, memory_gb=40.0), out, workers=1, progress=False, resume=True)


# --- the layout on disk: a flush writes its batch as a new part, never earlier rows ------


def _parts(out):
    folder = parts_folder(out)
    if not folder.is_dir():
        return {}
    return {path.name: os.stat(path) for path in sorted(folder.iterdir())}


def test_a_flush_writes_only_its_batch_and_success_leaves_one_file(write_sweep, tmp_path):
    """Flushing every batch (one row each, in process): each flush adds one part holding that
    row; earlier parts keep their inode, size and mtime (not rewritten), and `out` is not
    touched until the end. Afterwards: only `out`, no parts, no temporary or lock file."""
    spec, out = write_sweep(memory_gb=2.0), tmp_path / "out.parquet"
    before = os.stat(out) if out.exists() else None
    seen: list[dict[str, os.stat_result]] = []

    def hook(row):
        parts = _parts(out)
        assert all(name.startswith("part-") for name in parts)  # no temporary left behind
        assert len(parts) == len(seen) + 1
        newest = max(parts)
        assert pq.read_table(parts_folder(out) / newest).column("config_id").to_pylist() == [row["config_id"]]
        for name, stat in (seen[-1] if seen else {}).items():
            now = parts[name]
            assert (now.st_ino, now.st_size, now.st_mtime_ns) == (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        seen.append(parts)
        if len(seen) == 1:
            nonlocal before
            before = os.stat(out)  # the fresh sweep's empty table, written at the start
        else:
            assert os.stat(out).st_mtime_ns == before.st_mtime_ns

    outcome = execute_sweep(spec, out, workers=1, progress=False, flush_every_s=0, on_row=hook)
    assert len(seen) == SMALL_NUM_VALID
    assert not parts_folder(out).exists()
    assert sorted(path.name for path in tmp_path.iterdir() if "out" in path.name) == ["out.parquet"]
    pd.testing.assert_frame_equal(pd.read_parquet(out), outcome.table)


def test_killed_outright_resume_reads_the_parts(write_sweep, tmp_path, monkeypatch):
    """A sweep killed without its final combine (SIGKILL) leaves `out` as it started plus
    one part per flush, and maybe a temporary part: `--resume` keeps every flushed row,
    continues, and ends with the uninterrupted table and no parts or temporary files."""
    spec = write_sweep(memory_gb=2.0)
    whole = run_sweep(spec, tmp_path / "whole.parquet", workers=1, progress=False)
    out = tmp_path / "killed.parquet"
    monkeypatch.setattr(ResultStore, "finish", ResultStore.flush)  # no combine: as if killed
    with pytest.raises(KeyboardInterrupt):
        execute_sweep(spec, out, workers=1, progress=False, flush_every_s=0, on_row=_interrupt_after(7))
    monkeypatch.undo()
    assert len(pd.read_parquet(out)) == 0 and len(_parts(out)) == 7
    (parts_folder(out) / f".part-000007.parquet.{os.getpid()}.tmp").write_bytes(b"PAR1 cut short")
    resumed = execute_sweep(spec, out, workers=1, progress=False, resume=True)
    assert (resumed.num_resumed, resumed.num_run) == (7, SMALL_NUM_VALID - 7)
    pd.testing.assert_frame_equal(pd.read_parquet(out), pd.read_parquet(tmp_path / "whole.parquet"))
    pd.testing.assert_frame_equal(resumed.table, whole)
    assert not parts_folder(out).exists()
    assert sorted(path.name for path in tmp_path.iterdir() if "killed" in path.name) == ["killed.parquet"]


def test_resume_refuses_parts_from_other_inputs(write_sweep, tmp_path, monkeypatch):
    """Parts a killed sweep of other inputs left are refused like its table."""
    out = tmp_path / "out.parquet"
    monkeypatch.setattr(ResultStore, "finish", ResultStore.flush)
    run_sweep(write_sweep({"tp": [1]}), out, workers=1, progress=False)
    monkeypatch.undo()
    out.unlink()
    assert _parts(out)
    with pytest.raises(ConfigError, match="--resume: written by a sweep with other inputs"):
        run_sweep(write_sweep({"tp": [1]}, memory_gb=40.0), out, workers=1, progress=False, resume=True)
