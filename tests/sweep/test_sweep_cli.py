"""`simcluster sweep`: a summary, the Parquet (and CSV) table, --top, --resume, clear errors."""

from __future__ import annotations

import pandas as pd
import pytest
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
    assert "ranked by MFU (one hardware profile)" in result.output
    assert "MFU %" in result.output and len(result.output.splitlines()) == 2 + 1 + 2 + 3 + 3  # + the flags
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
    """Ctrl-C once rows have finished: exit code 130, how many rows are in the table, and
    how to go on."""
    import simcluster.sweep
    from simcluster.sweep.run import execute_sweep

    def interrupted_after_one_row(*args, **kwargs):
        def stop(row):
            raise KeyboardInterrupt

        return execute_sweep(*args, **{**kwargs, "on_row": stop})

    monkeypatch.setattr(simcluster.sweep, "execute_sweep", interrupted_after_one_row)
    out = tmp_path / "o.parquet"
    result = runner.invoke(app, ["sweep", str(write_sweep()), "--out", str(out), "--workers", "1"])
    assert result.exit_code == 130, result.output
    rows = len(pd.read_parquet(out))
    assert rows >= 1 and f"interrupted: the {rows} finished rows are in {out}; run again with --resume" in (
        result.output
    )


def test_interrupt_in_the_first_seconds_claims_no_rows(write_sweep, tmp_path, monkeypatch):
    """Ctrl-C while the spec is still loading: exit 130, no table is written, and the
    message says so instead of pointing at a file that does not exist."""
    import simcluster.sweep.run

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(simcluster.sweep.run, "load_sweep_spec", interrupted)
    out = tmp_path / "o.parquet"
    result = runner.invoke(app, ["sweep", str(write_sweep()), "--out", str(out)])
    assert result.exit_code == 130, result.output
    assert f"interrupted before the sweep started: nothing was written to {out}" in result.output
    assert "finished rows" not in result.output and not out.exists()


def test_top_shows_every_swept_axis(write_sweep, tmp_path):
    """The distributed optimizer swept on and off: a dist-opt column tells the two rows
    apart (before, they printed identical); an axis not swept is not a column."""
    spec = write_sweep({"tp": [2], "use_distributed_optimizer": [False, True]})
    result = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "o.parquet"), "--workers", "1",
                                 "--no-progress", "--top", "2"])  # fmt: skip
    assert result.exit_code == 0, result.output
    header, _, *rows = result.output.splitlines()[3:-3]  # the ranking, the table, the winner's flags
    assert header.split()[:4] == ["tp", "pp", "dp", "dist-opt"] and "recompute" not in header
    assert sorted(row.split()[3] for row in rows) == ["no", "yes"]


def test_json_is_the_summary_and_the_best_rows(write_sweep, tmp_path):
    """--json: valid JSON (no NaN), the counts, the headroom, the swept axes and every column
    of the best rows; nothing else on stdout."""
    import json

    spec, out = write_sweep(memory_gb=2.0), tmp_path / "o.parquet"
    result = runner.invoke(app, ["sweep", str(spec), "--out", str(out), "--workers", "1", "--no-progress",
                                 "--json", "--top", "3", "--headroom", "0"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout, parse_constant=lambda name: pytest.fail(f"{name} in JSON"))
    assert (data["num_combinations"], data["num_valid"], data["num_invalid"]) == (32, SMALL_NUM_VALID, 14)
    assert data["status_counts"] == {"ok": 14, "oom": 4} and data["headroom_fraction"] == 0.0
    assert data["swept_axes"] == ["tp", "pp", "dp", "vpp", "sequence_parallel", "recompute"]
    columns = {*pd.read_parquet(out).columns, "megatron_args", "tokens_per_s_per_gpu"}
    assert len(data["top"]) == 3 and columns == set(data["top"][0]) and data["ranked_by"] == "mfu"
    mfus = [row["mfu"] for row in data["top"]]
    assert mfus == sorted(mfus, reverse=True) and all(row["fits"] for row in data["top"])


def test_json_rows_turn_nan_into_null(write_sweep, tmp_path):
    """An oom row (no iteration time, no MFU) as JSON: null, and json.dumps(allow_nan=False) works."""
    import json

    from simcluster.sweep import run_sweep
    from simcluster.sweep.summary import row_json

    table = run_sweep(write_sweep(memory_gb=2.0), tmp_path / "o.parquet", workers=1, progress=False)
    row = row_json(table[table["status"] == "oom"].iloc[0])
    assert row["mfu"] is None and row["iteration_time_s"] is None and isinstance(row["fits"], bool)
    assert isinstance(row["stage_peak_memory_bytes"], list) and json.dumps(row, allow_nan=False)


def test_headroom_option_is_checked_like_plans(write_sweep, tmp_path):
    """--headroom 1: exit 2 with plan's message; nothing written."""
    out = tmp_path / "o.parquet"
    result = runner.invoke(app, ["sweep", str(write_sweep()), "--out", str(out), "--headroom", "1"])
    assert result.exit_code == 2
    assert "--headroom: value 1.0: must be at least 0 and below 1" in result.output and not out.exists()
