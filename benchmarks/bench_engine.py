"""Engine speed: wall time of one simulated iteration for the paper's largest scenarios,
events per second, and how time grows with pp × microbatches × chunks.

Run: python benchmarks/bench_engine.py [--repeats 5]
Reports medians; writes benchmarks/results/engine.json. Speed is measured here, never
asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from simcluster.config import load_scenario_and_hardware, parse_scenario
from simcluster.simulation import run_simulation

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "scenarios" / "paper"


def time_scenario(scenario, hw, repeats: int) -> tuple[float, int]:
    seconds = []
    events = 0
    for _ in range(repeats):
        start = time.perf_counter()
        result = run_simulation(scenario, hw).result
        seconds.append(time.perf_counter() - start)
        events = result.num_events
    return statistics.median(seconds), events


def scaling_series(hw, repeats: int) -> list[dict]:
    """1T-shaped pipelines (64 stages, 2 layers each) with growing microbatch counts."""
    rows = []
    for num_microbatches in (64, 128, 256, 512, 1024):
        data = {
            "hardware": hw.name,
            "model": {"num_layers": 128, "hidden_size": 25600, "num_attention_heads": 160,
                      "seq_length": 2048, "vocab_size": 51200},
            "parallel": {"tp": 8, "pp": 64, "sequence_parallel": True},
            "training": {"micro_batch_size": 1, "global_batch_size": num_microbatches,
                         "recompute": "selective"},
        }
        scenario = parse_scenario(data, "scaling")
        median_s, events = time_scenario(scenario, hw, repeats)
        rows.append({"pp": 64, "num_microbatches": num_microbatches, "tasks": 64 * num_microbatches * 2,
                     "median_s": median_s, "events": events, "events_per_s": events / median_s})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    report = {"python": platform.python_version(), "machine": platform.machine(), "scenarios": []}
    print(f"{'scenario':32} {'tasks':>8} {'median s':>9} {'events':>9} {'events/s':>10}")
    for name in ("gpt-1t-sp-selective", "mt-nlg-530b-sp-selective", "gpt3-175b-sp-selective"):
        scenario, hw = load_scenario_and_hardware(PAPER / f"{name}.yaml")
        par = scenario.parallel
        tasks = par.pp * scenario.num_microbatches * par.vpp * 2
        median_s, events = time_scenario(scenario, hw, args.repeats)
        report["scenarios"].append({"scenario": name, "tasks": tasks, "median_s": median_s,
                                    "events": events, "events_per_s": events / median_s})
        print(f"{name:32} {tasks:8d} {median_s:9.3f} {events:9d} {events / median_s:10.0f}")
    print("\ngrowth with microbatches (pp = 64):")
    print(f"{'microbatches':>12} {'tasks':>8} {'median s':>9} {'us/task':>8}")
    report["scaling"] = scaling_series(hw, max(1, args.repeats // 2))
    for row in report["scaling"]:
        print(f"{row['num_microbatches']:12d} {row['tasks']:8d} {row['median_s']:9.3f} "
              f"{1e6 * row['median_s'] / row['tasks']:8.1f}")
    out = ROOT / "benchmarks" / "results" / "engine.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
