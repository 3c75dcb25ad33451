"""`simcluster sweep`: a summary, the Parquet (and CSV) table, --top, --resume, clear errors."""

from __future__ import annotations

import pandas as pd
from sweep_cases import SMALL_NUM_VALID
from typer.testing import CliRunner

from simcluster.cli import app

runner = CliRunner()


def test_sweep_command_writes_the_table_and_prints_the_best(write_sweep, tmp_path):
    """Counts, the output path, the --top table; then --resume runs nothing. At the default
    headroom 0.1 (limit 1.8 GB), 5 of the 18 do not fit (see test_sweep_execute)."""
    spec, out = write_sweep(memory_gb=2.0), tmp_path / "out.parquet"
    args = ["sweep", str(spec), "--out", str(out), "--workers", "1", "--no-progress"]
    result = runner.invoke(app, [*args, "--csv", "--top", "3"])
    assert result.exit_code == 0, result.output
    assert "32 combinations: 18 valid, 14 invalid" in result.output
    assert "table: ok 13, oom 5 (fits: headroom 0.1 of usable memory)" in result.output
    assert "MFU %" in result.output and len(result.output.splitlines()) == 2 + 2 + 3
    assert len(pd.read_parquet(out)) == len(pd.read_csv(out.with_suffix(".csv"))) == SMALL_NUM_VALID
    again = runner.invoke(app, [*args, "--resume"])
    assert again.exit_code == 0 and f"ran 0 ({SMALL_NUM_VALID} already in" in again.output


def test_show_invalid_lists_the_loader_reasons(write_sweep, tmp_path):
    """--show-invalid prints each rejected combination with why."""
    spec = write_sweep({"tp": [1], "sequence_parallel": [True, False]})
    result = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o.parquet"), "--workers", "1",
                                 "--no-progress", "--show-invalid"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "sequence_parallel=true" in result.output and "needs tp > 1" in result.output


def test_bad_spec_exits_2_naming_the_field(write_sweep, tmp_path):
    """An unknown axis: exit code 2, the file, the field and the allowed axes on stderr."""
    spec = write_sweep({"tensor_parallel": [1, 2]})
    result = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o.parquet")])
    assert result.exit_code == 2
    assert (
        str(spec) in result.output and "axes.tensor_parallel: unknown axis; allowed: tp, pp" in result.output
    )


def test_interrupt_exits_130_with_a_resume_hint(write_sweep, tmp_path, monkeypatch):
    """Ctrl-C during the sweep: exit code 130 and how to go on."""
    import simcluster.sweep

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(simcluster.sweep, "execute_sweep", interrupted)
    result = runner.invoke(app, ["sweep", str(write_sweep()), "--out", str(tmp_path / "o.parquet")])
    assert result.exit_code == 130 and "run again with --resume" in result.output
