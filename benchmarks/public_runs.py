"""Predicted against published step times of Megatron-core runs (issue 11's public checks).

    python benchmarks/public_runs.py            # table, means per GPU family
    python benchmarks/public_runs.py --json     # the same as JSON

Mixture-of-experts runs (a scenario with `model.moe`) are summarised apart from the dense ones,
as "MoE H100" / "MoE Blackwell" and per model and GPU family (docs/public_runs_moe.md), so the
dense means keep their meaning.

Each scenario in `benchmarks/public_runs/` describes one published run (its header names the
source and the settings read from the recipe); `PUBLISHED` below holds the published figure.
A step time given as tokens/s/GPU is GBS · seq / (tokens/s/GPU · GPUs), NeMo's definition.
These runs are checks: nothing in a hardware profile is fitted to them. The predictions are
deterministic, so `benchmarks/results/public_runs.json` records them with the commit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simcluster.config.scenario import load_scenario_and_hardware  # noqa: E402
from simcluster.simulation import run_simulation  # noqa: E402

RUNS = ROOT / "benchmarks" / "public_runs"
RESULTS = ROOT / "benchmarks" / "results" / "public_runs.json"


@dataclass(frozen=True)
class Published:
    file: str
    source: str
    tokens_per_s_per_gpu: float | None = None  # converted with the scenario's GBS, seq, GPUs
    step_s: float | None = None  # where the source gives the step time itself


PUBLISHED = (
    Published("nemo24.12-gpt3-175b-h100-fp8", "NeMo 24.12 summary", 716),
    Published("nemo24.12-gpt3-175b-512gpu-h100-fp8", "NeMo 24.12 summary", 825),
    Published("nemo24.12-nemotron4-340b-h100-fp8", "NeMo 24.12 summary", 326),
    Published("nemo24.12-llama3-8b-h100-fp8", "NeMo 24.12 summary", 12273),
    Published("nemo24.12-llama3-70b-h100-fp8", "NeMo 24.12 summary", 1524),
    Published("bridge25.11-llama3-70b-h100-fp8cs", "Megatron-Bridge 25.11", 1602),
    Published("bridge25.11-llama3.1-405b-h100-fp8cs", "Megatron-Bridge 25.11", 292),
    Published("bridge26.02-llama3-70b-h100-fp8", "Megatron-Bridge 26.02", 1621),
    Published("bridge26.02-llama3.1-405b-h100-fp8", "Megatron-Bridge 26.02", 311),
    Published("nemo25.07-llama3-8b-gb200-fp8cs", "NeMo 25.07 summary", 31737),
    Published("dgxc-llama3.1-405b-gb200-bf16", "dgxc-benchmarking example", step_s=9.479),
    Published("bridge25.11-llama3-8b-b200-fp8cs", "Megatron-Bridge 25.11", 30624),
    Published("bridge25.11-llama3-8b-b200-mxfp8", "Megatron-Bridge 25.11", 29521),
    Published("bridge25.11-llama3.1-405b-b200-fp8cs", "Megatron-Bridge 25.11", 661),
    Published("bridge25.11-llama3.1-405b-b200-mxfp8", "Megatron-Bridge 25.11", 624),
    Published("bridge25.11-llama3-8b-gb200-fp8cs", "Megatron-Bridge 25.11", 31508),
    Published("bridge25.11-llama3-8b-gb200-mxfp8", "Megatron-Bridge 25.11", 29789),
    Published("bridge25.11-llama3.1-405b-gb200-fp8cs", "Megatron-Bridge 25.11", 813),
    # Same layouts published again by other releases or by NVIDIA/dgxc-benchmarking (the file
    # header names the first source; these rows name theirs).
    Published("nemo24.12-llama3-8b-h100-fp8", "dgxc-benchmarking 24.12 (8f5cbb37)", step_s=9.44),
    Published("nemo24.12-llama3-70b-h100-fp8", "dgxc-benchmarking 24.12 (8f5cbb37)", step_s=10.46),
    Published("bridge25.11-llama3-70b-h100-fp8cs", "Megatron-Bridge 25.09", 1619),
    Published("bridge25.11-llama3.1-405b-h100-fp8cs", "Megatron-Bridge 25.09", 302),
    Published("bridge26.02-llama3-70b-h100-fp8", "Megatron-Bridge 26.04", 1633),
    Published("bridge26.02-llama3.1-405b-h100-fp8", "Megatron-Bridge 26.06", 326),
    # H100 BF16 and FP8 pairs of one layout, and CP-1 Llama 2 rows.
    Published("dgxc24.12-llama3.1-8b-h100-bf16", "dgxc-benchmarking 24.12 (8f5cbb37)", step_s=12.78),
    Published("dgxc24.12-llama3.1-70b-h100-bf16", "dgxc-benchmarking 24.12 (8f5cbb37)", step_s=14.61),
    Published("dgxc24.12-llama3.1-405b-h100-bf16", "dgxc-benchmarking 24.12 (8f5cbb37)", step_s=17.50),
    Published("dgxc24.12-llama3.1-405b-h100-fp8", "dgxc-benchmarking 24.12 (8f5cbb37)", step_s=11.00),
    Published("dgxc24.11-gpt3-175b-h100-bf16", "dgxc-benchmarking 24.11 (35a9aecc)", step_s=8.91),
    Published("dgxc24.11-gpt3-175b-h100-fp8", "dgxc-benchmarking 24.11 (35a9aecc)", step_s=5.92),
    Published("dgxc24.11-nemotron4-340b-h100-bf16", "dgxc-benchmarking 24.11 (35a9aecc)", step_s=4.61),
    Published("dgxc24.11-nemotron4-340b-h100-fp8", "dgxc-benchmarking 24.11 (35a9aecc)", step_s=3.16),
    Published("dgxc25.04-nemotron4-15b-h100-bf16", "dgxc-benchmarking 25.04 (1f6d9f40)", step_s=2.746),
    Published("dgxc25.04-nemotron4-15b-h100-fp8", "dgxc-benchmarking 25.04 (1f6d9f40)", step_s=1.988),
    Published("nemo24.09-llama2-7b-h100-fp8", "NeMo 24.09 summary", 16934),
    Published("nemo24.09-llama2-13b-h100-fp8", "NeMo 24.09 summary", 8715),
    Published("nemo24.09-llama2-70b-h100-fp8", "NeMo 24.09 summary", 1728),
    # Blackwell: the same layouts in other Megatron-Bridge releases (major releases only; 25.09
    # cells are FP8-CS, parenthesised FP8-MX), and layouts of their own.
    Published("bridge25.11-llama3-8b-b200-fp8cs", "Megatron-Bridge 25.09", 29994),
    Published("bridge25.11-llama3-8b-b200-mxfp8", "Megatron-Bridge 25.09", 29388),
    Published("bridge25.11-llama3.1-405b-b200-fp8cs", "Megatron-Bridge 25.09", 664),
    Published("bridge25.11-llama3.1-405b-b200-mxfp8", "Megatron-Bridge 25.09", 622),
    Published("bridge25.11-llama3.1-405b-gb200-fp8cs", "Megatron-Bridge 26.02", 793),
    Published("bridge25.11-llama3.1-405b-gb200-fp8cs", "Megatron-Bridge 26.04", 842),
    Published("bridge25.11-llama3.1-405b-gb200-fp8cs", "Megatron-Bridge 26.06", 843),
    Published("bridge25.09-llama3-70b-gb200-mxfp8", "Megatron-Bridge 25.09", 3546),
    Published("bridge26.04-llama3-70b-gb200-mxfp8", "Megatron-Bridge 26.04", 3828),
    Published("bridge25.09-llama3.1-405b-gb200-mxfp8", "Megatron-Bridge 25.09", 578),
    Published("bridge26.02-llama3.1-405b-gb200-mxfp8", "Megatron-Bridge 26.02", 786),
    Published("bridge26.02-llama3.1-405b-gb200-mxfp8", "Megatron-Bridge 26.04", 793),
    Published("bridge26.02-llama3.1-405b-gb200-mxfp8", "Megatron-Bridge 26.06", 783),
    Published("nemo25.02-gpt3-175b-b200-fp8", "NeMo 25.02 summary", 1600),
    Published("nemo25.02-llama3.1-405b-b200-fp8", "NeMo 25.02 summary", 625),
    Published("nemo25.04-llama3.1-405b-gb200-fp8cs", "NeMo 25.04 summary", 665),
    # Mixture of experts: Megatron-Bridge performance summaries (docs/public_runs_moe.md); the
    # file header names the release whose recipe it follows, these rows name each release that
    # published the same layout.
    Published("bridge26.04-qwen3-30b-a3b-h100-fp8cs", "Megatron-Bridge 26.04", 8901),
    Published("bridge26.04-qwen3-30b-a3b-h100-fp8cs", "Megatron-Bridge 26.04.01", 8960),
    Published("bridge26.04-qwen3-30b-a3b-h100-fp8cs", "Megatron-Bridge 26.06", 8826),
    Published("bridge26.04-qwen3-235b-a22b-h100-fp8cs", "Megatron-Bridge 26.04", 1686),
    Published("bridge26.04-qwen3-235b-a22b-h100-fp8cs", "Megatron-Bridge 26.04.01", 1712),
    Published("bridge26.04-qwen3-235b-a22b-h100-fp8cs", "Megatron-Bridge 26.02", 1633),
    Published("bridge26.04-qwen3-235b-a22b-h100-fp8cs", "Megatron-Bridge 26.02.01", 1611),
    Published("bridge26.04-gpt-oss-120b-h100-bf16", "Megatron-Bridge 26.04", 5810),
    Published("bridge26.04-gpt-oss-120b-h100-bf16", "Megatron-Bridge 26.04.01", 5824),
    Published("bridge26.04-gpt-oss-120b-h100-bf16", "Megatron-Bridge 26.02", 5993),
    Published("bridge26.04-gpt-oss-120b-h100-bf16", "Megatron-Bridge 26.02.01", 5984),
    Published("bridge26.04-deepseek-v3-gb200-mxfp8", "Megatron-Bridge 26.04", 4193),
    Published("bridge26.04-deepseek-v3-gb200-mxfp8", "Megatron-Bridge 26.04.01", 4256),
    Published("bridge26.04-deepseek-v3-gb200-mxfp8", "Megatron-Bridge 26.02", 3955),
    Published("bridge26.04-deepseek-v3-b200-mxfp8", "Megatron-Bridge 26.04", 2815),
    Published("bridge26.04-deepseek-v3-b200-mxfp8", "Megatron-Bridge 26.02", 2689),
    Published("bridge26.04-gpt-oss-120b-gb200-bf16", "Megatron-Bridge 26.04", 15938),
    Published("bridge26.04-gpt-oss-120b-gb200-bf16", "Megatron-Bridge 26.04.01", 16640),
    Published("bridge26.04-gpt-oss-120b-gb200-bf16", "Megatron-Bridge 26.02", 15784),
    Published("bridge26.04-gpt-oss-120b-b200-bf16", "Megatron-Bridge 26.04", 13045),
    Published("bridge26.04-gpt-oss-120b-b200-bf16", "Megatron-Bridge 26.04.01", 13568),
    Published("bridge26.04-qwen3-30b-a3b-gb200-mxfp8", "Megatron-Bridge 26.04", 26032),
    Published("bridge26.04-qwen3-30b-a3b-gb200-mxfp8", "Megatron-Bridge 26.04.01", 26112),
    Published("bridge26.04-qwen3-30b-a3b-gb200-mxfp8", "Megatron-Bridge 26.02", 26084),
    Published("bridge26.04-qwen3-30b-a3b-b200-mxfp8", "Megatron-Bridge 26.04", 26859),
    Published("bridge26.04-qwen3-30b-a3b-b200-mxfp8", "Megatron-Bridge 26.04.01", 27136),
    Published("bridge26.04-qwen3-235b-a22b-gb200-mxfp8", "Megatron-Bridge 26.04", 5672),
    Published("bridge26.04-qwen3-235b-a22b-gb200-mxfp8", "Megatron-Bridge 26.04.01", 5680),
    Published("bridge26.04-qwen3-235b-a22b-b200-mxfp8", "Megatron-Bridge 26.04.01", 3776),
    Published("bridge26.04-qwen3-235b-a22b-b200-mxfp8", "Megatron-Bridge 26.02", 3805),
    Published("bridge26.04-deepseek-v3-gb300-mxfp8", "Megatron-Bridge 26.04", 4965),
    Published("bridge26.04-deepseek-v3-gb300-mxfp8", "Megatron-Bridge 26.04.01", 4992),
    Published("bridge26.04-deepseek-v3-gb300-mxfp8", "Megatron-Bridge 26.02", 4612),
    Published("bridge26.04-qwen3-30b-a3b-gb300-mxfp8", "Megatron-Bridge 26.04", 31470),
    Published("bridge26.04-qwen3-30b-a3b-gb300-mxfp8", "Megatron-Bridge 26.04.01", 31744),
    Published("bridge26.04-qwen3-30b-a3b-gb300-mxfp8", "Megatron-Bridge 26.02", 30376),
    Published("bridge26.04-qwen3-235b-a22b-gb300-mxfp8", "Megatron-Bridge 26.04", 6994),
    Published("bridge26.04-qwen3-235b-a22b-gb300-mxfp8", "Megatron-Bridge 26.04.01", 6944),
    Published("bridge26.04-gpt-oss-120b-gb300-bf16", "Megatron-Bridge 26.04", 19275),
    Published("bridge26.04-gpt-oss-120b-gb300-bf16", "Megatron-Bridge 26.04.01", 19200),
    Published("bridge26.04-gpt-oss-120b-gb300-bf16", "Megatron-Bridge 26.02", 19412),
    Published("nemo25.04-mixtral-8x7b-gb200-fp8cs", "NeMo 25.04 summary", 19275),
    Published("bridge25.09-deepseek-v3-h100-fp8cs", "Megatron-Bridge 25.09", 1297),
    Published("bridge25.11-qwen3-235b-a22b-h100-fp8cs", "Megatron-Bridge 25.11", 1575),
    Published("bridge25.11-deepseek-v3-b200-mxfp8", "Megatron-Bridge 25.11", 2139),
    Published("bridge25.11-qwen3-30b-a3b-b200-mxfp8", "Megatron-Bridge 25.11", 9299),
    Published("bridge26.04-qwen3-30b-a3b-gb200-mxfp8", "Megatron-Bridge 25.11", 23766),
    # Megatron-Bridge's CUDA-graph guide (Megatron-Bridge/docs/training/cuda-graphs.md @1faf74e32):
    # an eager BF16 run of the H100 Qwen3-30B-A3B layout with NCCL's all-to-all, iterations 5-8.
    Published("bridgedoc-qwen3-30b-a3b-h100-bf16-alltoall", "Megatron-Bridge docs (PR #3868)", step_s=41.36),
)

# The MoE models of issue 18, as their public-run files name them (`moe_model`).
MOE_MODELS = {
    "deepseek-v3": "DeepSeek-V3",
    "qwen3-30b-a3b": "Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen3-235B-A22B",
    "gpt-oss-120b": "gpt-oss-120b",
    "mixtral-8x7b": "Mixtral-8x7B",
}


def family(hardware: str) -> str:
    return "H100" if hardware.startswith("h100") else "Blackwell"


def moe_model(file: str) -> str:
    """The MoE model a public-run file describes, from its name (ValueError if none)."""
    for key, name in MOE_MODELS.items():
        if f"-{key}-" in file:
            return name
    raise ValueError(f"benchmarks/public_runs/{file}.yaml: names none of the MoE models {sorted(MOE_MODELS)}")


def group(row: dict[str, Any]) -> str:
    """The summary group of a row: its GPU family, with "MoE " before it for a MoE run (so the
    dense groups hold the dense runs only)."""
    return ("MoE " if row.get("moe") else "") + family(row["hardware"])


def rows() -> list[dict[str, Any]]:
    out = []
    predictions: dict[str, tuple[float, bool]] = {}  # one simulation per file (deterministic)
    for run in PUBLISHED:
        scenario, hw = load_scenario_and_hardware(RUNS / f"{run.file}.yaml")
        tokens = scenario.training.global_batch_size * scenario.model.seq_length
        if run.step_s is not None:
            published = run.step_s
        else:
            assert run.tokens_per_s_per_gpu is not None
            published = tokens / (run.tokens_per_s_per_gpu * scenario.num_gpus)
        if run.file not in predictions:
            result = run_simulation(scenario, hw, steady_state=True).result
            predictions[run.file] = (result.iteration_time_s, result.fits_in_memory)
        predicted, fits = predictions[run.file]
        moe = scenario.model.moe is not None
        out.append({
            "file": run.file, "source": run.source, "hardware": hw.name, "gpus": scenario.num_gpus,
            "dtype": scenario.training.dtype.value, "cp": scenario.parallel.cp,
            "published_step_s": round(published, 4), "predicted_step_s": round(predicted, 4),
            "error_pct": round(100 * (predicted - published) / published, 2),
            "fits_in_memory": fits, "moe": moe, "model": moe_model(run.file) if moe else None,
        })  # fmt: skip
    return out


def summary(table: list[dict[str, Any]], by: str = "family") -> dict[str, dict[str, float]]:
    """Error statistics per GPU family (MoE runs in their own "MoE <family>" groups);
    `by="dtype"` or `"cp"` splits each group further, `by="model"` splits the MoE groups by
    model (dense rows are left out of that one)."""
    by_family: dict[str, list[float]] = {}
    for row in table:
        if by == "model" and not row.get("moe"):
            continue
        if by == "family":
            name = group(row)
        elif by == "model":
            name = f"MoE {row['model']} {family(row['hardware'])}"
        else:
            name = f"{group(row)} {by} {row[by]}"
        by_family.setdefault(name, []).append(float(row["error_pct"]))
    return {
        name: {
            "runs": len(errors),
            "mean_abs_error_pct": round(sum(map(abs, errors)) / len(errors), 2),
            "mean_error_pct": round(sum(errors) / len(errors), 2),
        }
        for name, errors in by_family.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--no-save", action="store_true", help=f"do not write {RESULTS.relative_to(ROOT)}")
    args = parser.parse_args()
    table = rows()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    payload: dict[str, Any] = {
        "commit": commit,
        "runs": table,
        "summary": summary(table),
        "by_dtype": summary(table, by="dtype"),
        "by_cp": summary(table, by="cp"),
        "moe_by_model": summary(table, by="model"),
    }
    if not args.no_save:
        RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    if args.json:
        print(json.dumps(payload, indent=2))
        return
    print(
        f"{'run':40s} {'published by':36s} {'GPUs':>6s} {'published s':>12s} {'predicted s':>12s} "
        f"{'error':>8s}  fits"
    )
    for row in table:
        fits = "yes" if row["fits_in_memory"] else "NO"
        print(
            f"{row['file']:40s} {row['source']:36s} {row['gpus']:6d} {row['published_step_s']:12.3f} "
            f"{row['predicted_step_s']:12.3f} {row['error_pct']:+7.1f}%  {fits}"
        )
    groups = ("summary", "by_dtype", "by_cp", "moe_by_model")
    for name, stats in [item for key in groups for item in payload[key].items()]:
        print(
            f"{name}: mean |error| {stats['mean_abs_error_pct']:.1f} % over {stats['runs']} runs "
            f"(mean signed {stats['mean_error_pct']:+.1f} %)"
        )


if __name__ == "__main__":
    main()
