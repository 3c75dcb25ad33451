"""FP8 routed experts with the measured bf16 grouped ratio carried over (issue 18;
docs/calibration/grouped_gemm.md, 'FP8 experts'):

    PYTHONPATH=. python docs/calibration/grouped_fp8_carry.py [--json]

1. Every expert GEMM of the H100 FP8 published runs (benchmarks/public_runs/*h100-fp8*.yaml
   with model.moe): kind, G, m, n, k, r = measured bf16 grouped time / bf16 GEMM-model time
   (`costs.grouped_gemm.grouped_gemm_ratio`), the FP8 GEMM model's time, the quantized floor
   and the carried price (`quantized_expert_gemm_time_s`), in µs.
2. DeepGEMM's grouped FP8 table (the rows of docs/calibration/grouped_gemm_compare.py): the
   H100's per-tensor FP8 price of each shape without and with the carry-over, in TFLOP/s.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from simcluster.config.choices import Dtype, Fp8Recipe
from simcluster.config.hardware import HardwareProfile, load_hardware
from simcluster.config.scenario import load_scenario_and_hardware
from simcluster.costs.compute import quantized_gemm_floor_s, quantized_gemm_time_s
from simcluster.costs.grouped_gemm import grouped_gemm_ratio, quantized_expert_gemm_time_s
from simcluster.workload.grouped_gemm import expert_gemm_kind
from simcluster.workload.model import build_workload
from simcluster.workload.ops import GemmShape, Module, Op, OpKind, Pass

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from grouped_gemm_compare import DEEPGEMM, FORWARD  # noqa: E402

RECIPE = Fp8Recipe.DELAYED  # the public H100 rows' fp8cs is per-tensor current scaling: same GEMM


def public_fp8_rows() -> list[dict[str, object]]:
    rows = []
    for path in sorted((ROOT / "benchmarks" / "public_runs").glob("*h100-fp8*.yaml")):
        scenario, hw = load_scenario_and_hardware(path)
        if scenario.model.moe is None:
            continue
        workload = build_workload(scenario, hw.fp8_weight_copies)
        seg = next(s for st in workload.stages for c in st.chunks for s in c.segments if s.kind.moe)
        for op in seg.layer.forward + seg.layer.backward:
            kind = expert_gemm_kind(op)
            if kind is None or op.gemm is None:
                continue
            g, dtype, recipe = op.gemm, scenario.training.dtype, scenario.training.fp8_recipe
            carried = quantized_expert_gemm_time_s(op, hw, dtype, recipe)
            rows.append(
                {
                    "run": path.stem, "kind": kind, "groups": g.batch, "m": g.m, "n": g.n, "k": g.k,
                    "ratio": round(grouped_gemm_ratio(kind, g, hw), 3),
                    "fp8_model_us": round(quantized_gemm_time_s(g, hw, dtype, recipe) * 1e6, 1),
                    "floor_us": round(quantized_gemm_floor_s(g, hw, dtype, recipe) * 1e6, 1),
                    "carried_us": None if carried is None else round(carried * 1e6, 1),
                }
            )  # fmt: skip
    return rows


def deepgemm_rows(hw: HardwareProfile) -> list[dict[str, object]]:
    rows = []
    for layout, groups, m, n, k, feb, mar in DEEPGEMM:
        shape = GemmShape(m, n, k, groups)
        op = Op("expert", OpKind.GEMM, gemm=shape, module=_MODULE[FORWARD[n]], pass_=Pass.FORWARD)
        carried = quantized_expert_gemm_time_s(op, hw, Dtype.FP8, RECIPE)
        assert carried is not None
        rows.append(
            {
                "layout": layout, "groups": groups, "m": m, "n": n, "k": k,
                "deepgemm_fp8_tflop_per_s": [feb, mar],
                "ours_fp8": round(shape.flops / quantized_gemm_time_s(shape, hw, Dtype.FP8, RECIPE) / 1e12),
                "ours_fp8_carried": round(shape.flops / carried / 1e12),
            }
        )  # fmt: skip
    return rows


_MODULE = {"fc1": Module.EXPERT_FC1, "fc2": Module.EXPERT_FC2}


def main() -> None:
    hw = load_hardware("h100-sxm5-80gb")
    result = {"public_h100_fp8_expert_gemms": public_fp8_rows(), "deepgemm": deepgemm_rows(hw)}
    if "--json" in sys.argv[1:]:
        print(json.dumps(result, indent=1))
        return
    print("run | kind | G | m | n | k | r | FP8 model us | floor us | carried us")
    for row in result["public_h100_fp8_expert_gemms"]:
        print(" | ".join(str(v) for v in row.values()))
    print("\nlayout | G | M | N | K | DeepGEMM FP8 (Feb / Mar) | ours FP8 | ours FP8 carried")
    for row in result["deepgemm"]:
        print(" | ".join(str(v) for v in row.values()))


if __name__ == "__main__":
    main()
