"""`simcluster plan` speed, end to end through the CLI (import, enumerate, bound, simulate,
print), the issues' target being under 60 s on 2 cores. Three cases (`--case`):
- gpt3-175b: GPT-3 175B (its own batch of 1,536) on 1,024 A100s;
- llama3-405b: Llama 3 405B (batch 2,048 × 8,192) on 16,384 H100s, tp, pp, cp, vpp and
  the rest searched, uneven (account-for) splits included;
- deepseek-v3-moe: DeepSeek-V3's MoE shape with standard attention (issue 18's target:
  plan on 1,024 H100s in under 60 s), ep and etp searched too;
- deepseek-v3-h100: the shipped DeepSeek-V3 scenario (MLA, MTP, the Megatron-Bridge
  recipe's batch of 4,096) on 1,024 H100s: the model issue 18 names.

Each repeat runs `simcluster plan scenarios/plan/gpt3-175b.yaml --gpus 1024 --workers N
--json` in a fresh process and records its wall time, the CPU time of it and its workers
(user + sys, from the children's rusage), and the load average before it: the development
machine is shared, so wall time under load is reported as measured, next to the CPU time.

Run: python benchmarks/bench_plan.py [--case gpt3-175b|llama3-405b|deepseek-v3-moe|
deepseek-v3-h100] [--repeats 3] [--workers 2]. Writes benchmarks/results/plan.json
(gpt3-175b), plan-llama3-405b.json, plan-deepseek-v3-moe.json or plan-deepseek-v3-h100.json,
with the machine (CPU model, cores, load average). Speed is measured here, never asserted
in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import children_cpu_s, cpu_model  # benchmarks/machine.py (the script's folder)

ROOT = Path(__file__).resolve().parents[1]
CASES: dict[str, tuple[Path, int, str]] = {
    "gpt3-175b": (ROOT / "scenarios" / "plan" / "gpt3-175b.yaml", 1024, "plan.json"),
    "llama3-405b": (
        ROOT / "scenarios" / "modern" / "llama3-405b-h100-16k.yaml",
        16384,
        "plan-llama3-405b.json",
    ),
    "deepseek-v3-moe": (
        ROOT / "tests" / "data" / "moe" / "deepseek-v3-standard-attention.yaml",
        1024,
        "plan-deepseek-v3-moe.json",
    ),
    "deepseek-v3-h100": (
        ROOT / "scenarios" / "moe" / "deepseek-v3-h100.yaml",
        1024,
        "plan-deepseek-v3-h100.json",
    ),
}


def run_once(case: str, workers: int) -> dict[str, Any]:
    scenario, num_gpus, _ = CASES[case]
    command = [
        sys.executable, "-c", "from simcluster.cli import main; main()", "plan", str(scenario),
        "--gpus", str(num_gpus), "--workers", str(workers), "--json", "--no-progress",
    ]  # fmt: skip
    load = os.getloadavg()
    cpu_before, start = children_cpu_s(), time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    wall_s = time.perf_counter() - start
    payload = json.loads(done.stdout)
    best = payload["candidates"][0]
    return {
        "workers": workers,
        "wall_s": wall_s,
        "cpu_s": children_cpu_s() - cpu_before,
        "load_average_before": list(load),
        "searched": payload["searched"],
        "pruned_memory": payload["pruned_memory"],
        "pruned_bound": payload["pruned_bound"],
        "simulated": payload["simulated"],
        "best_layout": {**best["scenario"]["parallel"], **best["scenario"]["training"]},
        "best_iteration_time_s": best["iteration_time_s"],
        "best_mfu": best["mfu"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), default="gpt3-175b")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[2])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    scenario, num_gpus, out_name = CASES[args.case]
    args.out = args.out or ROOT / "benchmarks" / "results" / out_name
    results: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "case": args.case,
        "scenario": str(scenario.relative_to(ROOT)),
        "num_gpus": num_gpus,
        "runs": [],
    }
    print("workers  wall s  cpu s  load(1m)  searched  pruned mem  pruned bound  simulated")
    for workers in args.workers:
        for _ in range(args.repeats):
            run = run_once(args.case, workers)
            results["runs"].append(run)
            print(
                f"{workers:7d}  {run['wall_s']:6.1f}  {run['cpu_s']:5.1f}"
                f"  {run['load_average_before'][0]:8.2f}"
                f"  {run['searched']:8d}  {run['pruned_memory']:10d}  {run['pruned_bound']:12d}"
                f"  {run['simulated']:9d}"
            )
    for workers in args.workers:
        runs = [r for r in results["runs"] if r["workers"] == workers]
        results[f"median_wall_s_workers_{workers}"] = statistics.median(r["wall_s"] for r in runs)
        results[f"median_cpu_s_workers_{workers}"] = statistics.median(r["cpu_s"] for r in runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
