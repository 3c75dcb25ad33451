"""The routed experts' grouped GEMMs priced from measured grouped GEMMs (issue 18).

Megatron-core runs the local experts' fc1 and fc2 as one grouped call (`--moe-grouped-gemm`:
Transformer Engine's `GroupedLinear` with `m_splits` = tokens per expert, TE
pytorch/module/grouped_linear.py, or `torch._grouped_mm`) or as a loop of GEMMs
(`SequentialMLP`, megatron/core/transformer/moe/experts.py). At the small per-expert shapes of
fine-grained MoE (a few hundred to a few thousand tokens per expert, an FFN of 768-2048 per
expert) such a call reaches well below a large GEMM's rate, by how much depending on the tokens
per expert M and the number of groups G. The op graph tags these GEMMs (`Module.EXPERT_FC1`,
`Module.EXPERT_FC2`, batch = G, `workload.moe_layer`); a profile with measured grouped GEMMs
(`compute.grouped_gemm_points`, written by `simcluster calibrate` from the microbench's grouped
kind, `calibration.grouped_fit`) prices them from those points:

- Kind: fc1 / fc2 × forward, dgrad (input gradient), wgrad (weight gradient)
  (`expert_gemm_kind`); only points of the op's kind are used.
- Series: the points of one kind with the same G and the same two hidden dims (all but the
  token axis: m, or k for a wgrad) form a curve of rate over tokens per expert.
- Rate at a shape: along each series, log rate piecewise linear in log tokens and held flat
  beyond the series' ends; across series, the `NEAREST_SERIES` nearest in log(G, d1, d2)
  blended with weights 1 / distance² (an exact series is its own curve), so G = 8 between
  measured 4 and 16 is their geometric mean.
- Bounds (issue 20's rule: never unbounded extrapolation): a measured shape stands as
  measured; any other is priced at most at the best large GEMM (peak · gemm_max_efficiency)
  and in no less than its fewest bytes over the copy bandwidth
  (`compute.gemm_memory_roofline_s`): t = launch + max(FLOPs / rate, roofline).

The points are 16-bit measurements: a bf16 / fp16 expert GEMM uses them. FP8 / FP4 experts (TE
quantizes the experts' GroupedLinear) keep `compute.quantized_gemm_time_s`, unless the profile
declares `compute.grouped_ratio_for_quantized` (`quantized_expert_gemm_time_s`: the quantized
GEMM model times the measured 16-bit grouped / GEMM-model ratio at the same shape, an assumption
with no FP8 grouped GEMM measured). An expert GEMM of a kind without points keeps
`compute.gemm_time_s`: a profile without grouped points prices exactly as before.
SequentialMLP's ops (one GEMM per expert, batch 1) are priced on the G = 1 series, a grouped
call over one group.

A profile with no grouped points of its own may name one that has them
(`compute.grouped_ratio_from`, a declared carry-over: the H200 and Blackwell profiles name the
H100's): its expert GEMMs are then priced as its own GEMM model (16-bit, or quantized under
`grouped_ratio_for_quantized`) times that profile's measured grouped / GEMM-model ratio r at the
same kind and shape, never below its own byte roofline (quantized: its own floor). The ratio
carries what the grouped kernel loses to per-group tiles, tails and launches at few tokens per
expert, not the other GPU's rates.
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import lru_cache

from simcluster import units
from simcluster.config.choices import Dtype, Fp8Recipe
from simcluster.config.errors import ConfigError
from simcluster.config.hardware import GroupedGemmPoint, HardwareProfile, load_hardware
from simcluster.costs.compute import (
    gemm_memory_roofline_s,
    gemm_time_s,
    quantized_gemm_floor_s,
    quantized_gemm_time_s,
)
from simcluster.workload.grouped_gemm import expert_gemm_kind, series_key, tokens_per_expert
from simcluster.workload.ops import GemmShape, Op

NEAREST_SERIES = 2  # measured (G, hidden dims) series blended per prediction
_SIXTEEN_BIT = (Dtype.BF16, Dtype.FP16)


def grouped_expert_gemm_time_s(op: Op, hw: HardwareProfile, dtype: Dtype) -> float | None:
    """Seconds of a routed expert's 16-bit GEMM from the profile's grouped points (module
    docstring); None where they do not apply (not an expert GEMM, a quantized or fp32 dtype,
    no point of the op's kind), so the caller prices it as before."""
    kind = expert_gemm_kind(op)
    if kind is None or op.gemm is None or dtype not in _SIXTEEN_BIT:
        return None
    source = ratio_source(hw, kind)
    if source is None:
        return None
    if source is hw:
        return grouped_gemm_time_s(kind, op.gemm, hw)
    shape = op.gemm
    carried = gemm_time_s(shape, hw, Dtype.BF16) * grouped_gemm_ratio(kind, shape, source)
    return max(carried, hw.kernel_launch_s + gemm_memory_roofline_s(shape, hw))


def ratio_source(hw: HardwareProfile, kind: str) -> HardwareProfile | None:
    """The profile whose measured grouped points give `kind`'s ratio for `hw`: `hw` itself where
    it has points of the kind, else the one `compute.grouped_ratio_from` names where that one
    has them; None otherwise."""
    if any(p.kind == kind for p in hw.compute.grouped_gemm_points):
        return hw
    name = hw.compute.grouped_ratio_from
    if name is None:
        return None
    source = _named_profile(name)
    return source if any(p.kind == kind for p in source.compute.grouped_gemm_points) else None


@lru_cache(maxsize=8)
def _named_profile(name: str) -> HardwareProfile:
    source = load_hardware(name, field="compute.grouped_ratio_from")
    if not source.compute.grouped_gemm_points:
        raise ConfigError(
            name,
            [
                f"compute.grouped_ratio_from: profile {name!r} has no compute.grouped_gemm_points to "
                "carry a ratio from (name a profile calibrated with the grouped GEMM kind, e.g. "
                "h100-sxm5-80gb)"
            ],
        )
    return source


def quantized_expert_gemm_time_s(
    op: Op, hw: HardwareProfile, dtype: Dtype, recipe: Fp8Recipe
) -> float | None:
    """Seconds of a routed expert's FP8 / FP4 GEMM under `compute.grouped_ratio_for_quantized`:
    t = max(quantized_gemm_time_s · r, quantized_gemm_floor_s), with
    r = grouped_gemm_time_s / gemm_time_s (bf16), both at the op's own kind and shape.

    r is how far the measured 16-bit grouped kernel sits from the GEMM model at this shape
    (waves over G small GEMMs, per-group launch and tile occupancy at few tokens per expert),
    and the quantized model shares the GEMM model's shape treatment (the same points or wave
    quantization, `compute._quantized_gemm_time_s`), so the ratio is carried as a shape effect.
    It is kept below 1 as well as above (the measurement says the grouped kernel beat the GEMM
    model there; dropping those shapes would bias the carry-over slow), but the result is never
    below the quantized GEMM's own ceiling and byte roofline. An assumption, not a measurement:
    no FP8 grouped GEMM was measured, and TE's FP8 GroupedLinear (cuBLAS per expert, with its
    own quantize / transpose kernels priced elsewhere) may sit differently from torch's bf16
    grouped kernel. None where it does not apply (flag off, not an expert GEMM, a kind without
    points), so the caller prices the op by `quantized_gemm_time_s`."""
    if not hw.compute.grouped_ratio_for_quantized or not dtype.quantized:
        return None
    kind = expert_gemm_kind(op)
    if kind is None or op.gemm is None:
        return None
    source = ratio_source(hw, kind)
    if source is None:
        return None
    shape = op.gemm
    carried = quantized_gemm_time_s(shape, hw, dtype, recipe) * grouped_gemm_ratio(kind, shape, source)
    return max(carried, quantized_gemm_floor_s(shape, hw, dtype, recipe))


def grouped_gemm_ratio(kind: str, shape: GemmShape, hw: HardwareProfile) -> float:
    """r = grouped_gemm_time_s / gemm_time_s (bf16) at `shape`: above 1 where the measured
    grouped kernel is slower than the GEMM model prices the same shape."""
    return grouped_gemm_time_s(kind, shape, hw) / gemm_time_s(shape, hw, Dtype.BF16)


def grouped_gemm_time_s(kind: str, shape: GemmShape, hw: HardwareProfile) -> float:
    """launch + max(FLOPs / rate, memory roofline), a measured shape at its own rate.

    The microbench's wgrad writes a bf16 output; TE's accumulates into the fp32 `main_grad`
    (gradient-accumulation fusion: the op graph's `accumulate_fp32`, 8 bytes per output
    element read and written). So a wgrad that accumulates is held to its own bytes over the
    copy bandwidth even at a measured shape: at a few hundred tokens per expert its [m, n]
    fp32 output, not the measured kernel's bf16 one, sets the time."""
    rate, measured = _rate(kind, shape, hw)
    if measured and not shape.accumulate_fp32:
        return hw.kernel_launch_s + shape.flops / rate
    return hw.kernel_launch_s + max(shape.flops / rate, gemm_memory_roofline_s(shape, hw))


def grouped_gemm_flop_per_s(kind: str, shape: GemmShape, hw: HardwareProfile) -> float:
    """The rate the model gives `shape` before the memory roofline (module docstring)."""
    return _rate(kind, shape, hw)[0]


def grouped_placement(kind: str, shape: GemmShape, points: list[GroupedGemmPoint]) -> str:
    """Where `shape` lies: "measured" (an exact point), "interpolated" (inside [min, max] of
    G, tokens and both hidden dims of the kind's points) or "bounded" (outside: held flat to
    the nearest series' ends, at most the best GEMM, at least the memory roofline)."""
    own = [p for p in points if p.kind == kind]
    if any(_point_shape(p) == _shape_tuple(kind, shape) for p in own):
        return "measured"
    target = _coords(kind, shape.batch, shape.m, shape.n, shape.k)
    coords = [_coords(kind, p.groups, p.m, p.n, p.k) for p in own]
    inside = all(min(c[i] for c in coords) <= target[i] <= max(c[i] for c in coords) for i in range(4))
    return "interpolated" if inside else "bounded"


def _coords(kind: str, groups: int, m: int, n: int, k: int) -> tuple[int, int, int, int]:
    return (*series_key(kind, groups, m, n, k), tokens_per_expert(kind, m, k))


def _point_shape(p: GroupedGemmPoint) -> tuple[int, int, int, int]:
    return (p.groups, p.m, p.n, p.k)


def _shape_tuple(kind: str, shape: GemmShape) -> tuple[int, int, int, int]:
    return (shape.batch, shape.m, shape.n, shape.k)


_CACHE: dict[int, tuple[HardwareProfile, dict[tuple[str, GemmShape], tuple[float, bool]]]] = {}
_CACHE_MAX_PROFILES = 16


def _rate(kind: str, shape: GemmShape, hw: HardwareProfile) -> tuple[float, bool]:
    """(FLOP/s, whether `shape` is a measured point), remembered per profile object (a plan
    prices the same shapes in thousands of layouts; the entry holds the profile, so its id
    cannot be reused while cached)."""
    entry = _CACHE.get(id(hw))
    if entry is None or entry[0] is not hw:
        if len(_CACHE) >= _CACHE_MAX_PROFILES:
            _CACHE.clear()
        entry = _CACHE[id(hw)] = (hw, {})
    known = entry[1].get((kind, shape))
    if known is None:
        known = entry[1][(kind, shape)] = _blended_rate(kind, shape, hw)
    return known


def _blended_rate(kind: str, shape: GemmShape, hw: HardwareProfile) -> tuple[float, bool]:
    series: dict[tuple[int, int, int], list[tuple[int, float]]] = defaultdict(list)
    for p in hw.compute.grouped_gemm_points:
        if p.kind == kind:
            series[series_key(kind, p.groups, p.m, p.n, p.k)].append(
                (tokens_per_expert(kind, p.m, p.k), p.tflop_per_s)
            )
    target = series_key(kind, shape.batch, shape.m, shape.n, shape.k)
    tokens = tokens_per_expert(kind, shape.m, shape.k)
    exact_curve = series.get(target)
    if exact_curve is not None:
        for measured_tokens, tflop in exact_curve:
            if measured_tokens == tokens:
                return units.tflop_per_s_to_flop_per_s(tflop), True
    distance2 = {key: sum((math.log(a) - math.log(b)) ** 2 for a, b in zip(key, target)) for key in series}
    nearest = sorted(series, key=lambda key: (distance2[key], key))[:NEAREST_SERIES]
    exact = [key for key in nearest if distance2[key] < 1e-12]
    chosen = exact or nearest
    weights = [1.0] if exact else [1.0 / distance2[key] for key in chosen]
    log_rate = sum(w * _log_rate_along(series[key], tokens) for w, key in zip(weights, chosen)) / sum(weights)
    ceiling = hw.peak_flop_per_s(Dtype.BF16) * hw.compute.gemm_max_efficiency
    return min(units.tflop_per_s_to_flop_per_s(math.exp(log_rate)), ceiling), False


def _log_rate_along(curve: list[tuple[int, float]], tokens: int) -> float:
    """log TFLOP/s at `tokens` on one series: linear in log tokens between its points, flat
    beyond its ends."""
    points = sorted(curve)
    x = math.log(tokens)
    xs = [math.log(t) for t, _ in points]
    ys = [math.log(r) for _, r in points]
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]  # unreachable: x lies between xs[0] and xs[-1]
