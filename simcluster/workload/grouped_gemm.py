"""The routed experts' grouped GEMMs named by kind (issue 18): fc1 / fc2 forward, their input
gradient (".dgrad") and weight gradient (".wgrad"), as `workload.moe_layer` builds them
(`Module.EXPERT_FC1` / `EXPERT_FC2`, batch = the G local experts).

Standard library only: the microbench's grid (`calibration.grouped_shapes`, run on a bare GPU
machine), the fit and the pricing (`costs.grouped_gemm`) share these names and axes.
"""

from __future__ import annotations

from simcluster.workload.ops import Module, Op, OpKind, Pass

GROUPED_KINDS = ("fc1", "fc2", "fc1.dgrad", "fc2.dgrad", "fc1.wgrad", "fc2.wgrad")
_FC = {Module.EXPERT_FC1: "fc1", Module.EXPERT_FC2: "fc2"}
_PASS = {Pass.FORWARD: "", Pass.INPUT_GRAD: ".dgrad", Pass.WEIGHT_GRAD: ".wgrad"}


def expert_gemm_kind(op: Op) -> str | None:
    """The grouped-GEMM kind of a routed expert's GEMM ("fc1", "fc2.dgrad", "fc1.wgrad", ...);
    None for any other op."""
    if op.kind is not OpKind.GEMM or op.module not in _FC:
        return None
    return _FC[op.module] + _PASS[op.pass_]


def tokens_per_expert(kind: str, m: int, k: int) -> int:
    """The token axis of a grouped GEMM of `kind` in the op graph's coordinates (C[m, n] =
    A[m, k] B[k, n]): k for a wgrad (dW = Xᵀ·dY sums over the expert's tokens), m otherwise."""
    return k if kind.endswith(".wgrad") else m


def series_key(kind: str, groups: int, m: int, n: int, k: int) -> tuple[int, int, int]:
    """(G, the two dims that are not the token axis): what one measured curve holds fixed."""
    return (groups, m, n) if kind.endswith(".wgrad") else (groups, n, k)
