"""Sweep speed: feasible (event-simulated) configurations per second of a sweep of GPT-3
175B on 1,024 GPUs with the axes of issue 5, the cost of a configuration pruned for memory
or filtered as invalid, and scaling with local workers.

Two specs over the same axes (tp [1, 2, 4, 8], pp auto, vpp [1, 2, 3], micro_batch_size
[1, 2, 4], sequence_parallel both, recompute all three):
  issue     global batch of the base scenario (64, Korthikanti et al. Table 3): m <= 16
  gbs-1536  GPT-3's own batch (Brown et al. 2020, Table 2.1: 3.2M tokens / 2048), m <= 384,
            so every simulation has up to 24x more tasks.

Run: python benchmarks/bench_sweep.py [--repeats 3] [--workers 1 2] [--profile]
Reports medians; writes benchmarks/results/sweep.json. Speed is measured here, never
asserted in tests.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from simcluster.sweep import execute_sweep, expand, load_sweep_spec
from simcluster.sweep.evaluate import evaluate
from simcluster.sweep.execute import available_cores

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "scenarios" / "paper" / "gpt3-175b-sp-selective.yaml"
AXES: dict[str, Any] = {
    "tp": [1, 2, 4, 8],
    "pp": "auto",
    "vpp": [1, 2, 3],
    "micro_batch_size": [1, 2, 4],
    "sequence_parallel": [False, True],
    "recompute": ["none", "selective", "full"],
}
SPECS: dict[str, dict[str, Any]] = {
    "issue": AXES,
    "gbs-1536": {**AXES, "global_batch_size": [1536]},
}


def write_spec(folder: Path, name: str, axes: dict[str, Any]) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"base": str(BASE), "num_gpus": 1024, "axes": axes}, sort_keys=False))
    return path


def per_config_costs(spec_path: Path) -> dict[str, Any]:
    """In this process, one at a time: filter cost per combination, evaluate() per status."""
    spec = load_sweep_spec(spec_path)
    start = time.perf_counter()
    expansion = expand(spec)
    filter_s = (time.perf_counter() - start) / expansion.num_combinations
    seconds: dict[str, list[float]] = {"ok": [], "oom": [], "error": []}
    events: list[int] = []
    for config in expansion.configs:
        start = time.perf_counter()
        row = evaluate(config, spec.hardware)
        seconds[row["status"]].append(time.perf_counter() - start)
        events.append(row["num_events"])
    return {
        "combinations": expansion.num_combinations,
        "valid": len(expansion.configs),
        "invalid": len(expansion.invalid),
        "ok": len(seconds["ok"]),
        "oom": len(seconds["oom"]),
        "error": len(seconds["error"]),
        "expand_s_per_combination": filter_s,
        "median_s_per_simulated": statistics.median(seconds["ok"]) if seconds["ok"] else None,
        "mean_s_per_simulated": statistics.mean(seconds["ok"]) if seconds["ok"] else None,
        "median_s_per_pruned": statistics.median(seconds["oom"]) if seconds["oom"] else None,
        "mean_events_per_simulated": sum(events) / max(1, len(seconds["ok"])),
    }


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the pool's workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def end_to_end(spec_path: Path, folder: Path, workers: int, repeats: int) -> dict[str, Any]:
    """Whole `execute_sweep` calls (load, expand, pool start, run, Parquet): medians of wall
    time, and CPU time (robust to other load on the machine) for the parallel efficiency."""
    elapsed, cpu, feasible = [], [], 0
    for repeat in range(repeats):
        cpu_start = _cpu_s()
        outcome = execute_sweep(
            spec_path,
            folder / f"{spec_path.stem}-w{workers}-{repeat}.parquet",
            workers=workers,
            progress=False,
        )
        cpu.append(_cpu_s() - cpu_start)
        elapsed.append(outcome.elapsed_s)
        feasible = outcome.status_counts.get("ok", 0)
    median_s = statistics.median(elapsed)
    return {
        "workers": workers,
        "median_s": median_s,
        "min_s": min(elapsed),
        "median_cpu_s": statistics.median(cpu),
        "feasible": feasible,
        "feasible_per_s": feasible / median_s,
        "busy_cores": statistics.median(cpu) / median_s,
    }


def profile_simulations(spec_path: Path, limit: int = 14) -> str:
    """cProfile of evaluate() over the sweep's configurations, by own time."""
    spec = load_sweep_spec(spec_path)
    configs = expand(spec).configs
    profiler = cProfile.Profile()
    profiler.enable()
    for config in configs:
        evaluate(config, spec.hardware)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(limit)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--specs", nargs="+", default=list(SPECS), choices=list(SPECS))
    parser.add_argument("--profile", action="store_true", help="print a cProfile of each spec's evaluations")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cores": available_cores(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "specs": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in args.specs:
            spec_path = write_spec(folder, name, SPECS[name])
            entry = per_config_costs(spec_path)
            entry["runs"] = [end_to_end(spec_path, folder, w, args.repeats) for w in args.workers]
            report["specs"][name] = entry
            if args.profile:
                print(f"--- profile of {name} (serial evaluate of every valid configuration)")
                print(profile_simulations(spec_path))
    print_report(report)
    out = ROOT / "benchmarks" / "results" / "sweep.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.3f}"


def print_report(report: dict[str, Any]) -> None:
    load = ", ".join(f"{x:.2f}" for x in report["load_average_at_start"])
    print(f"GPT-3 175B on 1,024 GPUs; {report['cores']} cores (load average {load}); medians\n")
    print(f"{'spec':10} {'combos':>6} {'valid':>5} {'ok':>4} {'oom':>4} {'filter ms':>9} {'prune ms':>8} "
          f"{'sim ms':>7} {'events/sim':>10}")  # fmt: skip
    for name, e in report["specs"].items():
        print(f"{name:10} {e['combinations']:6d} {e['valid']:5d} {e['ok']:4d} {e['oom']:4d} "
              f"{_ms(e['expand_s_per_combination']):>9} {_ms(e['median_s_per_pruned']):>8} "
              f"{_ms(e['median_s_per_simulated']):>7} {e['mean_events_per_simulated']:10.0f}")  # fmt: skip
    print(f"\n{'spec':10} {'workers':>7} {'sweep s':>8} {'min s':>7} {'feasible/s':>10} {'speed-up':>8} "
          f"{'CPU s':>7} {'busy cores':>10}")  # fmt: skip
    for name, e in report["specs"].items():
        first = e["runs"][0]["median_s"]
        for run in e["runs"]:
            print(f"{name:10} {run['workers']:7d} {run['median_s']:8.3f} {run['min_s']:7.3f} "
                  f"{run['feasible_per_s']:10.1f} {first / run['median_s']:8.2f} {run['median_cpu_s']:7.2f} "
                  f"{run['busy_cores']:10.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
