"""How close a CPU calibration gets: calibrate on this CPU, then check-profile's held-out
layers against the profile, with the machine recorded.

Run: python benchmarks/bench_calibration_cpu.py [--grid quick|cpu] [--threads 1]
Writes benchmarks/results/calibration-cpu-<grid>.json. The tests run the same loop on the
quick grid for its mechanics only (files, rows, provenance, finite errors): an accuracy
figure of a CPU run depends on the CPU (an eager layer on a CPU is dominated by per-op
framework overhead, and bf16 GEMMs run ~1000x slower on a CPU without native bf16), so it
is measured here and never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from simcluster.calibration.check import compare, summarize
from simcluster.calibration.profile import build_profile, write_profile
from simcluster.calibration.report import format_summary
from simcluster.profiler.bench.layer_timing import run_check
from simcluster.profiler.bench.microbench import run_calibration

ROOT = Path(__file__).resolve().parents[1]
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile")  # native bf16 on x86 CPUs


def cpu_flags() -> list[str]:
    """The CPU's native-bf16 flags (from /proc/cpuinfo; empty where none or not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []
    )
    return [flag for flag in BF16_FLAGS if flag in flags]


def measure(grid: str, threads: int) -> dict:
    quick = grid == "quick"
    command = f"benchmarks/bench_calibration_cpu.py --grid {grid} --threads {threads}"
    start = time.perf_counter()
    meas = run_calibration("cpu", quick, command, num_threads=threads)
    calibrate_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as folder:
        profile = write_profile(build_profile(meas), Path(folder) / "cpu.yaml")
    start = time.perf_counter()
    run = run_check("cpu", quick, command, num_threads=threads)
    check_s = time.perf_counter() - start
    checks = compare(run, profile)
    summary = summarize(checks)
    print(format_summary(summary))
    return {
        "grid": grid,
        "machine": {
            **asdict(meas.device),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "native_bf16_flags": cpu_flags(),
            "load_average": list(os.getloadavg()),
        },
        "calibrate_s": calibrate_s,
        "check_s": check_s,
        "peak_bf16_tflop_per_s": profile.gpu.peak_bf16_tflop_per_s,
        "kernel_launch_us": profile.compute.kernel_launch_us,
        "summary": asdict(summary),
        "runs": [
            {
                "shape": asdict(check.timing.shape),
                "tp": check.timing.tp,
                "sequence_parallel": check.timing.sequence_parallel,
                "recompute": check.timing.recompute,
                "measured_total_s": check.timing.total_s,
                "predicted_total_s": check.predicted_total_s,
                "error": check.error,
            }
            for check in checks
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", choices=("quick", "cpu"), default="quick")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    report = measure(args.grid, args.threads)
    out = ROOT / "benchmarks" / "results" / f"calibration-cpu-{args.grid}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    s, machine = report["summary"], report["machine"]
    print(
        f"{machine['name']} ({', '.join(machine['native_bf16_flags']) or 'no native bf16'}): "
        f"calibrate {report['calibrate_s']:.1f} s, check {report['check_s']:.1f} s, "
        f"median |error| {100 * s['median_abs_error']:.1f} %, max {100 * s['max_abs_error']:.1f} % -> {out}"
    )


if __name__ == "__main__":
    main()
