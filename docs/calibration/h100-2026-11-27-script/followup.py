"""Follow-up measurements on one H100, after `scripts/gpu_calibrate.sh` (2026-11-27).

    OUT=out/followup python3 docs/calibration/h100-2026-11-27-script/followup.py   # ~1 min

Run from the repository root with torch installed (PYTHONPATH=.). Three small measurements the
script run left open, each written to `$OUT/followup.json` as soon as it is done:

1. `tiny_layers_eager`: the microbench's tiny layers (`microbench.layer_overhead_s`) eager; the
   script's microbench runs fused, so its tiny layers are the fused layer's, and the eager paper
   grid's host terms (issue 20) need the eager ones of the same machine.
2. `moe_sweep`: the torch MoE MLP block (`host_graph.measure_moe_case`) at h 2048, f 768 over
   G = 1 ... 32 local experts and T = 1024 / 4096 tokens per expert: how its host issue time and
   its time from an idle GPU grow with the experts a rank loops over (issue 18).
3. `grouped_loop`: each shipped MoE layout's six expert GEMMs at its own G and M
   (`calibration.grouped_shapes`) as a loop of one GEMM per expert (Megatron's SequentialMLP;
   TE's GroupedLinear also issues one cuBLAS GEMM per expert) beside `torch._grouped_mm`.

The eager paper grid over all 96 layers runs separately (`layer_timing --layer-mode eager`).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

from simcluster.calibration.grouped_shapes import EXPERT_SHAPES, grouped_shape
from simcluster.config.choices import LayerMode
from simcluster.profiler.bench.device_info import describe_device
from simcluster.profiler.bench.grouped_gemm import _time_one
from simcluster.profiler.bench.host_graph import measure_moe_case
from simcluster.profiler.bench.kernels import BuildContext
from simcluster.profiler.bench.microbench import layer_overhead_s
from simcluster.profiler.bench.sustained import GpuSensors
from simcluster.profiler.bench.timing import Timer, TimingPolicy

# each shipped layout's (G, M): calibration/grouped_shapes.py's module docstring
SHIPPED = {
    "mixtral-8x7b": (1, 8192),
    "qwen3-30b-a3b": (8, 4096),
    "qwen3-235b-a22b": (4, 4096),
    "gpt-oss-120b": (8, 1024),
    "deepseek-v3": (4, 4096),
}
KINDS = ("fc1", "fc1.dgrad", "fc1.wgrad", "fc2", "fc2.dgrad", "fc2.wgrad")


def main() -> None:
    out = Path(os.environ.get("OUT", "out/followup")) / "followup.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    quick = dev.type != "cuda"
    sensors = GpuSensors(dev)
    result: dict = {"device": asdict(describe_device(dev)), "command": " ".join(sys.argv)}

    def save() -> None:
        out.write_text(json.dumps(result, indent=1))

    def step(name: str, fn) -> None:  # noqa: ANN001
        start = time.perf_counter()
        try:
            result[name] = fn()
        except Exception:  # one failing step must not lose the others
            result[name + "_error"] = traceback.format_exc()[-800:]
        print(f"{name}: {time.perf_counter() - start:.1f} s", flush=True)
        save()

    def tiny() -> list:
        _, runs = layer_overhead_s(dev, quick, LayerMode.EAGER)
        return [asdict(r) for r in runs]

    def sweep() -> list:
        rows = []
        cases = (
            [("sweep", 64, g, 32, 32, 0) for g in (1, 4)]
            if quick
            else [
                ("sweep", 2048, g, t, 768, 0)
                for t in (1024, 4096)
                for g in (1, 2, 4, 8, 16, 32)
                if g * t <= 65536
            ]
        )
        for case in cases:
            row = measure_moe_case(case, dev, 3 if quick else 10)
            row["sm_clock_mhz"], row["power_w"] = sensors.read()
            rows.append(row)
        return rows

    def grouped() -> list:
        timer = Timer(dev, TimingPolicy.for_device(dev.type))
        ctx = BuildContext(dev, torch.bfloat16 if dev.type == "cuda" else torch.float32, torch.Generator(dev))
        rows = []
        for expert in EXPERT_SHAPES:
            g, m = SHIPPED[expert.model]
            if quick:
                g, m = 2, 16
            for kind in KINDS[: 1 if quick else None]:
                shape = grouped_shape(kind, g, m, expert)
                if quick:
                    shape = type(shape)(kind, g, 16, 32, 24, expert.model)
                for impl in ("grouped_mm", "loop"):
                    try:
                        used, seconds, spread = _time_one(timer, ctx, shape, impl)
                    except (RuntimeError, TypeError, NotImplementedError) as error:
                        rows.append(
                            {**asdict(shape), "impl": impl, "error": str(error).splitlines()[0][:160]}
                        )
                        continue
                    clock, power = sensors.read()
                    rows.append({**asdict(shape), "impl": used, "seconds": seconds, "spread": spread,
                                 "sm_clock_mhz": clock, "power_w": power})  # fmt: skip
        return rows

    step("tiny_layers_eager", tiny)
    step("moe_sweep", sweep)
    step("grouped_loop", grouped)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
