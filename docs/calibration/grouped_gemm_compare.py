"""Grouped expert GEMMs: the shipped H100 profile's prices beside DeepGEMM's published table,
and what the pricing hook would move in the shipped MoE scenarios (docs/calibration/grouped_gemm.md).

    PYTHONPATH=. python docs/calibration/grouped_gemm_compare.py [--json]

1. DeepGEMM's README tables of grouped FP8 GEMMs on an H800 (deepseek-ai/DeepGEMM README.md,
   "Grouped GEMMs for MoE models", commits 78cacf70d41d (2025-02-26) and 55ab91f72f76
   (2025-03-25, the contiguous rows re-measured)), against what `costs.compute` prices at the
   same shapes on hwprofiles/h100-sxm5-80gb.yaml: FP8 block-scaled (DeepSeek's 1×128 / 128×128
   scaling, TE's blockwise recipe) and per-tensor, and bf16.
   Beside them, bf16 as the profile's measured grouped points price it (`costs.grouped_gemm`,
   hwprofiles/h100-sxm5-80gb.yaml `compute.grouped_gemm_points`; DeepGEMM's groups are the
   DeepSeek-V3 expert's fc1 / fc2 forward shapes).
2. The shipped MoE scenarios (scenarios/moe/): each expert GEMM's G, tokens per expert and the
   rate the GEMM model gives it (the profile without its grouped points, as before they were
   measured), and the iteration time then and with grouped points that put every expert GEMM
   at `SENSITIVITY` × that rate (what a grouped curve that much slower does through
   `costs.grouped_gemm`). The measured points' own effect: docs/calibration/grouped_gemm.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from simcluster.config.choices import Dtype, Fp8Recipe
from simcluster.config.hardware import GroupedGemmPoint, HardwareProfile, load_hardware
from simcluster.config.scenario import load_scenario
from simcluster.costs.compute import fp8_gemm_time_s, gemm_time_s
from simcluster.costs.grouped_gemm import grouped_gemm_time_s
from simcluster.simulation import run_simulation
from simcluster.workload.grouped_gemm import expert_gemm_kind
from simcluster.workload.model import build_workload
from simcluster.workload.ops import GemmShape

ROOT = Path(__file__).resolve().parents[2]
SENSITIVITY = 0.8
DEEPGEMM = [  # layout, groups, M per group, N, K, TFLOPS at 78cacf7, at 55ab91f
    ("contiguous", 4, 8192, 4096, 7168, 1297, 1346),
    ("contiguous", 4, 8192, 7168, 2048, 1099, 1214),
    ("contiguous", 8, 4096, 4096, 7168, 1288, 1346),
    ("contiguous", 8, 4096, 7168, 2048, 1093, 1214),
    ("masked", 1, 1024, 4096, 7168, 1233, 1233),
    ("masked", 1, 1024, 7168, 2048, 925, 925),
    ("masked", 2, 512, 4096, 7168, 1040, 1040),
    ("masked", 2, 512, 7168, 2048, 916, 916),
    ("masked", 4, 256, 4096, 7168, 932, 932),
    ("masked", 4, 256, 7168, 2048, 815, 815),
]


FORWARD = {4096: "fc1", 7168: "fc2"}  # DeepGEMM's N: DeepSeek-V3's fc1 (2 × 2048) or fc2 (h 7168)


def tflop(shape: GemmShape, seconds: float) -> float:
    return shape.flops / seconds / 1e12


def without_points(hw: HardwareProfile) -> HardwareProfile:
    """The profile as it priced expert GEMMs before its grouped points (the GEMM model)."""
    return hw.model_copy(update={"compute": hw.compute.model_copy(update={"grouped_gemm_points": []})})


def deepgemm_rows(hw: HardwareProfile) -> list[dict[str, object]]:
    rows = []
    for layout, g, m, n, k, feb, mar in DEEPGEMM:
        shape = GemmShape(m, n, k, g)  # D[M, N] = A[M, K] · B[N, K]ᵀ per group
        rows.append(
            {
                "layout": layout, "groups": g, "m": m, "n": n, "k": k,
                "deepgemm_fp8_tflop_per_s": [feb, mar],
                "ours_fp8_blockwise": round(tflop(shape, fp8_gemm_time_s(shape, hw, Fp8Recipe.BLOCKWISE))),
                "ours_fp8_delayed": round(tflop(shape, fp8_gemm_time_s(shape, hw, Fp8Recipe.DELAYED))),
                "ours_bf16": round(tflop(shape, gemm_time_s(shape, hw, Dtype.BF16))),
                "ours_bf16_grouped": round(tflop(shape, grouped_gemm_time_s(FORWARD[n], shape, hw))),
            }
        )  # fmt: skip
    return rows


def scenario_rows(hw: HardwareProfile) -> list[dict[str, object]]:
    hw = without_points(hw)
    rows = []
    for path in sorted((ROOT / "scenarios" / "moe").glob("*.yaml")):
        scenario = load_scenario(path)
        workload = build_workload(scenario, hw.fp8_weight_copies)
        seg = next(s for s in workload.stages[0].chunks[0].segments if s.kind.moe)
        gemms = [(expert_gemm_kind(op), op.gemm) for op in seg.layer.forward + seg.layer.backward]
        priced = {kind: (g, tflop(g, gemm_time_s(g, hw))) for kind, g in gemms if kind and g is not None}
        points = [
            GroupedGemmPoint(kind=kind, groups=g.batch, m=g.m, n=g.n, k=g.k, tflop_per_s=SENSITIVITY * rate)
            for kind, (g, rate) in priced.items()
        ]  # fmt: skip
        compute = hw.compute.model_copy(update={"grouped_gemm_points": points})
        slower = hw.model_copy(update={"compute": compute})
        today = run_simulation(scenario, hw, steady_state=True).result.iteration_time_s
        moved = run_simulation(scenario, slower, steady_state=True).result.iteration_time_s
        fc1 = priced["fc1"][0]
        rows.append(
            {
                "scenario": path.stem, "groups": fc1.batch, "tokens_per_expert": fc1.m,
                "tflop_per_s": {kind: round(rate) for kind, (_, rate) in priced.items()},
                "iteration_s": round(today, 3), f"iteration_s_at_{SENSITIVITY:g}x": round(moved, 3),
                "change": round(moved / today - 1, 4),
            }
        )  # fmt: skip
    return rows


def main() -> None:
    hw = load_hardware("h100-sxm5-80gb")
    result = {"deepgemm": deepgemm_rows(hw), "scenarios": scenario_rows(hw)}
    if "--json" in sys.argv[1:]:
        print(json.dumps(result, indent=1))
        return
    print("| layout | G | M/group | N | K | DeepGEMM FP8 (Feb / Mar 2025) | FP8 block | FP8 delayed | bf16 | "
          "bf16 grouped |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in result["deepgemm"]:
        feb, mar = r["deepgemm_fp8_tflop_per_s"]  # type: ignore[misc]
        print(
            f"| {r['layout']} | {r['groups']} | {r['m']} | {r['n']} | {r['k']} | {feb} / {mar} | "
            f"{r['ours_fp8_blockwise']} | {r['ours_fp8_delayed']} | {r['ours_bf16']} | "
            f"{r['ours_bf16_grouped']} |"
        )
    print()
    print(f"| scenario | G | M | bf16 TFLOP/s fc1 / fc2 / fc1.dgrad / fc2.dgrad / fc1.wgrad / fc2.wgrad | "
          f"iteration s | at {SENSITIVITY:g}x | change |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in result["scenarios"]:
        rates = " / ".join(str(v) for v in r["tflop_per_s"].values())  # type: ignore[attr-defined]
        print(
            f"| {r['scenario']} | {r['groups']} | {r['tokens_per_expert']} | {rates} | {r['iteration_s']} | "
            f"{r[f'iteration_s_at_{SENSITIVITY:g}x']} | {100 * r['change']:+.1f} % |"  # type: ignore[operator]
        )


if __name__ == "__main__":
    main()
