"""The H100's measured grouped expert GEMMs against the shipped profile's prices (issue 18;
docs/calibration/grouped_gemm.md, "Measured on an H100").

    PYTHONPATH=. python docs/calibration/grouped_gemm_measured.py [--json]

Reads only committed files: docs/calibration/h100-2026-11-27-script/microbench.json
(`grouped_gemms`: 420 `torch._grouped_mm` shapes at sustained load, `gemms` / `modern` /
`warmup`: the same run's dense GEMMs and heat loop) and followup.json (`grouped_loop`: the
shipped layouts' own G and M, grouped and as a loop of GEMMs, from an idle GPU).

1. `errors`: each measured shape priced by hwprofiles/h100-sxm5-80gb.yaml without its
   grouped points (how every expert GEMM was priced before: `costs.compute.gemm_time_s`) and
   with them (`costs.grouped_gemm`), error = price / measured − 1, summarised per model, kind
   and tokens per expert.
2. `burst`: whether the grouped kernels ran at burst or at sustained clocks: the same shapes
   from an idle GPU (followup) and at sustained load (microbench), the heat GEMM's settled
   rate beside the same shape's dense and grouped kernels, clocks and power of the grouped
   and dense records of the run, the shapes above the sustained ceiling.
3. `held_out`: the shipped layouts' (G, M), most of them between measured points, priced by
   the fitted profile against followup.json's grouped and loop times.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from simcluster.calibration.grouped_profile import sustained_ceiling_tflop_per_s
from simcluster.calibration.grouped_shapes import GroupedShape
from simcluster.calibration.records import Measurements
from simcluster.config.choices import Dtype
from simcluster.config.hardware import HardwareProfile, load_hardware
from simcluster.costs.compute import gemm_time_s
from simcluster.costs.grouped_gemm import grouped_gemm_time_s, grouped_placement
from simcluster.workload.grouped_gemm import tokens_per_expert
from simcluster.workload.ops import GemmShape

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "docs" / "calibration" / "h100-2026-11-27-script"
HOST_FLOOR_S = 60e-6  # calls this short sit on the ~34-55 µs floor of an eager `_grouped_mm` issue


def _without_points(hw: HardwareProfile) -> HardwareProfile:
    return hw.model_copy(update={"compute": hw.compute.model_copy(update={"grouped_gemm_points": []})})


def _gemm(kind: str, groups: int, m: int, n: int, k: int) -> GemmShape:
    """The shape as the microbench ran it: a wgrad writes bf16 (the op graph's accumulates into
    fp32 main_grad, `accumulate_fp32`, which prices more bytes than were measured)."""
    return dataclasses.replace(GroupedShape(kind, groups, m, n, k).gemm, accumulate_fp32=False)


def _regime(seconds: float) -> str:
    return ("under " if seconds < HOST_FLOOR_S else "at least ") + f"{HOST_FLOOR_S * 1e6:g} µs"


def _summary(errors: list[float]) -> dict[str, float]:
    return {
        "n": len(errors),
        "median": round(statistics.median(errors), 4),
        "mean_abs": round(statistics.fmean(abs(e) for e in errors), 4),
        "min": round(min(errors), 4),
        "max": round(max(errors), 4),
    }


def error_rows(meas: Measurements, hw: HardwareProfile) -> list[dict[str, Any]]:
    """Each measured shape: measured, priced before (no grouped points) and after."""
    before = _without_points(hw)
    rows = []
    for r in meas.grouped_gemms:
        shape = _gemm(r.kind, r.groups, r.m, r.n, r.k)
        rows.append(
            {
                "model": r.model, "kind": r.kind, "groups": r.groups,
                "tokens": tokens_per_expert(r.kind, r.m, r.k), "measured_s": r.seconds,
                "before_s": gemm_time_s(shape, before, Dtype.BF16),
                "after_s": grouped_gemm_time_s(r.kind, shape, hw),
                "tflop_per_s": shape.flops / r.seconds / 1e12,
                "regime": _regime(r.seconds),
            }
        )  # fmt: skip
    return rows


def error_tables(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """{by: {value: {"before": summary, "after": summary}}} for by in model, kind, tokens, G."""
    tables: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for by in ("model", "kind", "tokens", "groups", "regime"):
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            groups[str(row[by])].append(row)
        groups["all"] = rows
        tables[by] = {
            value: {
                when: _summary([r[f"{when}_s"] / r["measured_s"] - 1 for r in members])
                for when in ("before", "after")
            }
            for value, members in groups.items()
        }
    return tables


def burst_check(meas: Measurements, hw: HardwareProfile, followup: dict[str, Any]) -> dict[str, Any]:
    """The evidence on burst vs sustained (module docstring, 2)."""
    sustained = {(r.kind, r.groups, r.m, r.n, r.k): r for r in meas.grouped_gemms}
    idle_first = [
        {"kind": f["kind"], "followup_s": f["seconds"], "microbench_s": sustained[key].seconds,
         "ratio": round(sustained[key].seconds / f["seconds"], 3), "followup_power_w": f["power_w"]}
        for f in followup["grouped_loop"]
        if f["impl"] == "grouped_mm"
        and (key := (f["kind"], f["groups"], f["m"], f["n"], f["k"])) in sustained
    ]  # fmt: skip
    warmup = meas.warmup or {}
    m, k, n = warmup.get("heat_gemm_mkn", (8192, 4096, 28672))
    dense = next(x for x in meas.modern if x.name == "fc1.gemm_bf16" and list(x.dims) == [m, n, k])
    grouped = sustained[("fc1", 1, m, n, k)]
    ceiling = sustained_ceiling_tflop_per_s(hw)
    rates = {key: 2 * r.groups * r.m * r.n * r.k / r.seconds / 1e12 for key, r in sustained.items()}
    above = [sustained[key] for key, rate in rates.items() if rate > ceiling]

    def sensors(records: list[Any]) -> dict[str, float]:
        clocks = [x.sm_clock_mhz for x in records if x.sm_clock_mhz]
        power = [x.power_w for x in records if x.power_w]
        return {"n": len(records), "median_mhz": statistics.median(clocks),
                "share_at_1950_mhz_or_more": round(sum(c >= 1950 for c in clocks) / len(clocks), 3),
                "median_w": round(statistics.median(power), 1)}  # fmt: skip

    return {
        "idle_then_sustained": idle_first,
        "heat_shape_tflop_per_s": {
            "warmup_settled": warmup.get("settled_tflop_per_s"), "warmup_mhz": warmup.get("sm_clock_mhz"),
            "dense_per_kernel": round(dense.flops / dense.seconds / 1e12, 1),
            "grouped_g1": round(grouped.flops / grouped.seconds / 1e12, 1),
            "profile_ceiling": round(ceiling, 1),
        },
        "above_ceiling": {
            "n": len(above), "max_tflop_per_s": round(max(rates.values()), 1),
            **{f"above_{key}": value for key, value in sensors(above).items() if key != "n"},
        },
        "sensors_grouped": sensors(list(meas.grouped_gemms)),
        "sensors_dense": sensors(list(meas.gemms)),
    }  # fmt: skip


def held_out(hw: HardwareProfile, followup: dict[str, Any]) -> list[dict[str, Any]]:
    """The shipped layouts' six GEMMs: followup's grouped / loop times against the profile."""
    before = _without_points(hw)
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for f in followup["grouped_loop"]:
        shape = _gemm(f["kind"], f["groups"], f["m"], f["n"], f["k"])
        row = rows.setdefault(
            (f["model"], f["kind"]),
            {"model": f["model"], "kind": f["kind"], "groups": f["groups"],
             "tokens": tokens_per_expert(f["kind"], f["m"], f["k"]),
             "placement": grouped_placement(f["kind"], shape, list(hw.compute.grouped_gemm_points)),
             "before_s": gemm_time_s(shape, before, Dtype.BF16),
             "after_s": grouped_gemm_time_s(f["kind"], shape, hw)},
        )  # fmt: skip
        row[f"{f['impl']}_s"] = f["seconds"]
    return list(rows.values())


def main() -> None:
    hw = load_hardware("h100-sxm5-80gb")
    meas = Measurements.from_json((RUN / "microbench.json").read_text())
    followup = json.loads((RUN / "followup.json").read_text())
    rows = error_rows(meas, hw)
    result = {
        "errors": error_tables(rows),
        "burst": burst_check(meas, hw, followup),
        "held_out": held_out(hw, followup),
    }
    if "--json" in sys.argv[1:]:
        print(json.dumps(result, indent=1))
        return
    for by, table in result["errors"].items():
        print(
            f"\n| {by} | n | before: median / mean abs / min / max | after: median / mean abs / min / max |"
        )
        print("|---|---|---|---|")
        for value, s in table.items():
            b, a = s["before"], s["after"]
            print(
                f"| {value} | {b['n']} | {100 * b['median']:+.1f} / {100 * b['mean_abs']:.1f} / "
                f"{100 * b['min']:+.1f} / {100 * b['max']:+.1f} % | {100 * a['median']:+.1f} / "
                f"{100 * a['mean_abs']:.1f} / {100 * a['min']:+.1f} / {100 * a['max']:+.1f} % |"
            )
    print("\nburst / sustained:")
    print(json.dumps(result["burst"], indent=1))
    header = (
        "model",
        "kind",
        "G",
        "M",
        "placement",
        "grouped_mm µs",
        "loop µs",
        "before µs",
        "after µs",
        "after / grouped",
    )
    print("\n| " + " | ".join(header) + " |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in result["held_out"]:
        print(
            f"| {r['model']} | {r['kind']} | {r['groups']} | {r['tokens']} | {r['placement']} | "
            f"{1e6 * r['grouped_mm_s']:.1f} | {1e6 * r['loop_s']:.1f} | {1e6 * r['before_s']:.1f} | "
            f"{1e6 * r['after_s']:.1f} | {r['after_s'] / r['grouped_mm_s']:.3f} |"
        )
    between = [r for r in result["held_out"] if r["placement"] != "measured"]
    for when in ("before", "after"):
        for impl in ("grouped_mm", "loop"):
            errors = [r[f"{when}_s"] / r[f"{impl}_s"] - 1 for r in between]
            s = _summary(errors)
            print(
                f"{when} vs {impl}, {s['n']} unmeasured shapes: median {100 * s['median']:+.1f} %, "
                f"mean |error| {100 * s['mean_abs']:.1f} %, {100 * s['min']:+.1f} to {100 * s['max']:+.1f} %"
            )


if __name__ == "__main__":
    main()
