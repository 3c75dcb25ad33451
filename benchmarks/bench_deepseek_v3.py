"""DeepSeek-V3 simulation speed at 2,048 GPUs (issue 18: "DeepSeek-V3 on 2,048 GPUs
simulates in < 2 s").

The shipped scenarios/moe/deepseek-v3-h100.yaml (1,024 H100s: TP 2, PP 16, EP 64, dp 32, GBS
4096) with dp doubled to 64 (2,048 GPUs) and the global batch doubled to 8192, so each
pipeline still runs 128 microbatches. Times `simcluster run FILE --json` in a fresh process
(imports included: what a user waits for), wall and CPU seconds, and the in-process
`run_simulation` call alone. The machine may be shared, so wall time under load is reported
as measured, next to the CPU time.

Run: python benchmarks/bench_deepseek_v3.py [--repeats 5]
Writes benchmarks/results/deepseek-v3-speed.json. Speed is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from machine import children_cpu_s, cpu_model  # benchmarks/machine.py (the script's folder)

from simcluster.config import load_scenario_and_hardware
from simcluster.simulation import run_simulation

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "moe" / "deepseek-v3-h100.yaml"
RESULTS = ROOT / "benchmarks" / "results" / "deepseek-v3-speed.json"


def scaled_scenario(folder: Path) -> Path:
    """The shipped scenario at dp 64 and GBS 8192 (2,048 GPUs, 128 microbatches)."""
    data = yaml.safe_load(SCENARIO.read_text())
    data["name"] = "deepseek-v3-h100-2048"
    data["parallel"]["dp"] = 64
    data["training"]["global_batch_size"] = 8192
    path = folder / "deepseek-v3-h100-2048.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = scaled_scenario(Path(tmp))
        cli_wall, cli_cpu = [], []
        for _ in range(args.repeats):
            cpu0, start = children_cpu_s(), time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "simcluster", "run", str(path), "--json"],
                cwd=ROOT, capture_output=True, text=True, check=True,
            )  # fmt: skip
            cli_wall.append(time.perf_counter() - start)
            cli_cpu.append(children_cpu_s() - cpu0)
        result = json.loads(done.stdout)
        scenario, hw = load_scenario_and_hardware(path)
        in_process = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            run_simulation(scenario, hw)
            in_process.append(time.perf_counter() - start)
    report = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "scenario": "scenarios/moe/deepseek-v3-h100.yaml at dp 64, GBS 8192",
        "num_gpus": result["num_gpus"],
        "num_events": result["num_events"],
        "iteration_time_s": result["iteration_time_s"],
        "cli_wall_s_median": statistics.median(cli_wall),
        "cli_cpu_s_median": statistics.median(cli_cpu),
        "run_simulation_s_median": statistics.median(in_process),
        "repeats": args.repeats,
    }
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
