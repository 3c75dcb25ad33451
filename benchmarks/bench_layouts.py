"""Event-simulated layouts per second, end to end through the CLI, on issue 9's spec.

`benchmarks/specs/gpt3-175b-1024gpus-144.yaml`: GPT-3 175B (96 layers) on 1,024 A100s,
B = 1,536, tp {4, 8} x pp {4, 8, 16} x vpp {1, 2, 3} x mbs {1, 2} x SP x recompute
{selective, full}: 144 layouts, of which those that fit are event-simulated (the rest are
pruned by the exact memory estimate). Each run is a fresh `simcluster sweep` process:

    python -m simcluster.cli sweep SPEC --out TMP.parquet --workers W --no-progress --json [--full-simulation]

Reported per mode (steady state, the default, and --full-simulation) and worker count:
the sweep's own elapsed time as the CLI reports it (`elapsed_s` of --json, to the
microsecond: load, expand, pool, simulate, Parquet),
the whole process's wall time (plus Python start-up and imports), CPU seconds of the
process and its workers, and layouts/s = simulated (ok) rows / elapsed. The machine and
its load average are recorded with every run: on a shared machine, compare CPU seconds.

Run (each sweep process runs in, and imports, this tree or the baseline's):
    python benchmarks/bench_layouts.py [--repeats 5] [--workers 2 1] [--modes steady full]
    [--baseline /path/to/other/checkout]   # also time that checkout's `sweep` (no extra flags)
Writes benchmarks/results/layouts.json. Speed is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import children_cpu_s, cpu_model  # benchmarks/machine.py (the script's folder)

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "benchmarks" / "specs" / "gpt3-175b-1024gpus-144.yaml"
CLI = "from simcluster.cli import main; main()"


def one_sweep(folder: Path, workers: int, mode: str, repeat: int, baseline: Path | None) -> dict[str, Any]:
    """One `simcluster sweep` process; its printed summary gives the sweep's elapsed time."""
    out = folder / f"w{workers}-{mode}-{repeat}.parquet"
    command = [sys.executable, "-c", CLI, "sweep", str(SPEC), "--out", str(out), "--workers", str(workers),
               "--no-progress", "--json"] + (["--full-simulation"] if mode == "full" else [])  # fmt: skip
    # `python -c` puts the working directory first on sys.path: run in the tree to time
    root = baseline if mode == "baseline" and baseline else ROOT
    env = {**os.environ, "PYTHONPATH": str(root)}
    load = os.getloadavg()[0]
    cpu_start, wall_start = children_cpu_s(), time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=env, cwd=root)
    wall_s, cpu_s = time.perf_counter() - wall_start, children_cpu_s() - cpu_start
    try:
        summary = json.loads(done.stdout)
        elapsed_s, counts = float(summary["elapsed_s"]), summary["status_counts"]
    except (ValueError, KeyError) as error:
        raise RuntimeError(f"unexpected sweep output ({error}):\n{done.stdout}\n{done.stderr}") from error
    return {"elapsed_s": elapsed_s, "process_wall_s": wall_s, "cpu_s": cpu_s,
            "ok": int(counts.get("ok", 0)), "oom": int(counts.get("oom", 0)),
            "load_average": load}  # fmt: skip


def summarise(mode: str, workers: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    elapsed = statistics.median(run["elapsed_s"] for run in runs)
    ok = runs[0]["ok"]
    return {
        "mode": mode,
        "workers": workers,
        "ok": ok,
        "oom": runs[0]["oom"],
        "median_elapsed_s": elapsed,
        "min_elapsed_s": min(run["elapsed_s"] for run in runs),
        "median_process_wall_s": statistics.median(run["process_wall_s"] for run in runs),
        "median_cpu_s": statistics.median(run["cpu_s"] for run in runs),
        "layouts_per_s": ok / elapsed,
        "layouts_per_s_best": ok / min(run["elapsed_s"] for run in runs),
        "layouts_per_cpu_s": ok / statistics.median(run["cpu_s"] for run in runs),
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--modes", nargs="+", default=["steady", "full"], choices=["steady", "full"])
    parser.add_argument("--baseline", type=Path, help="another checkout to time as mode 'baseline'")
    parser.add_argument("--note", default="", help="recorded with the results, e.g. 'shared, under load'")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "spec": str(SPEC.relative_to(ROOT)),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "load_average_at_start": os.getloadavg(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "note": args.note,
        "results": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        modes = args.modes + (["baseline"] if args.baseline else [])
        report["baseline"] = str(args.baseline) if args.baseline else None
        cases = [(mode, workers) for mode in modes for workers in args.workers]
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {case: [] for case in cases}
        # round robin, so that other jobs' load falls on every case alike
        for repeat in range(args.repeats):
            for mode, workers in cases:
                runs[mode, workers].append(one_sweep(Path(tmp), workers, mode, repeat, args.baseline))
        report["results"] = [summarise(mode, workers, runs[mode, workers]) for mode, workers in cases]
    report["load_average_at_end"] = os.getloadavg()
    print_report(report)
    out = ROOT / "benchmarks" / "results" / "layouts.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))


def print_report(report: dict[str, Any]) -> None:
    load = ", ".join(f"{x:.2f}" for x in report["load_average_at_start"])
    print(f"{report['spec']}: {report['cpu']}, {report['cores']} cores, load average {load} "
          f"(Python {report['python']}, {report['date_utc']} UTC); medians")  # fmt: skip
    print(f"{'mode':8} {'workers':>7} {'ok':>4} {'sweep s':>8} {'min s':>7} {'process s':>9} {'CPU s':>7} "
          f"{'layouts/s':>9} {'best':>7} {'per CPU s':>9} {'load':>5}")  # fmt: skip
    for r in report["results"]:
        load_avg = statistics.median(run["load_average"] for run in r["runs"])
        print(f"{r['mode']:8} {r['workers']:7d} {r['ok']:4d} {r['median_elapsed_s']:8.3f} "
              f"{r['min_elapsed_s']:7.3f} {r['median_process_wall_s']:9.3f} {r['median_cpu_s']:7.2f} "
              f"{r['layouts_per_s']:9.1f} {r['layouts_per_s_best']:7.1f} {r['layouts_per_cpu_s']:9.1f} "
              f"{load_avg:5.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
