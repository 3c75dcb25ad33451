"""Predicted against published iteration times of Megatron-LM runs on A100 (the development set).

    python benchmarks/dev_runs.py            # table, then the summary line
    python benchmarks/dev_runs.py --json     # the same as JSON

`benchmarks/dev_runs.yaml` holds each run as a scenario with its published iteration time and
source (Narayanan et al., SC'21, arXiv 2104.04473, digitised figures; the Megatron-LM README's
GPT-3 example). The A100 profile's two fitted constants come from the paper's Table 4
(docs/hardware_profiles.md), never from these runs: they show where the model is off.
Nothing is written to disk.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simcluster.config.hardware import load_hardware  # noqa: E402
from simcluster.config.scenario import parse_scenario, require_hardware_fits  # noqa: E402
from simcluster.simulation import run_simulation  # noqa: E402

RUNS = ROOT / "benchmarks" / "dev_runs.yaml"


def rows() -> list[dict[str, Any]]:
    """One row per run: the published and predicted iteration time and the signed error."""
    out = []
    for run in yaml.safe_load(RUNS.read_text(encoding="utf-8"))["runs"]:
        source = f"{RUNS.name}: {run['scenario']['name']}"
        scenario = parse_scenario(run["scenario"], source)
        hw = load_hardware(scenario.hardware)
        require_hardware_fits(scenario, hw, source)
        predicted = run_simulation(scenario, hw, steady_state=True).result.iteration_time_s
        measured = float(run["measured_iteration_time_s"])
        out.append({
            "name": scenario.name, "gpus": scenario.num_gpus, "source": run["source"],
            "published_s": measured, "predicted_s": round(predicted, 4),
            "error_pct": round(100 * (predicted - measured) / measured, 2),
        })  # fmt: skip
    return out


def summary(table: list[dict[str, Any]]) -> dict[str, float]:
    """Mean |error|, mean signed error, the signed range and how many runs fall on each side."""
    errors = [float(row["error_pct"]) for row in table]
    return {
        "runs": len(errors),
        "mean_abs_error_pct": round(sum(map(abs, errors)) / len(errors), 2),
        "mean_error_pct": round(sum(errors) / len(errors), 2),
        "min_error_pct": min(errors),
        "max_error_pct": max(errors),
        "num_slower": sum(error > 0 for error in errors),
        "num_faster": sum(error < 0 for error in errors),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args()
    table = rows()
    stats = summary(table)
    if args.json:
        print(json.dumps({"runs": table, "summary": stats}, indent=2))
        return
    print(f"{'run':36s} {'GPUs':>6s} {'published s':>12s} {'predicted s':>12s} {'error':>8s}")
    for row in table:
        print(
            f"{row['name']:36s} {row['gpus']:6d} {row['published_s']:12.3f} "
            f"{row['predicted_s']:12.3f} {row['error_pct']:+7.1f}%"
        )
    print(
        f"development set: mean |error| {stats['mean_abs_error_pct']:.1f} % over {stats['runs']} runs "
        f"(signed {stats['min_error_pct']:+.1f} % to {stats['max_error_pct']:+.1f} %; "
        f"{stats['num_slower']} predicted slower than published, {stats['num_faster']} faster)"
    )


if __name__ == "__main__":
    main()
