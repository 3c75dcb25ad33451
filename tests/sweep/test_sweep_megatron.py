"""A sweep's winner as a Megatron-LM launch line: `--top` prints it after the table, `--json`
rows carry it as `megatron_args`, and `import-megatron` reads it back to the same layout."""

from __future__ import annotations

import json

import yaml
from sweep_cases import TINY_SCENARIO
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config.megatron_args import parse_megatron_args
from simcluster.sweep import expand, load_sweep_spec

runner = CliRunner()


def _sweep(spec, out, *args):
    args = ["sweep", str(spec), "--out", str(out), "--workers", "1", "--no-progress", *args]
    return runner.invoke(app, args)


def _round_trips(spec_path, rows) -> None:
    """Each row's megatron_args imports to exactly its configuration's scenario."""
    configs = {config.config_id: config for config in expand(load_sweep_spec(spec_path)).configs}
    for row in rows:
        scenario = configs[row["config_id"]].scenario
        imported = parse_megatron_args(row["megatron_args"], scenario.hardware, scenario.name)
        assert imported.validated() == scenario, row["config_id"]


def test_json_rows_carry_flags_that_import_back_to_the_layout(write_sweep, tmp_path):
    """Every fitting row of the small spec (tp, pp, vpp, sp, recompute vary) round-trips."""
    spec = write_sweep()
    result = _sweep(spec, tmp_path / "o.parquet", "--json", "--top", "18")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["top"]
    assert len(rows) == 18 and {row["vpp"] for row in rows} == {1, 2}
    assert all(row["megatron_args"].startswith("torchrun ") for row in rows)
    _round_trips(spec, rows)


def test_top_table_ends_with_the_winners_flags(write_sweep, tmp_path):
    """--top: after the table, the first row's launch line, the same string as --json's."""
    spec, out = write_sweep(), tmp_path / "o.parquet"
    text = _sweep(spec, out, "--top", "3")
    assert text.exit_code == 0, text.output
    *_, label, line = text.output.splitlines()
    assert label == "Megatron-LM (the first row):"
    winner = json.loads(_sweep(spec, out, "--resume", "--json", "--top", "1").stdout)["top"][0]
    assert line == winner["megatron_args"]


def test_a_gpipe_winner_has_no_launch_line(write_sweep, tmp_path):
    """Megatron-LM has no GPipe schedule: the text says why, the JSON has null."""
    spec, out = write_sweep({"tp": [2], "schedule": ["gpipe"]}), tmp_path / "o.parquet"
    text = _sweep(spec, out, "--top", "1")
    assert text.exit_code == 0, text.output
    assert "Megatron-LM: the first row cannot be launched: training.schedule: value 'gpipe'" in text.output
    rows = json.loads(_sweep(spec, out, "--resume", "--json").stdout)["top"]
    assert rows and all(row["megatron_args"] is None for row in rows)


def test_uneven_405b_style_split_round_trips(tmp_path):
    """126 layers with both account-for flags on pp 16 × vpp 8 (Llama 3 405B's split, a
    narrow model on 16 GPUs): the sweep runs it and its flags import back with the flags and
    --num-virtual-stages-per-pipeline-rank 8."""
    from tests.paths import ROOT

    (tmp_path / "gpu.yaml").write_text((ROOT / "hwprofiles" / "h100-sxm5-80gb.yaml").read_text())
    base = {
        **TINY_SCENARIO,
        "name": "uneven",
        "model": {**TINY_SCENARIO["model"], "num_layers": 126, "hidden_size": 256},
        "parallel": {"tp": 1, "pp": 16, "vpp": 8, "account_for_embedding_in_pipeline_split": True,
                     "account_for_loss_in_pipeline_split": True},
        "training": {"micro_batch_size": 1, "global_batch_size": 16},
    }  # fmt: skip
    (tmp_path / "uneven.yaml").write_text(yaml.safe_dump(base))
    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump({"base": "uneven.yaml", "num_gpus": 16, "axes": {"pp": [16], "vpp": [8]}}))
    result = _sweep(spec, tmp_path / "o.parquet", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["top"]
    assert (row["pp"], row["vpp"], row["dp"]) == (16, 8, 1)
    flags = row["megatron_args"].split()
    assert {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"} <= set(flags)
    assert flags[flags.index("--num-virtual-stages-per-pipeline-rank") + 1] == "8"
    _round_trips(spec, [row])


def test_a_winner_resumed_from_wider_axes_still_gets_its_flags(write_sweep, tmp_path):
    """Resume keeps an earlier run's rows (same inputs, other axes): a winner outside this
    spec's expansion is rebuilt from its layout, and its flags still import back to it."""
    spec, out = write_sweep(), tmp_path / "o.parquet"
    wide = json.loads(_sweep(spec, out, "--json", "--top", "1").stdout)["top"][0]
    data = yaml.safe_load(spec.read_text())
    data["axes"] = {"tp": [3 - wide["tp"]], "pp": [1]}  # tp 1 or 2: not the wide winner's
    narrow = tmp_path / "narrow.yaml"
    narrow.write_text(yaml.safe_dump(data))
    text = _sweep(narrow, out, "--resume", "--top", "1")
    assert text.exit_code == 0, text.output
    assert text.output.splitlines()[-1] == wide["megatron_args"]
    again = json.loads(_sweep(narrow, out, "--resume", "--json", "--top", "1").stdout)["top"][0]
    assert again["config_id"] == wide["config_id"] and again["megatron_args"] == wide["megatron_args"]
    _round_trips(spec, [again])
