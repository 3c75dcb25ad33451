"""What a sweep may write and resume from: never one of its inputs, an existing file only
with --resume (this sweep's table) or --force (and it says what it replaced), one
sweep at a time per output (a lock), resumes only a table of the same inputs (the whole base
scenario included), and a garbage table or nothing valid to run is one clear error."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config.errors import ConfigError
from simcluster.sweep import execute_sweep, run_sweep
from simcluster.sweep.lock import SweepLock, lock_path

runner = CliRunner()
ONE = {"tp": [1, 2]}  # two valid configurations: a sweep of a second or so


def _sweep(spec: Path, out: Path, *extra: str):
    args = ["sweep", str(spec), "--out", str(out), "--workers", "1", "--no-progress", *extra]
    return runner.invoke(app, args)


def _files(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


# --- what --out may overwrite ------------------------------------------------------------


def test_out_equal_to_the_spec_is_refused_and_the_spec_kept(write_sweep):
    spec = write_sweep(ONE)
    before = spec.read_text()
    for extra in ((), ("--resume",)):
        result = _sweep(spec, spec, *extra)
        assert result.exit_code == 2, result.output
        assert str(spec) in result.output and "--out" in result.output
        assert spec.read_text() == before


@pytest.mark.parametrize("name", ["scenarios/tiny.yaml", "scenarios/gpu.yaml", "scenarios/../sweep.yaml"])
def test_an_input_is_never_the_output_even_with_force(write_sweep, tmp_path, name):
    """The base scenario, its profile or the spec (spelt another way) as --out: exit 2
    naming it as an input, even with --force; the file untouched, nothing else written."""
    spec = write_sweep(ONE)
    target = tmp_path / name
    before, files = target.read_bytes(), _files(tmp_path / "scenarios")
    for extra in ((), ("--force",)):
        result = _sweep(spec, target, *extra)
        assert result.exit_code == 2, result.output
        assert f"{target}: --out: is an input of this command" in result.output
        assert "even with --force" in result.output
    assert target.read_bytes() == before and _files(tmp_path / "scenarios") == files


def test_a_plain_parquet_file_is_not_a_sweep_table(write_sweep, tmp_path):
    """Parquet without the sweep's metadata (someone's data) is refused too."""
    out = tmp_path / "data.parquet"
    pd.DataFrame({"x": [1, 2]}).to_parquet(out)
    result = _sweep(write_sweep(ONE), out)
    assert result.exit_code == 2 and "is not a sweep table" in result.output
    assert list(pd.read_parquet(out)["x"]) == [1, 2]


def test_an_earlier_sweep_table_is_replaced_only_with_force_and_says_so(write_sweep, tmp_path):
    """A fresh sweep (no --resume) over an earlier sweep's table: refused naming --force and
    --resume, the table kept; with --force it is replaced and the sweep prints what it
    replaced (its rows, and which input differs)."""
    out = tmp_path / "out.parquet"
    run_sweep(write_sweep({"tp": [1, 2, 4]}, memory_gb=40.0), out, workers=1, progress=False)
    before = pd.read_parquet(out)
    refused = _sweep(write_sweep(ONE), out)
    assert refused.exit_code == 2, refused.output
    assert f"{out}: --out: exists (an earlier sweep's table of {len(before)} rows" in refused.output
    assert "--resume to continue" in refused.output and "add --force to replace it" in refused.output
    pd.testing.assert_frame_equal(pd.read_parquet(out), before)
    replaced = _sweep(write_sweep(ONE), out, "--force")
    assert replaced.exit_code == 0, replaced.output
    assert len(pd.read_parquet(out)) == 2
    assert (
        f"replaced {out}: an earlier sweep's table of {len(before)} rows, from other inputs "
        "(the hardware profile gpu.yaml differs)" in replaced.stderr
    )


def test_out_folder_is_one_clear_error(write_sweep, tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    result = _sweep(write_sweep(ONE), folder)
    assert result.exit_code == 2 and f"{folder}: --out: is a folder" in result.output
    assert list(folder.iterdir()) == []


def test_csv_twin_that_is_not_a_sweep_table_is_refused(write_sweep, tmp_path):
    spec, out = write_sweep(ONE), tmp_path / "out.parquet"
    other = tmp_path / "out.csv"
    other.write_text("name,value\nkeep,1\n")
    result = _sweep(spec, out, "--csv")
    assert result.exit_code == 2 and f"{other}: --csv: exists (not a sweep table" in result.output
    assert other.read_text() == "name,value\nkeep,1\n" and not out.exists()
    for extra in ("--resume", "--force"):  # resume keeps only a sweep's CSV twin; force replaces
        result = _sweep(spec, out, "--csv", extra)
        assert result.exit_code == (2 if extra == "--resume" else 0), result.output
    assert other.read_text().startswith("config_id,")


def test_csv_twin_equal_to_out_is_refused(write_sweep, tmp_path):
    out = tmp_path / "out.csv"
    result = _sweep(write_sweep(ONE), out, "--csv")
    assert result.exit_code == 2 and "the CSV twin would be --out itself" in result.output
    assert not out.exists()


# --- one sweep at a time -----------------------------------------------------------------


def test_a_second_sweep_on_a_locked_output_is_refused(write_sweep, tmp_path):
    """While a live process holds the lock (this one, as the first sweep would), a second
    sweep exits 2 naming it, and writes nothing."""
    out = tmp_path / "out.parquet"
    with SweepLock(out):
        result = _sweep(write_sweep(ONE), out, "--resume")
        assert result.exit_code == 2, result.output
        assert f"another sweep (pid {os.getpid()}) is writing this table" in result.output
        assert not out.exists()
    assert not lock_path(out).exists()


def test_a_lock_held_by_another_process_is_refused_until_it_is_killed(write_sweep, tmp_path):
    """A sweep running elsewhere (another process holding the lock): the second sweep is
    refused naming its pid; once that process is killed (SIGKILL: no clean-up), its lock file
    is left behind but no longer blocks."""
    out, spec = tmp_path / "out.parquet", write_sweep(ONE)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from simcluster.sweep.lock import SweepLock\n"
         f"SweepLock({str(out)!r}).acquire(); print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(ConfigError, match=f"another sweep \\(pid {holder.pid}\\)"):
            execute_sweep(spec, out, workers=1, progress=False, resume=True)
        assert not out.exists()
    finally:
        holder.kill()
        holder.communicate()
    assert lock_path(out).read_text() == f"{holder.pid}\n"
    assert execute_sweep(spec, out, workers=1, progress=False, resume=True).num_run == 2
    assert not lock_path(out).exists()


def test_a_stale_lock_from_a_killed_sweep_does_not_block(write_sweep, tmp_path):
    """A lock file left by a killed sweep (its pid in it, nobody holding it) is taken over."""
    out = tmp_path / "out.parquet"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock_path(out).write_text(f"{dead.pid}\n")
    outcome = execute_sweep(write_sweep(ONE), out, workers=1, progress=False)
    assert outcome.num_run == 2 and len(pd.read_parquet(out)) == 2
    assert _files(tmp_path) == ["out.parquet", "scenarios", "sweep.yaml"]


def test_the_lock_is_held_while_rows_arrive_and_released_after_an_interrupt(write_sweep, tmp_path):
    out = tmp_path / "out.parquet"
    seen: list[bool] = []

    def probe(row):
        with open(lock_path(out)) as file:  # a second open file description: flock conflicts
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                seen.append(True)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        execute_sweep(write_sweep(ONE), out, workers=1, progress=False, on_row=probe)
    assert seen == [True] and not lock_path(out).exists()
    assert len(pd.read_parquet(out)) == 1


# --- what --resume accepts ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [("training", "dtype", "fp16"), ("training", "global_batch_size", 16), ("model", "vocab_size", 51200)],
)
def test_resume_refuses_a_changed_base_field_that_is_not_an_axis(
    write_sweep, tmp_path, section, field, value
):
    """Changing the base (not an axis) would leave the old rows beside the new: refused, the
    table unchanged, and the message says the base scenario differs."""
    spec, out = write_sweep(ONE), tmp_path / "out.parquet"
    run_sweep(spec, out, workers=1, progress=False)
    before = pd.read_parquet(out)
    base = tmp_path / "scenarios" / "tiny.yaml"
    data = yaml.safe_load(base.read_text())
    data[section][field] = value
    base.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"\(the base scenario tiny differs;"):
        execute_sweep(spec, out, workers=1, progress=False, resume=True)
    pd.testing.assert_frame_equal(pd.read_parquet(out), before)


def test_resume_names_the_hardware_profile_when_it_changed(write_sweep, tmp_path):
    out = tmp_path / "out.parquet"
    run_sweep(write_sweep(ONE), out, workers=1, progress=False)
    with pytest.raises(ConfigError, match=r"\(the hardware profile gpu.yaml differs;"):
        execute_sweep(write_sweep(ONE, memory_gb=40.0), out, workers=1, progress=False, resume=True)


@pytest.mark.parametrize(
    "content",
    [b"", b"not parquet at all\n", b"PAR1" + b"\0" * 64 + b"PAR1"],
    ids=["empty", "text", "bad-footer"],
)
def test_resume_from_a_garbage_file_is_one_clear_error(write_sweep, tmp_path, content):
    """No ArrowInvalid traceback: exit 2 naming the file, and the file left as it was."""
    out = tmp_path / "out.parquet"
    out.write_bytes(content)
    result = _sweep(write_sweep(ONE), out, "--resume")
    assert result.exit_code == 2, result.output
    assert f"{out}: invalid configuration" in result.output
    assert "--resume: not a simcluster sweep table" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert out.read_bytes() == content


@pytest.mark.parametrize("damage", ["drop status", "null status"])
def test_resume_from_a_damaged_sweep_table_is_one_clear_error(write_sweep, tmp_path, damage):
    """The sweep's metadata but a column missing or null where none is allowed: exit 2
    before anything runs, not a pyarrow traceback at the first flush."""
    spec, out = write_sweep(ONE), tmp_path / "out.parquet"
    run_sweep(spec, out, workers=1, progress=False)
    table = pq.read_table(out)
    metadata = table.schema.metadata
    if damage == "drop status":
        table = table.drop_columns(["status"])
    else:
        table = table.set_column(
            table.column_names.index("status"), "status", pa.array([None] * table.num_rows, pa.string())
        )
    pq.write_table(table.replace_schema_metadata(metadata), out)
    damaged = out.read_bytes()
    result = _sweep(spec, out, "--resume")
    assert result.exit_code == 2, result.output
    assert f"{out}: invalid configuration" in result.output
    assert "--resume: the table cannot be read back" in result.output
    assert out.read_bytes() == damaged


# --- nothing to run ----------------------------------------------------------------------


def test_zero_valid_configurations_exit_2_with_the_reasons(write_sweep, tmp_path):
    """3 GPUs for tp, pp in {1, 2} and a batch of 8: nothing valid; say why, write nothing."""
    spec, out = write_sweep({"tp": [1, 2], "pp": [1, 2]}, num_gpus=3), tmp_path / "out.parquet"
    result = _sweep(spec, out)
    assert result.exit_code == 2, result.output
    assert "none of the 4 combinations is a valid configuration on num_gpus 3" in result.output
    assert "num_gpus: value 3: not divisible by tp * pp (2) (3 of 4 combinations)" in result.output
    assert "training.global_batch_size: value 8: must be a multiple" in result.output
    assert not out.exists() and not lock_path(out).exists()
