"""How far each part of the price is from the measured layers: least squares of the measured
forward + backward times on the predicted seconds of four groups of ops.

    python -m simcluster.calibration.kind_ratio PROFILE LAYER_TIMING.json

measured_i ≈ Σ_g c_g · predicted_{i,g} over the GPU-bound runs (`check.LayerCheck.host_bound`),
with the groups: the linears' GEMMs, the attention core's batched GEMMs, its memory-bound
kernels (softmax, dropout, context copy) and every other memory-bound kernel (norms,
activations, bias-dropout-add, residual adds, the stand-in's copies). c_g = 1 means the group
is priced as it runs. A diagnostic, never a fit the profile takes: the layers are the
held-out set. The groups are collinear across the paper grid (every layer has all four), so
a ratio moves with the others; read it beside the by-kind split of check-profile.
"""

from __future__ import annotations

import sys

import numpy as np

from simcluster.calibration.check import ONE_DEVICE, compare
from simcluster.calibration.records import LayerRun
from simcluster.calibration.shapes import standin_ops
from simcluster.config.hardware import HardwareProfile, load_hardware
from simcluster.costs.chunk import op_time_s
from simcluster.costs.op_kind import ATTENTION_CORE
from simcluster.workload.layer import layer_ops
from simcluster.workload.ops import Op, OpKind

GROUPS = ("gemm", "attention_bmm", "attention_memory_bound", "other_memory_bound")


def group_of(op: Op) -> str:
    if op.kind is OpKind.GEMM:
        return "attention_bmm" if op.module in ATTENTION_CORE else "gemm"
    return "attention_memory_bound" if op.module in ATTENTION_CORE else "other_memory_bound"


def kind_ratios(run: LayerRun, hw: HardwareProfile) -> dict[str, float]:
    """Group -> least-squares ratio over the GPU-bound runs (module docstring)."""
    rows, measured = [], []
    for check in compare(run, hw):
        if check.host_bound:
            continue
        cfg = check.timing.layer_config(run.dropout_prob)
        ops = layer_ops(cfg)
        seconds = dict.fromkeys(GROUPS, 0.0)
        for seq in (ops.forward, ops.recompute, ops.backward):
            for op in standin_ops(seq, cfg.tp):
                seconds[group_of(op)] += op_time_s(op, hw, ONE_DEVICE, cfg.dtype)
        rows.append([seconds[g] for g in GROUPS])
        measured.append(check.timing.total_s)
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(measured), rcond=None)
    return {g: round(float(c), 3) for g, c in zip(GROUPS, coef, strict=True)}


if __name__ == "__main__":
    profile, layers = sys.argv[1:3]
    print(kind_ratios(LayerRun.from_json(open(layers).read()), load_hardware(profile)))
