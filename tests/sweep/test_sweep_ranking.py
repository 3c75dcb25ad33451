"""What `sweep --top` ranks by: MFU on one hardware profile, tokens/s per GPU when the
hardware varies (MFU divides by each GPU's own peak, so it does not rank speed across GPUs)."""

from __future__ import annotations

import json

import pandas as pd
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.sweep import best_rows
from simcluster.sweep.run import RANK_BY_MFU, RANK_BY_TOKENS, ranking

runner = CliRunner()


def _table(hardware: list[str], mfu: list[float], iteration_time_s: list[float]) -> pd.DataFrame:
    n = len(hardware)
    return pd.DataFrame(
        {
            "config_id": [f"c{i}" for i in range(n)],
            "hardware": hardware,
            "mfu": mfu,
            "iteration_time_s": iteration_time_s,
            "global_batch_size": [64] * n,
            "seq_length": [2048] * n,
            "num_gpus": [8] * n,
            "status": ["ok"] * n,
            "fits": [True] * n,
        }
    )


def test_hardware_that_varies_ranks_by_tokens_per_gpu():
    """An A100 row at 55 % MFU takes 2.8 s; an H100 row at 40 % takes 1.0 s: the H100 row
    leads (64·2048/1.0/8 = 16,384 tokens/s per GPU against 5,851)."""
    table = _table(["a100", "h100", "a100"], mfu=[0.55, 0.40, 0.50], iteration_time_s=[2.8, 1.0, 3.1])
    best, key = best_rows(table, 3)
    assert key == RANK_BY_TOKENS == ranking(table)
    assert list(best["config_id"]) == ["c1", "c0", "c2"]
    assert best["tokens_per_s_per_gpu"].iloc[0] == 64 * 2048 / 1.0 / 8


def test_one_hardware_ranks_by_mfu_and_skips_rows_that_do_not_fit():
    table = _table(["h100"] * 3, mfu=[0.40, 0.55, 0.50], iteration_time_s=[1.0, 0.8, 0.9])
    table.loc[1, "fits"] = False
    best, key = best_rows(table, 5)
    assert key == RANK_BY_MFU and list(best["config_id"]) == ["c2", "c0"]


def test_rows_that_do_not_fit_do_not_make_the_hardware_vary():
    """Only the fitting rows decide: an A100 row that ran out of memory leaves one profile."""
    table = _table(["h100", "a100", "h100"], mfu=[0.40, 0.55, 0.50], iteration_time_s=[1.0, 2.8, 0.9])
    table.loc[1, ["status", "fits"]] = ["oom", False]
    assert ranking(table) == RANK_BY_MFU


def test_cli_top_on_two_gpus_says_what_it_ranks_by(write_sweep, tmp_path):
    """A100 and H100 in one sweep: --top says it ranks by tokens/s per GPU and the rows are in
    that order; --json carries the same order and `ranked_by`."""
    spec = write_sweep({"tp": [1, 2], "hardware": ["a100-sxm4-80gb", "h100-sxm5-80gb"]})
    out = tmp_path / "o.parquet"
    args = ["sweep", str(spec), "--out", str(out), "--workers", "1", "--no-progress"]
    text = runner.invoke(app, [*args, "--top", "4"])
    assert text.exit_code == 0, text.output
    assert "ranked by tokens/s per GPU: the hardware differs between rows" in text.output
    data = json.loads(runner.invoke(app, [*args, "--resume", "--json", "--top", "4"]).stdout)
    assert data["ranked_by"] == "tokens_per_s_per_gpu"
    speeds = [row["tokens_per_s_per_gpu"] for row in data["top"]]
    assert len(speeds) == 4 and speeds == sorted(speeds, reverse=True)
    assert data["top"][0]["hardware"] == "h100-sxm5-80gb"
