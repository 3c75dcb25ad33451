"""The public-run checks (`benchmarks/public_runs.py`): every published figure has its
scenario file and every file its figure, they all run, and the step-time conversion and
error summary are right. No accuracy is asserted: these runs are checks, not goals."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from simcluster.config.scenario import load_scenario_and_hardware

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("public_runs", ROOT / "benchmarks" / "public_runs.py")
assert SPEC is not None and SPEC.loader is not None
public_runs = importlib.util.module_from_spec(SPEC)
sys.modules.setdefault("public_runs", public_runs)  # its dataclasses look their module up
SPEC.loader.exec_module(public_runs)


def test_every_published_figure_has_its_file_and_every_file_a_figure():
    """A layout published by several sources is one file with one figure per source."""
    files = {path.stem for path in (ROOT / "benchmarks" / "public_runs").glob("*.yaml")}
    named = [(run.file, run.source) for run in public_runs.PUBLISHED]
    assert len(named) == len(set(named)) and {file for file, _ in named} == files
    for run in public_runs.PUBLISHED:
        assert (run.tokens_per_s_per_gpu is None) != (run.step_s is None), run.file
        scenario, _ = load_scenario_and_hardware(ROOT / "benchmarks" / "public_runs" / f"{run.file}.yaml")
        assert scenario.name == run.file


def test_rows_convert_throughput_to_step_time_and_run_every_file():
    """NeMo's tokens/s/GPU = GBS · seq / (step · GPUs): the Llama 3 8B NeMo 24.12 row (GBS 128,
    seq 8192, 8 GPUs, 12,273 tokens/s/GPU) is a 10.680 s step."""
    rows = {(row["file"], row["source"]): row for row in public_runs.rows()}
    assert len(rows) == len(public_runs.PUBLISHED)
    assert rows["nemo24.12-llama3-8b-h100-fp8", "NeMo 24.12 summary"]["published_step_s"] == pytest.approx(
        128 * 8192 / (12273 * 8), abs=1e-4
    )
    nemo = rows["nemo24.12-llama3-8b-h100-fp8", "NeMo 24.12 summary"]
    same_file = rows["nemo24.12-llama3-8b-h100-fp8", "dgxc-benchmarking 24.12 (8f5cbb37)"]
    assert same_file["published_step_s"] == 9.44
    assert same_file["predicted_step_s"] == nemo["predicted_step_s"]
    assert rows["dgxc-llama3.1-405b-gb200-bf16", "dgxc-benchmarking example"]["published_step_s"] == 9.479
    bf16 = rows["dgxc24.12-llama3.1-8b-h100-bf16", "dgxc-benchmarking 24.12 (8f5cbb37)"]
    assert (bf16["dtype"], bf16["cp"], same_file["dtype"]) == ("bf16", 2, "fp8")
    for row in rows.values():
        assert row["predicted_step_s"] > 0
        expected = 100 * (row["predicted_step_s"] - row["published_step_s"]) / row["published_step_s"]
        assert row["error_pct"] == pytest.approx(expected, abs=0.01)


def test_summary_groups_by_gpu_family():
    table = [
        {"hardware": "h100-sxm5-80gb", "error_pct": -10.0},
        {"hardware": "h100-sxm5-80gb", "error_pct": 4.0},
        {"hardware": "b200-sxm-180gb", "error_pct": -20.0},
    ]
    assert public_runs.summary(table) == {
        "H100": {"runs": 2, "mean_abs_error_pct": 7.0, "mean_error_pct": -3.0},
        "Blackwell": {"runs": 1, "mean_abs_error_pct": 20.0, "mean_error_pct": -20.0},
    }


def test_summary_splits_each_family_by_dtype_or_cp():
    table = [
        {"hardware": "h100-sxm5-80gb", "dtype": "bf16", "cp": 2, "error_pct": -10.0},
        {"hardware": "h100-sxm5-80gb", "dtype": "fp8", "cp": 2, "error_pct": 4.0},
        {"hardware": "gb200-nvl72", "dtype": "fp8", "cp": 1, "error_pct": -20.0},
    ]
    assert public_runs.summary(table, by="dtype") == {
        "H100 dtype bf16": {"runs": 1, "mean_abs_error_pct": 10.0, "mean_error_pct": -10.0},
        "H100 dtype fp8": {"runs": 1, "mean_abs_error_pct": 4.0, "mean_error_pct": 4.0},
        "Blackwell dtype fp8": {"runs": 1, "mean_abs_error_pct": 20.0, "mean_error_pct": -20.0},
    }
    assert public_runs.summary(table, by="cp") == {
        "H100 cp 2": {"runs": 2, "mean_abs_error_pct": 7.0, "mean_error_pct": -3.0},
        "Blackwell cp 1": {"runs": 1, "mean_abs_error_pct": 20.0, "mean_error_pct": -20.0},
    }


def test_moe_runs_are_summarised_apart_from_the_dense_ones():
    """A MoE row goes to "MoE <family>" (the dense H100 / Blackwell means keep only dense runs)
    and, with `by="model"`, to its model and family; dense rows stay out of the model split."""
    table = [
        {"hardware": "h100-sxm5-80gb", "cp": 1, "error_pct": -10.0, "moe": False, "model": None},
        {"hardware": "h100-sxm5-80gb", "cp": 1, "error_pct": 20.0, "moe": True, "model": "DeepSeek-V3"},
        {"hardware": "gb200-nvl72", "cp": 1, "error_pct": -30.0, "moe": True, "model": "DeepSeek-V3"},
        {"hardware": "b200-sxm-180gb", "cp": 1, "error_pct": -10.0, "moe": True, "model": "DeepSeek-V3"},
    ]
    assert public_runs.summary(table) == {
        "H100": {"runs": 1, "mean_abs_error_pct": 10.0, "mean_error_pct": -10.0},
        "MoE H100": {"runs": 1, "mean_abs_error_pct": 20.0, "mean_error_pct": 20.0},
        "MoE Blackwell": {"runs": 2, "mean_abs_error_pct": 20.0, "mean_error_pct": -20.0},
    }
    assert public_runs.summary(table, by="model") == {
        "MoE DeepSeek-V3 H100": {"runs": 1, "mean_abs_error_pct": 20.0, "mean_error_pct": 20.0},
        "MoE DeepSeek-V3 Blackwell": {"runs": 2, "mean_abs_error_pct": 20.0, "mean_error_pct": -20.0},
    }
    assert set(public_runs.summary(table, by="cp")) == {"H100 cp 1", "MoE H100 cp 1", "MoE Blackwell cp 1"}


def test_every_moe_file_names_its_model_and_every_dense_file_none():
    """The MoE rows are the files whose scenario has `model.moe`; each names one of the MoE
    models, and a file name naming none is refused."""
    rows = public_runs.rows()
    moe = {row["file"]: row["model"] for row in rows if row["moe"]}
    assert set(moe.values()) >= {"DeepSeek-V3", "Qwen3-30B-A3B", "Qwen3-235B-A22B", "gpt-oss-120b"}
    assert all(row["model"] is None for row in rows if not row["moe"])
    assert moe["bridge26.04-qwen3-30b-a3b-h100-fp8cs"] == "Qwen3-30B-A3B"
    assert public_runs.moe_model("bridge26.04-gpt-oss-120b-b200-bf16") == "gpt-oss-120b"
    with pytest.raises(ValueError, match="names none of the MoE models"):
        public_runs.moe_model("bridge26.04-llama3-70b-gb200-mxfp8")


def test_every_moe_file_header_pins_its_source_and_recipe():
    """Each MoE file says where its figure and its settings come from (the summary page with
    its commit, the recipe preset with its commit) and what the contract cannot express; the
    DeepSeek-V3 files (MLA) carry the recipe's pipeline layout string for the key that
    replaces their stand-in split."""
    for run in {run.file for run in public_runs.PUBLISHED}:
        path = ROOT / "benchmarks" / "public_runs" / f"{run}.yaml"
        scenario, _ = load_scenario_and_hardware(path)
        if scenario.model.moe is None:
            continue
        header = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#"))
        # a performance summary, or a Megatron-Bridge guide page at a pinned commit
        source = r"performance[-_]summary|Megatron-Bridge/docs/training/[\w-]+\.md @[0-9a-f]{40}"
        assert re.search(source, header), run
        pinned = r"Settings, NVIDIA(-NeMo)?/(Megatron-Bridge|NeMo) @(v[\d.]+(rc\d+)? \()?[0-9a-f]{40}[,) ]"
        assert re.search(pinned, header), run
        assert "Not expressible:" in header, run
        assert ("# pipeline_layout: " in header) == (scenario.model.mla is not None), run
