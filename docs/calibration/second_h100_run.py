"""The second H100 run's fused data against the shipped H100 profile and against the first
machines (issue 20; docs/calibration/second_h100_run.md reads its output).

    PYTHONPATH=. python docs/calibration/second_h100_run.py [--json]

1. Sustained load on each machine: the heat GEMM's settled rate, SM clock and power, the
   device copy, the microbench GEMMs of at least 1 TFLOP (median rate, clock, power), and the
   same GEMM shapes on both script machines (rate ratio).
2. Memory-bound rates per kind (GB/s of the records' bytes, median over the sites of at least
   200 MB) on the three fused / eager microbench files, the fused modern kinds at the shapes
   both script runs timed, and what the shipped profile prices each kind at.
3. The fused layers: the 49 paper layers against the same configurations of the first script
   run, and the modern layers at t = 1 against measure3.py's torch.compile'd layers.
4. check-profile: the shipped `h100-sxm5-80gb` and the profile `calibrate` fits from this
   run's microbench, on the fused paper and modern layers; GPU-bound = not host-bound under the
   fitted profile's host term (measured on this machine's tiny layers), for both profiles.

Nothing is fitted here; every figure is read from the committed files.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from simcluster.calibration.check import LayerCheck, compare
from simcluster.calibration.fit import MODERN_KINDS
from simcluster.calibration.profile import build_profile
from simcluster.calibration.records import LayerRun, Measurements
from simcluster.config.hardware import HardwareProfile, load_hardware, parse_hardware
from simcluster.costs.compute import kind_efficiency, priced_kind

CAL = Path(__file__).resolve().parent
FIRST = CAL / "h100-2026-11-26"  # first session (measure*.py), burst and sustained
SCRIPT_A = CAL / "h100-2026-11-26-script"  # first script run
SCRIPT_B = CAL / "h100-2026-11-27-script"  # second script run (this page)
MICROBENCH = {
    "first session (eager)": FIRST / "microbench.json",
    "script A (static rows)": SCRIPT_A / "microbench_static_rows.json",
    "script A (symbolic rows)": SCRIPT_A / "microbench.json",
    "script B": SCRIPT_B / "microbench.json",
}
BIG_SITE_BYTES = 2e8  # above every fused forward kind's host-bound range at these rates
BIG_GEMM_FLOP = 1e12
MODERN_FUSED = ("modern_layers_fused.json", "modern_layers_fused_rest.json")
HBM_GB_PER_S = 3350  # the profile's gpu.memory_bandwidth_gb_per_s
# The shipped profile's kinds beside the microbench record names that measure them: the
# modern kinds as the fit keeps them (`calibration.fit.MODERN_KINDS`), and the paper grid's.
PROFILE_KIND = {
    **MODERN_KINDS,
    "layer_norm.forward": "layernorm",
    "layer_norm.backward": "layernorm.bwd",
    "gelu.forward": "bias_gelu",
    "gelu.backward": "bias_gelu.bwd",
    "bias_dropout_add.forward": "bias_dropout_add",
    "bias_dropout_add.backward": "bias_dropout_add.bwd",
}


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def sustained() -> dict[str, dict[str, Any]]:
    """Per microbench file: heat GEMM settled, copy, the big GEMMs' median rate/clock/power."""
    out = {}
    for name, path in MICROBENCH.items():
        data = _json(path)
        big = [g for g in data["gemms"] if 2 * g["m"] * g["n"] * g["k"] * g["batch"] >= BIG_GEMM_FLOP]
        rates = [2 * g["m"] * g["n"] * g["k"] * g["batch"] / g["seconds"] / 1e12 for g in big]
        row: dict[str, Any] = {
            "copy_gb_per_s": data["copy_bytes"] / data["copy_s"] / 1e9,
            "big_gemms": len(big),
            "big_gemm_median_tflop_per_s": statistics.median(rates),
        }
        clocks = [g["sm_clock_mhz"] for g in big if g.get("sm_clock_mhz")]
        if clocks:
            row["big_gemm_median_clock_mhz"] = statistics.median(clocks)
            row["big_gemm_median_power_w"] = statistics.median(g["power_w"] for g in big if g.get("power_w"))
        warm = data.get("warmup")
        if warm:
            row |= {k: warm[k] for k in ("settled_tflop_per_s", "sm_clock_mhz", "power_w", "seconds")}
        out[name] = row
    burst = _json(FIRST / "gemm_burst_vs_sustained.json")["phases"][1]
    out["first session (measure4.py, 30 s)"] = {"settled_tflop_per_s": burst["tflops_median"]}
    return out


def _gemm_key(g: dict[str, Any]) -> tuple:
    return (g["name"], g["m"], g["n"], g["k"], g["batch"])


