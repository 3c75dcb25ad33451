"""Interruption and resume: a sweep stopped halfway and resumed gives the same final table
as one that ran through; resume refuses a file written from other inputs."""

from __future__ import annotations

import pandas as pd
import pytest
from sweep_cases import SMALL_NUM_VALID

from simcluster.config.errors import ConfigError
from simcluster.sweep import execute_sweep, run_sweep


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
