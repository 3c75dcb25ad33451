"""The H100 profile's measured compute constants, derived from the project's own H100
measurements, and the per-layer check against the three torch.compile'd layers (issue 20).

    python benchmarks/h100_measured.py                # predicted vs compiled layers
    python benchmarks/h100_measured.py --profile P    # the same check for another profile
    python benchmarks/h100_measured.py --constants    # what hwprofiles/h100-sxm5-80gb.yaml holds
    python benchmarks/h100_measured.py --json
    python benchmarks/h100_measured.py --apportion-from OLD.yaml   # per-category change from OLD

Every constant is read from docs/calibration/h100-2026-11-26/ (file and field named beside
it, README there for how each was measured). Nothing is fitted: the compiled layers are the
check, not an input, and no published run is read. `tests/config/test_config_h100_measured.py`
holds the shipped profile to these values.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simcluster.calibration.check import ONE_DEVICE  # noqa: E402
from simcluster.calibration.shapes import standin_ops  # noqa: E402
from simcluster.config.choices import Dtype  # noqa: E402
from simcluster.config.hardware import HardwareProfile, load_hardware  # noqa: E402
from simcluster.costs.chunk import op_time_s, price_ops  # noqa: E402
from simcluster.costs.compute import elementwise_kind, kind_efficiency  # noqa: E402
from simcluster.workload.embedding import (  # noqa: E402
    CROSS_ENTROPY_BACKWARD_BYTES_PER_LOGIT,
    CROSS_ENTROPY_FORWARD_BYTES_PER_LOGIT,
)
from simcluster.workload.layer import layer_ops  # noqa: E402
from simcluster.workload.layer_config import LayerConfig  # noqa: E402
from simcluster.workload.ops import Op, OpKind  # noqa: E402

DATA = ROOT / "docs" / "calibration" / "h100-2026-11-26"
# The two runs of scripts/gpu_calibrate.sh on two more H100 SXM machines (READMEs there): their
# fused microbench times each kernel with the host ahead, where measure2.py timed each compiled
# call alone (its rates include the call's issue time: docs/calibration/h100_apportioning.md)
SCRIPT_MICROBENCH = (
    ROOT / "docs" / "calibration" / "h100-2026-11-26-script" / "microbench.json",
    ROOT / "docs" / "calibration" / "h100-2026-11-27-script" / "microbench.json",
)
SCRIPT_STATIC_ROWS = (  # the paper-grid sites with static row lengths (script A's second file)
    ROOT / "docs" / "calibration" / "h100-2026-11-26-script" / "microbench_static_rows.json",
    ROOT / "docs" / "calibration" / "h100-2026-11-27-script" / "microbench.json",
)
SWIGLU_DIMS = [8192, 28672]  # Llama 3 8B at t 1: [tokens, 2·ffn], the largest fused SwiGLU timed
BIG_SITE_BYTES = 2e8  # fused sites above this are past the host-bound sizes (second_h100_run.md)
PEAK_BF16_TFLOP_PER_S, PEAK_FP8_TFLOP_PER_S = 989, 1979  # H100 SXM datasheet (the profile's gpu:)
HBM_GB_PER_S = 3350  # H100 SXM datasheet
ADAMW_BYTES_PER_PARAM = 28  # torch fused AdamW: reads param, grad, m, v (16), writes param, m, v (12)
SUSTAINED_BF16, SUSTAINED_FP8 = 1, 5  # gemm_burst_vs_sustained.json phases: 30 s bf16, 15 s FP8
LLAMA3_8B = 0  # layers_kernels_gemm_clocks.json kernels[0]: Llama 3 8B, t 1, s 8192, eager
ATTENTION_FWD_KERNELS = ("flash_fprop",)
ATTENTION_BWD_KERNELS = ("flash_bprop", "compute_dot_do_o", "convert_dq", "fmha_reduce_head")
# Kinds (`costs.compute.elementwise_kind`) priced from the compiled kernels of
# elementwise_host_optimizer.json: the kind's forward, its backward taking the same rate.
COMPILED_KINDS = {
    "layernorm": "rmsnorm.fwd",
    "rope": "rope.fwd(q)",
    "bias_dropout_add": "bias_dropout_add.fwd",
}  # SwiGLU and bias-GeLU: `fused_activation_efficiencies`


# The eager (unfused) rows of elementwise_host_optimizer.json, each with the bytes its PyTorch
# kernels really move at the file's Llama 3 8B shapes (measure2.py `elementwise`: T 8192 tokens,
# H 4096, FF 14336, A 32 heads of D 128, bf16; `eager_s` times the whole kernel sequence):
#   swiglu  `F.silu(a1) * a2` on the chunk(2, -1) halves of [T, 2FF]: silu reads a1 and writes
#           [T, FF], the mul reads two [T, FF] and writes one: 5·T·FF·2 bytes
#   rope    four muls of a chunk(2, -1) half of q [T, A, D] by cos / sin [T, D/2] (half read,
#           half written, cos read), a sub and an add (two halves read, one written), the cat
#           (two halves read, q written): 18·(T·A·D) + 4·T·D bytes
#   bias_dropout_add  `x + bias` (read, write), `F.dropout` (read, write, bool mask),
#           `residual + ...` (two read, one written): 15·T·H bytes (+ the bias, 2·H)
EAGER_T, EAGER_H, EAGER_FF, EAGER_A, EAGER_D = 8192, 4096, 14336, 32, 128
EAGER_KERNEL_BYTES = {
    "swiglu.fwd": 5 * EAGER_T * EAGER_FF * 2,
    "rope.fwd(q)": 18 * EAGER_T * EAGER_A * EAGER_D + 4 * EAGER_T * EAGER_D,
    "bias_dropout_add.fwd": 15 * EAGER_T * EAGER_H + 2 * EAGER_H,
}
# gpt-oss's eager kernels (workload.gptoss_experts) -> the eager rows that run like them:
# the GLU clamps read the chunk(2, -1) halves of fc1's output and end in a cat, as the eager
# SwiGLU and RoPE do; the fc2 bias's `t + b * p` are broadcast adds on contiguous rows, as the
# eager bias-dropout-add's are.
EAGER_KINDS = {
    "glu_clamp": ("swiglu.fwd", "rope.fwd(q)"),
    "expert_bias": ("bias_dropout_add.fwd",),
}


def _read(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def _sig(value: float, digits: int = 4) -> float:
    return float(f"{value:.{digits}g}")


def gemm_points(dtype: str) -> list[dict[str, float]]:
    """(m tokens, n out, k in) rates: the 13 shard shapes of layers_kernels_gemm_clocks.json
    `gemm` (bf16_tflops / fp8_tflops, 0.4 s each after the layer runs: at the power cap), the
    8B fc1 shape taken from the 30 s (bf16) / 15 s (FP8) sustained run of
    gemm_burst_vs_sustained.json instead (`tflops_median`)."""
    burst = _read("gemm_burst_vs_sustained.json")
    m, k, n = burst["shape"]
    phase = burst["phases"][SUSTAINED_BF16 if dtype == "bf16" else SUSTAINED_FP8]
    points = [{"m": m, "n": n, "k": k, "tflop_per_s": _sig(phase["tflops_median"])}]
    for row in _read("layers_kernels_gemm_clocks.json")["gemm"]:
        if (row["M"], row["K"], row["N"]) != (m, k, n):
            points.append(
                {"m": row["M"], "n": row["N"], "k": row["K"], "tflop_per_s": _sig(row[f"{dtype}_tflops"])}
            )
    return points


def gemm_ceilings() -> dict[str, float]:
    """Sustained rate of the 8B fc1 GEMM over the datasheet peak (bf16 687 / 989, FP8 1214 / 1979)."""
    phases = _read("gemm_burst_vs_sustained.json")["phases"]
    return {
        "gemm_max_efficiency": _sig(phases[SUSTAINED_BF16]["tflops_median"] / PEAK_BF16_TFLOP_PER_S),
        "fp8_gemm_max_efficiency": _sig(phases[SUSTAINED_FP8]["tflops_median"] / PEAK_FP8_TFLOP_PER_S),
    }


def copy_efficiency() -> float:
    """microbench.json: a 4.3 GB device copy (read + write), copy_bytes / copy_s / HBM."""
    bench = _read("microbench.json")
    return _sig(bench["copy_bytes"] / bench["copy_s"] / 1e9 / HBM_GB_PER_S, 3)


def kind_efficiencies() -> dict[str, float]:
    """Fraction of HBM per kind: the compiled kernels (`compiled_gbps`; bias_gelu, not
    measured, at swiglu's: a declared assumption), cross-entropy (its
    eager fwd + bwd time over the op graph's 30 + 14 bytes per logit) and fused AdamW
    (`step_s` over 28 bytes per parameter), all in elementwise_host_optimizer.json."""
    data = _read("elementwise_host_optimizer.json")
    rows = {row["op"]: row for row in data["elementwise"]}
    kinds = {kind: _sig(rows[op]["compiled_gbps"] / HBM_GB_PER_S, 3) for kind, op in COMPILED_KINDS.items()}
    kinds.update(fused_activation_efficiencies())
    entropy = rows["cross_entropy.fwd+bwd (fp32 upcast)"]
    logits = entropy["bytes"] / 12  # the file's bytes are 12 per logit (2 + 4 + 4 + 2)
    per_logit = CROSS_ENTROPY_FORWARD_BYTES_PER_LOGIT + CROSS_ENTROPY_BACKWARD_BYTES_PER_LOGIT
    kinds["cross_entropy"] = _sig(per_logit * logits / entropy["eager_s"] / 1e9 / HBM_GB_PER_S, 3)
    kinds.update(eager_kind_efficiencies())
    fused = next(row for row in data["optimizer"] if row["fused"])
    kinds["optimizer"] = _sig(
        ADAMW_BYTES_PER_PARAM * fused["params"] / fused["step_s"] / 1e9 / HBM_GB_PER_S, 3
    )
    return kinds


def fused_activation_efficiencies() -> dict[str, float]:
    """The fused activations, forward and backward, from the two script runs' fused microbench
    (mean over the two machines): SwiGLU at the Llama 3 8B shape (`modern`, `SWIGLU_DIMS`),
    bias-GeLU the median of each machine's paper-grid GeLU sites above `BIG_SITE_BYTES`
    (`elementwise` gelu.forward / gelu.backward). Each rate is the records' bytes over their
    seconds, over the datasheet HBM."""
    swiglu: dict[str, list[float]] = {"swiglu": [], "swiglu.bwd": []}
    for path in SCRIPT_MICROBENCH:
        for m in json.loads(path.read_text())["modern"]:
            fused_swiglu = m.get("layer_mode") == "fused" and m["name"].startswith("swiglu.")
            if fused_swiglu and m["dims"] == SWIGLU_DIMS:
                kind = "swiglu.bwd" if m["name"].endswith("backward") else "swiglu"
                swiglu[kind].append(m["bytes_moved"] / m["seconds"] / 1e9)
    gelu: dict[str, list[float]] = {"bias_gelu": [], "bias_gelu.bwd": []}
    for path in SCRIPT_STATIC_ROWS:
        sites = json.loads(path.read_text())["elementwise"]
        for kind, name in (("bias_gelu", "gelu.forward"), ("bias_gelu.bwd", "gelu.backward")):
            big = [e for e in sites if e["name"] == name and e["bytes_moved"] >= BIG_SITE_BYTES]
            gelu[kind].append(statistics.median(e["bytes_moved"] / e["seconds"] / 1e9 for e in big))
    rates = swiglu | gelu
    assert all(len(v) == len(SCRIPT_MICROBENCH) for v in rates.values()), rates
    return {kind: _sig(statistics.mean(v) / HBM_GB_PER_S, 3) for kind, v in rates.items()}


def eager_kind_efficiencies() -> dict[str, float]:
    """Fraction of HBM that bare PyTorch kernels reach, per gpt-oss kind (`EAGER_KINDS`): the
    mean over its eager rows of the kernels' real bytes (`EAGER_KERNEL_BYTES`) over `eager_s`."""
    rows = {row["op"]: row for row in _read("elementwise_host_optimizer.json")["elementwise"]}
    rates = {op: size / rows[op]["eager_s"] / 1e9 / HBM_GB_PER_S for op, size in EAGER_KERNEL_BYTES.items()}
    return {kind: _sig(statistics.mean(rates[op] for op in ops), 3) for kind, ops in EAGER_KINDS.items()}


def _sdpa_rates() -> dict[tuple[int, bool], tuple[float, float]]:
    """microbench.json `attention`: (seq, causal) -> (fwd, bwd) TFLOP/s, FLOPs counted as the
    profile counts them (4·b·heads·s²·d, half of it causal; backward 2.5 × forward)."""
    rates = {}
    for row in _read("microbench.json")["attention"]:
        flops = 4 * row["batch"] * row["heads"] * row["seq_length"] ** 2 * row["head_dim"]
        flops *= 0.5 if row["causal"] else 1.0
        fwd = flops / row["forward_s"] / 1e12
        bwd = 2.5 * flops / (row["total_s"] - row["forward_s"]) / 1e12
        rates[(row["seq_length"], row["causal"])] = (fwd, bwd)
    return rates


def in_layer_attention_s() -> tuple[float, float, float]:
    """(forward s, backward s, causal forward FLOPs) of cuDNN attention inside the eager
    Llama 3 8B layer (layers_kernels_gemm_clocks.json kernels[0], per repeat): 32 heads,
    s 8192, head dim 128, causal."""
    table = _read("layers_kernels_gemm_clocks.json")["kernels"][LLAMA3_8B]

    def total_s(parts: tuple[str, ...]) -> float:
        us = sum(k["total_us"] for k in table["kernels"] if any(p in k["name"] for p in parts))
        return us / 1e6 / table["reps"]

    flops = 4 * 32 * 8192**2 * 128 * 0.5
    return total_s(ATTENTION_FWD_KERNELS), total_s(ATTENTION_BWD_KERNELS), flops


def flash_tables() -> dict[str, list[list[float]]]:
    """The profile's cuDNN tables from the 12 SDPA shapes of microbench.json (16 heads,
    batch × s = 16k, head dim 128: the FlashAttention-3 paper's method), each scaled by what
    the same kernel kept inside the real 8B layer at s 8192 (`in_layer_attention_s`) over the
    microbench's causal rate there. The causal ratio is the forward's; the backward table is
    the causal backward over that ratio, so that bwd × ratio is the measured causal backward."""
    rates = _sdpa_rates()
    fwd_s, bwd_s, flops = in_layer_attention_s()
    fwd_scale = flops / fwd_s / 1e12 / rates[(8192, True)][0]
    bwd_scale = 2.5 * flops / bwd_s / 1e12 / rates[(8192, True)][1]
    lengths = sorted({seq for seq, _ in rates})
    fwd, bwd, causal = [], [], []
    for seq in lengths:
        ratio = rates[(seq, True)][0] / rates[(seq, False)][0]
        causal.append([seq, _sig(ratio, 3)])
        fwd.append([seq, round(rates[(seq, False)][0] * fwd_scale)])
        bwd.append([seq, round(rates[(seq, True)][1] / ratio * bwd_scale)])
    return {
        "flash_attention_fwd_tflop_per_s": fwd,
        "flash_attention_bwd_tflop_per_s": bwd,
        "flash_attention_causal_efficiency": causal,
    }


# Public burst figures the H100 profile cited before it was measured (its sources name them):
MAMF_BF16_TFLOP_PER_S = 794.5  # stas00/ml-engineering MAMF table, H100 SXM BF16 (best of a shape sweep)
MAMF_FP8_TFLOP_PER_S = 1402.6  # the same table, FP8 e4m3
AZURE_FP8_8192_TFLOP_PER_S = 1290.1  # Azure/AI-benchmarking-guide ND H100 v5, cuBLASLt FP8 at 8192³


def sustained_ratios() -> dict[str, float]:
    """What this H100 sustains over the public figures other profiles are built from, the
    lesson carried to them as a declared assumption: the bf16 and FP8 sustained 8B fc1
    rates over the MAMF bests, and the sustained FP8 rate at 8192³ (`gemm` 8192³ fp8_tflops)
    over Azure's cuBLASLt sweep at that shape (10,000 warmup iterations, fast accumulation)."""
    phases = _read("gemm_burst_vs_sustained.json")["phases"]
    cube = next(
        row for row in _read("layers_kernels_gemm_clocks.json")["gemm"] if row["M"] == row["K"] == row["N"]
    )
    return {
        "mamf_bf16": _sig(phases[SUSTAINED_BF16]["tflops_median"] / MAMF_BF16_TFLOP_PER_S),
        "mamf_fp8": _sig(phases[SUSTAINED_FP8]["tflops_median"] / MAMF_FP8_TFLOP_PER_S),
        "cublaslt_fp8": _sig(cube["fp8_tflops"] / AZURE_FP8_8192_TFLOP_PER_S),
    }


def constants() -> dict[str, Any]:
    """Every measured compute constant of hwprofiles/h100-sxm5-80gb.yaml."""
    return {
        **gemm_ceilings(),
        "memory_bound_efficiency": copy_efficiency(),
        "memory_bound_efficiency_by_kind": kind_efficiencies(),
        "gemm_points": gemm_points("bf16"),
        "fp8_gemm_points": gemm_points("fp8"),
        **flash_tables(),
    }


def _measured_layer_ops(layer: dict[str, Any]) -> Any:
    """The op graph of one layer of layers_eager_vs_compiled.json: t 1, bf16, as measured."""
    cfg = LayerConfig(
        seq_length=layer["seq_length"], micro_batch_size=layer["micro_batch_size"], tp=1, dtype="bf16",
        **layer["model"],
    )  # fmt: skip
    return layer_ops(cfg)


def layer_checks(hw: HardwareProfile) -> list[dict[str, Any]]:
    """The three layers of layers_eager_vs_compiled.json (t 1, no collectives) priced as
    `check-profile` prices a layer on one device, against their compiled medians."""
    rows = []
    for layer in _read("layers_eager_vs_compiled.json")["layers"]:
        ops = _measured_layer_ops(layer)
        phases = (ops.forward, ops.backward, ops.recompute)
        predicted_s = sum(
            price_ops(standin_ops(seq, 1), hw, ONE_DEVICE, Dtype.BF16).total_s for seq in phases
        )
        rows.append(
            {
                "layer": layer["name"],
                "predicted_s": predicted_s,
                "compiled_s": layer["compiled_s"],
                "eager_s": layer["eager_s"],
                "error": predicted_s / layer["compiled_s"] - 1,
            }
        )
    return rows


def _category(op: Op, hw: HardwareProfile) -> str:
    """The apportioning's columns: GEMM, attention, memory-bound kinds the measured profile
    prices from fused kernels, and memory-bound work at the copy rate."""
    if op.kind is OpKind.ELEMENTWISE:
        fused = kind_efficiency(hw, elementwise_kind(op)) is not None
        return "memory-bound (fused kinds)" if fused else "memory-bound (copy rate)"
    return {OpKind.GEMM: "GEMM", OpKind.ATTENTION: "attention"}.get(op.kind, "other")


def apportion(before: HardwareProfile, after: HardwareProfile) -> list[dict[str, Any]]:
    """Per layer: each category's seconds under `before` and `after` (categories of the
    `after` profile's kinds), so each correction's contribution is after - before; ops
    are priced one by one (no collectives on one device), so the contributions add up."""
    rows = []
    for layer in _read("layers_eager_vs_compiled.json")["layers"]:
        ops = _measured_layer_ops(layer)
        seconds: dict[str, list[float]] = {}
        for phase in (ops.forward, ops.backward, ops.recompute):
            for op in standin_ops(phase, 1):
                pair = seconds.setdefault(_category(op, after), [0.0, 0.0])
                pair[0] += op_time_s(op, before, ONE_DEVICE, Dtype.BF16)
                pair[1] += op_time_s(op, after, ONE_DEVICE, Dtype.BF16)
        rows.append({"layer": layer["name"], "compiled_s": layer["compiled_s"], "seconds": seconds})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--profile", default="h100-sxm5-80gb", help="profile name or path")
    parser.add_argument("--constants", action="store_true", help="print the derived constants instead")
    parser.add_argument("--json", action="store_true", help="JSON instead of a table")
    parser.add_argument(
        "--apportion-from",
        metavar="PROFILE",
        help="split the change from this (earlier) profile by op category",
    )
    args = parser.parse_args()
    if args.apportion_from:
        rows = apportion(load_hardware(args.apportion_from), load_hardware(args.profile))
        print(json.dumps(rows, indent=1))
        return
    if args.constants:
        print(json.dumps({**constants(), "sustained_ratios": sustained_ratios()}, indent=1))
        return
    rows = layer_checks(load_hardware(args.profile))
    if args.json:
        print(json.dumps({"profile": args.profile, "layers": rows}, indent=1))
        return
    for row in rows:
        print(
            f"{row['layer']:16s} predicted {row['predicted_s'] * 1e3:7.2f} ms   compiled "
            f"{row['compiled_s'] * 1e3:7.2f} ms   eager {row['eager_s'] * 1e3:7.2f} ms   {row['error']:+.1%}"
        )
    errors = [abs(row["error"]) for row in rows]
    print(f"{args.profile}: mean |error| {statistics.mean(errors):.1%}, worst {max(errors):.1%}")


if __name__ == "__main__":
    main()
