"""`simcluster plan`: the table and JSON answer, and one clear error (exit 2) per bad input."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config.megatron_args import parse_megatron_args
from tests.paths import ROOT
from tests.plan.plan_world import TINY

CANDIDATE_KEYS = {
    "scenario", "iteration_time_s", "mfu", "tokens_per_s_per_gpu", "peak_memory_bytes",
    "capacity_bytes", "megatron_args",
}  # fmt: skip
TOP_KEYS = {"candidates", "searched", "pruned_memory", "pruned_bound", "simulated", "elapsed_s"}


@pytest.fixture
def tiny_file(tmp_path):
    """A plan input without a layout (plan searches it)."""
    data = {key: value for key, value in TINY.items() if key != "parallel"}
    data["training"] = {"global_batch_size": 16}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _plan(*args):
    return CliRunner().invoke(app, ["plan", *map(str, args), "--no-progress"])


def test_json_has_the_contract_keys_and_flags_that_import_back(tiny_file):
    """--json: the issue's keys; each candidate's megatron_args imports to its scenario."""
    result = _plan(tiny_file, "--gpus", 8, "--top", 3, "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert TOP_KEYS <= payload.keys()
    assert len(payload["candidates"]) == 3
    assert payload["searched"] == payload["pruned_memory"] + payload["pruned_bound"] + payload["simulated"]
    for candidate in payload["candidates"]:
        assert CANDIDATE_KEYS <= candidate.keys()
        scenario = candidate["scenario"]
        assert {"name", "hardware", "model", "parallel", "training"} <= scenario.keys()
        imported = parse_megatron_args(candidate["megatron_args"], scenario["hardware"], scenario["name"])
        assert imported.validated().model_dump(mode="json") == scenario
        assert candidate["peak_memory_bytes"] <= 0.9 * candidate["capacity_bytes"]
    times = [c["iteration_time_s"] for c in payload["candidates"]]
    assert times == sorted(times)


def test_table_shows_what_differs_and_the_winners_flags(tiny_file):
    """The table has a column for each parameter that differs, and the winner's launch line."""
    result = _plan(tiny_file, "--gpus", 8, "--top", 6)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("#"))
    assert all(label in header for label in ("iteration", "MFU %", "tokens/s/GPU", "headroom GB"))
    assert "Megatron-LM:" in result.stdout
    assert lines[-1].startswith("torchrun ") and "pretrain_gpt.py" in lines[-1]
    payload = json.loads(_plan(tiny_file, "--gpus", 8, "--top", 6, "--json").stdout)
    varying = {
        key
        for section in ("parallel", "training")
        for key in payload["candidates"][0]["scenario"][section]
        if len({json.dumps(c["scenario"][section][key]) for c in payload["candidates"]}) > 1
    }
    labels = {"micro_batch_size": "mbs", "sequence_parallel": "sp", "use_distributed_optimizer": "dist-opt",
              "overlap_grad_reduce": "overlap-grad"}  # fmt: skip
    assert varying, "the tiny world's top 6 should differ in something"
    for key in varying:
        assert labels.get(key, key) in header.split()
    assert "tp" not in varying or "tp" in header.split()


@pytest.mark.parametrize("headroom", ["1", "1.5", "-0.1"])
def test_headroom_outside_zero_one_is_an_error(tiny_file, headroom):
    """--headroom must be in [0, 1): exit 2 naming the option, the value and the range."""
    result = _plan(tiny_file, "--gpus", 8, "--headroom", headroom)
    assert result.exit_code == 2
    assert "--headroom: value" in result.stderr and "below 1" in result.stderr


def test_gpu_count_no_layout_can_use_is_an_error(tiny_file):
    """7 GPUs: no tp·pp·dp = 7 for 8 heads and a batch of 16; says why and what is near."""
    result = _plan(tiny_file, "--gpus", 7)
    assert result.exit_code == 2
    assert "--gpus: value 7" in result.stderr
    assert "num_attention_heads (8)" in result.stderr and "global_batch_size (16)" in result.stderr
    assert "usable counts near it: 4 or 8" in result.stderr  # powers of two only


def test_model_that_fits_nowhere_names_the_smallest_memory(tiny_file, tmp_path):
    """A device too small for every layout: exit 2 with the smallest peak and its layout."""
    profile = yaml.safe_load((ROOT / "hwprofiles" / "a100-sxm4-80gb.yaml").read_text())
    profile["gpu"]["memory_gb"] = 0.01
    profile["gpu"]["memory_capacity_mib"] = 0.01 * 1e9 / 2**20  # what plan fills: no reserve here
    for key in ("cuda_context_mib", "nccl_buffers_mib"):
        del profile["gpu"][key], profile["gpu"]["sources"][key]
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump(profile))
    result = _plan(tiny_file, "--gpus", 8, "--hardware", str(small))
    assert result.exit_code == 2
    assert "no layout fits in 0.0 GB" in result.stderr
    assert "the smallest peak is" in result.stderr and "tp " in result.stderr and "pp " in result.stderr


def test_gpu_count_error_names_the_cp_values_searched(tiny_file):
    """Flash attention at sequence 384: cp takes the divisors of 192 up to 8, so 6 GPUs
    (tp 1 · cp 3 · dp 2) are usable and named next to 7, and plan --gpus 6 finds cp 3.
    Unfused, the same error says cp was not searched and why, and 6 is not usable."""
    data = yaml.safe_load(tiny_file.read_text())
    data["model"]["seq_length"] = 384
    data["training"]["attention_backend"] = "flash"
    tiny_file.write_text(yaml.safe_dump(data))
    h100 = ("--hardware", "h100-sxm5-80gb")
    result = _plan(tiny_file, "--gpus", 7, *h100)
    assert result.exit_code == 2
    assert "tp * cp * pp * dp" in result.stderr
    assert "cp one of 1, 2, 3, 4, 6, 8 (context parallelism, with flash attention" in result.stderr
    assert "usable counts near it: 6 or 8" in result.stderr
    six = json.loads(_plan(tiny_file, "--gpus", 6, *h100, "--top", 1, "--json").stdout)
    assert six["candidates"][0]["scenario"]["parallel"]["cp"] == 3
    data["training"]["attention_backend"] = "unfused"
    tiny_file.write_text(yaml.safe_dump(data))
    unfused = _plan(tiny_file, "--gpus", 7, *h100)
    assert unfused.exit_code == 2
    error = unfused.stderr
    assert "cp 1 (context parallelism is searched only with training.attention_backend flash" in error
    assert "this scenario's is unfused" in error and "usable counts near it: 4 or 8" in error


def test_gpu_count_error_names_the_pp_the_uneven_split_accepts():
    """Llama 3 405B (126 layers, both account-for flags) on 16,383 GPUs: the pp values are
    the split's (powers of two: 128 counted layers), not the divisors of 126, and 16,384
    is the usable count near it."""
    result = _plan(ROOT / "scenarios" / "modern" / "llama3-405b-h100-16k.yaml", "--gpus", 16383)
    assert result.exit_code == 2
    assert "pp one of 1, 2, 4, 8, 16, 32, 64 (the pipeline split of num_layers (126) with " in result.stderr
    assert "account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split" in result.stderr
    assert "usable counts near it: 16384" in result.stderr