def same_gemms() -> dict[str, float]:
    """Script B over script A (static rows) at every GEMM both timed: the time ratio's spread."""
    a = {_gemm_key(g): g["seconds"] for g in _json(MICROBENCH["script A (static rows)"])["gemms"]}
    b = {_gemm_key(g): g["seconds"] for g in _json(MICROBENCH["script B"])["gemms"]}
    big = [k for k in a.keys() & b.keys() if 2 * k[1] * k[2] * k[3] * k[4] >= BIG_GEMM_FLOP]
    ratios = sorted(b[k] / a[k] for k in big)
    return {
        "shapes": len(ratios),
        "median_time_ratio": statistics.median(ratios),
        "p10": ratios[len(ratios) // 10],
        "p90": ratios[(9 * len(ratios)) // 10],
    }


def site_rates() -> dict[str, dict[str, float]]:
    """GB/s per memory-bound site kind, median over sites of at least BIG_SITE_BYTES."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for name, path in MICROBENCH.items():
        by_kind = defaultdict(list)
        for e in _json(path)["elementwise"]:
            if e["bytes_moved"] >= BIG_SITE_BYTES:
                by_kind[e["name"]].append(e["bytes_moved"] / e["seconds"] / 1e9)
        for kind, rates in by_kind.items():
            out[kind][name] = statistics.median(rates)
    return dict(out)


def modern_kind_rates(hw: HardwareProfile) -> list[dict[str, Any]]:
    """The fused modern kinds at each shape both script runs timed, with the profile's price."""
    rows: dict[tuple, dict[str, Any]] = {}
    for name in ("script A (symbolic rows)", "script B"):
        for m in _json(MICROBENCH[name])["modern"]:
            if m["kind"] != "memory_bound" or m.get("layer_mode") != "fused":
                continue
            row = rows.setdefault((m["name"], tuple(m["dims"])), {"kind": m["name"], "dims": m["dims"]})
            row[name] = m["bytes_moved"] / m["seconds"] / 1e9
    for row in rows.values():
        eff = kind_efficiency(hw, priced_kind(hw, PROFILE_KIND.get(row["kind"])))
        row["shipped"] = None if eff is None else eff * HBM_GB_PER_S
    return list(rows.values())


def _key(t: Any) -> tuple:
    return (t.shape, t.tp, t.sequence_parallel, t.recompute)


def paper_layers_across_machines() -> dict[str, Any]:
    """Script B over script A, the fused paper layers both timed (same configurations)."""
    first = LayerRun.from_json((SCRIPT_A / "layer_timing_fused.json").read_text())
    a = {_key(t): t.total_s for t in first.timings}
    b = LayerRun.from_json((SCRIPT_B / "layer_timing_fused.json").read_text()).timings
    ratios = {_key(t): t.total_s / a[_key(t)] for t in b if _key(t) in a}
    b4 = [r for k, r in ratios.items() if k[0].micro_batch_size == 4]
    return {
        "common": len(ratios),
        "median_ratio": statistics.median(ratios.values()),
        "b4_runs": len(b4),
        "b4_min": min(b4),
        "b4_max": max(b4),
    }


def modern_fused_runs() -> list[LayerRun]:
    return [LayerRun.from_json((SCRIPT_B / name).read_text()) for name in MODERN_FUSED]


def compiled_t1() -> list[dict[str, Any]]:
    """The t = 1 fused modern layers of script B (and A) beside measure3.py's compiled ones."""
    measure3 = {row["name"]: row for row in _json(FIRST / "layers_eager_vs_compiled.json")["layers"]}
    script_a = {
        t.layer["name"]: t.total_s
        for t in LayerRun.from_json((SCRIPT_A / "modern_layers_fused.json").read_text()).timings
        if t.tp == 1 and t.layer is not None
    }
    b_eager = {
        t.layer["name"]: t.total_s
        for t in LayerRun.from_json((SCRIPT_B / "modern_layers_eager.json").read_text()).timings
        if t.tp == 1 and t.layer is not None and t.shape.micro_batch_size == 1
    }
    rows = []
    for run in modern_fused_runs():
        for t in run.timings:
            if t.tp != 1 or t.layer is None or t.layer["name"] not in measure3:
                continue
            m3 = measure3[t.layer["name"]]
            rows.append(
                {
                    "layer": t.layer["name"],
                    "script_b_fused_s": t.total_s,
                    "script_a_fused_s": script_a.get(t.layer["name"]),
                    "script_b_eager_s": b_eager.get(t.layer["name"]),
                    "measure3_compiled_s": m3["compiled_s"],
                    "measure3_eager_s": m3["eager_s"],
                }
            )
    return rows


def fitted_profile() -> HardwareProfile:
    meas = Measurements.from_json((SCRIPT_B / "microbench.json").read_text())
    return parse_hardware(build_profile(meas), "h100b.yaml")


def checks(hw: HardwareProfile, runs: list[LayerRun]) -> list[LayerCheck]:
    return [c for run in runs for c in compare(run, hw)]


def _summary(errors: list[float]) -> dict[str, float]:
    return {
        "runs": len(errors),
        "median_abs": statistics.median(abs(e) for e in errors),
        "max_abs": max(abs(e) for e in errors),
        "median_signed": statistics.median(errors),
    }


def check_figures() -> dict[str, Any]:
    """Shipped and fitted profile on the fused paper and modern layers of script B."""
    shipped, fitted = load_hardware("h100-sxm5-80gb"), fitted_profile()
    sets = {
        "paper (49 fused)": [LayerRun.from_json((SCRIPT_B / "layer_timing_fused.json").read_text())],
        "modern (14 fused)": modern_fused_runs(),
    }
    out: dict[str, Any] = {}
    for name, runs in sets.items():
        fit, ship = checks(fitted, runs), checks(shipped, runs)
        gpu = [i for i, c in enumerate(fit) if not c.host_bound]
        out[name] = {
            "host_bound_under_fitted": len(fit) - len(gpu),
            "fitted_gpu_bound": _summary([fit[i].error for i in gpu]),
            "shipped_gpu_bound": _summary([ship[i].error for i in gpu]),
            "fitted_all": _summary([c.error for c in fit]),
        }
        if name.startswith("modern"):
            out[name]["per_layer"] = [
                {
                    "layer": c.timing.layer["name"] if c.timing.layer else "paper",
                    "tp": c.timing.tp,
                    "sp": c.timing.sequence_parallel,
                    "recompute": c.timing.recompute,
                    "b": c.timing.shape.micro_batch_size,
                    "measured_ms": c.timing.total_s * 1e3,
                    "shipped_ms": s.predicted_total_s * 1e3,
                    "shipped_error": s.error,
                    "fitted_ms": c.predicted_total_s * 1e3,
                    "fitted_error": c.error,
                    "host_bound": c.host_bound,
                }
                for c, s in zip(fit, ship, strict=True)
            ]
    return out


def report() -> dict[str, Any]:
    return {
        "sustained": sustained(),
        "same_gemms_b_over_a": same_gemms(),
        "site_gb_per_s": site_rates(),
        "modern_fused_gb_per_s": modern_kind_rates(load_hardware("h100-sxm5-80gb")),
        "paper_layers_b_over_a": paper_layers_across_machines(),
        "compiled_t1": compiled_t1(),
        "checks": check_figures(),
    }


def _print(rep: dict[str, Any]) -> None:
    print("== sustained load")
    for name, row in rep["sustained"].items():
        print(f"  {name:36s}", {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()})
    print("== same GEMMs (>= 1 TFLOP), script B time / script A time:", rep["same_gemms_b_over_a"])
    print("== memory-bound sites, GB/s (median over sites >= 200 MB)")
    cols = list(MICROBENCH)
    print(f"  {'site':30s}" + "".join(f"{c[:24]:>26s}" for c in cols))
    for kind, rates in sorted(rep["site_gb_per_s"].items()):
        print(f"  {kind:30s}" + "".join(f"{rates.get(c, float('nan')):26.0f}" for c in cols))
    print("== fused modern kinds, GB/s (script A symbolic rows, script B, shipped profile)")
    for row in rep["modern_fused_gb_per_s"]:
        a, b, s = row.get("script A (symbolic rows)"), row.get("script B"), row["shipped"]
        print(f"  {row['kind']:20s} {str(row['dims']):16s} A {a or 0:6.0f}  B {b or 0:6.0f}", end="")
        print(f"  shipped {s or 0:6.0f}")
    print("== fused paper layers, script B / script A:", rep["paper_layers_b_over_a"])
    print("== t = 1 layers (ms): script B fused, script A fused, measure3 compiled, B eager, measure3 eager")
    for row in rep["compiled_t1"]:
        print(
            f"  {row['layer']:16s} {row['script_b_fused_s'] * 1e3:7.2f} "
            f"{(row['script_a_fused_s'] or 0) * 1e3:7.2f} {row['measure3_compiled_s'] * 1e3:7.2f} "
            f"{(row['script_b_eager_s'] or 0) * 1e3:7.2f} {row['measure3_eager_s'] * 1e3:7.2f}"
        )
    print("== check-profile on script B's fused layers")
    for name, fig in rep["checks"].items():
        print(f"  {name}: host-bound under the fitted host term {fig['host_bound_under_fitted']}")
        for key in ("fitted_gpu_bound", "shipped_gpu_bound", "fitted_all"):
            s = fig[key]
            print(
                f"    {key:17s} runs {s['runs']:2d}  median |err| {s['median_abs']:6.1%}  "
                f"max {s['max_abs']:6.1%}  signed {s['median_signed']:+6.1%}"
            )
        for r in fig.get("per_layer", []):
            print(
                f"    {r['layer']:16s} b{r['b']} t{r['tp']} sp{int(r['sp'])} {r['recompute']:9s} "
                f"{r['measured_ms']:7.2f}  shipped {r['shipped_ms']:7.2f} {r['shipped_error']:+6.1%}  "
                f"fitted {r['fitted_ms']:7.2f} {r['fitted_error']:+6.1%}{'  host' if r['host_bound'] else ''}"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    rep = report()
    if args.json:
        print(json.dumps(rep, indent=1, default=str))
    else:
        _print(rep)


if __name__ == "__main__":
    main(sys.argv[1:])
