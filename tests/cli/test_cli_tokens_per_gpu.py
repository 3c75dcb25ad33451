"""`run --json` adds tokens_per_s_per_gpu = global_batch_size · seq_length / iteration time / GPUs."""

import json

from typer.testing import CliRunner

from simcluster.cli import app
from tests.paths import ROOT


def test_tokens_per_s_per_gpu_in_json_and_table():
    path = ROOT / "scenarios" / "paper" / "gpt-22b-sp-selective.yaml"
    result = CliRunner().invoke(app, ["run", str(path), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    # gpt-22b-sp-selective: global batch 4 of 2,048 tokens on 8 GPUs
    tokens = 4 * 2048
    assert payload["num_gpus"] == 8
    expected = tokens / payload["iteration_time_s"] / payload["num_gpus"]
    assert abs(payload["tokens_per_s_per_gpu"] - expected) <= 1e-9 * expected
    table = CliRunner().invoke(app, ["run", str(path)])
    assert "tokens/s per GPU" in table.output
