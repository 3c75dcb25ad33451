"""FLOP counts per iteration (Korthikanti Appendix A; Narayanan et al. 2021 Eq. 3).

B is the global batch. These are the numbers MFU and HFU are reported with; the time model
prices the FLOPs the op graph really runs instead (selective recompute re-runs only the
attention core, 4Bs²h per layer, not the 12Bs²h Eq. 8 adds).
"""

from __future__ import annotations

from simcluster.config.choices import Recompute


def model_flops(B: int, s: int, L: int, h: int, v: int) -> float:
    """72·B·s·L·h²·(1 + s/(6h) + v/(12hL)) — Eq. 7, no recompute."""
    return 72.0 * B * s * L * h * h * (1 + s / (6 * h) + v / (12 * h * L))


def hardware_flops(B: int, s: int, L: int, h: int, v: int, recompute: Recompute) -> float:
    """Eq. 8 for selective recompute; Narayanan Eq. 3 (96·…) for full; Eq. 7 for none."""
    if recompute is Recompute.SELECTIVE:
        return 72.0 * B * s * L * h * h * (1 + s / (3 * h) + v / (12 * h * L))
    if recompute is Recompute.FULL:
        return 96.0 * B * s * L * h * h * (1 + s / (6 * h) + v / (16 * h * L))
    return model_flops(B, s, L, h, v)


def utilization(flops: float, iteration_time_s: float, num_gpus: int, peak_flop_per_s: float) -> float:
    """MFU / HFU: FLOPs over (time × GPUs × peak)."""
    return flops / (iteration_time_s * num_gpus * peak_flop_per_s)
