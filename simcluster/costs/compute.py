"""Kernel time on one GPU: GEMMs and memory-bound kernels.

GEMM model (roofline with wave quantization):
    t = launch + max(FLOPs / (peak · e_max · e_wave), bytes / (HBM · e_mem))
where e_max is the best large-GEMM efficiency the profile cites (e.g. MAMF), and e_wave
is the best, over candidate CTA tiles (tile_m, tile_n, relative efficiency), of
    rel · tiles / (ceil(tiles / SMs) · SMs),   tiles = batch · ⌈M/tile_m⌉ · ⌈N/tile_n⌉,
so small or skinny GEMMs that leave SMs idle in their last wave run slower, and GEMMs
with low arithmetic intensity (attention's K = head_dim) fall to the memory roofline.
A calibrated profile may list measured GEMMs (`gemm_points`); then the efficiency of the
nearest measured shape (log-distance in M, N, K, batch) replaces e_max · e_wave.

Memory-bound kernels: t = launch + bytes / (HBM · e_mem), or, with measured
`elementwise_points`, the achieved bandwidth interpolated in log(bytes).
"""

from __future__ import annotations

import math

import numpy as np

from simcluster.config.choices import Dtype
from simcluster.config.hardware import HardwareProfile
from simcluster.workload.ops import GemmShape


def wave_efficiency(shape: GemmShape, num_sms: int, tiles: list[tuple[int, int, float]]) -> float:
    """Best fraction of SM-time doing useful tiles over the candidate tile shapes."""
    best = 0.0
    for tile_m, tile_n, relative in tiles:
        num_tiles = shape.batch * math.ceil(shape.m / tile_m) * math.ceil(shape.n / tile_n)
        waves = math.ceil(num_tiles / num_sms)
        useful = (shape.batch * shape.m * shape.n) / (num_tiles * tile_m * tile_n)
        best = max(best, relative * useful * num_tiles / (waves * num_sms))
    return best


def gemm_efficiency(shape: GemmShape, hw: HardwareProfile) -> float:
    """Fraction of peak the GEMM's arithmetic reaches (before the memory roofline)."""
    if hw.compute.gemm_points:
        return _measured_gemm_efficiency(shape, hw)
    return hw.compute.gemm_max_efficiency * wave_efficiency(
        shape, hw.gpu.num_sms, [tuple(t) for t in hw.compute.gemm_tiles]
    )


def gemm_time_s(shape: GemmShape, hw: HardwareProfile, dtype: Dtype = Dtype.BF16) -> float:
    compute_s = shape.flops / (hw.peak_flop_per_s(dtype) * gemm_efficiency(shape, hw))
    memory_s = shape.bytes_moved(dtype.num_bytes) / achieved_bandwidth_bytes_per_s(
        shape.bytes_moved(dtype.num_bytes), hw
    )
    return hw.kernel_launch_s + max(compute_s, memory_s)


def achieved_bandwidth_bytes_per_s(bytes_moved: float, hw: HardwareProfile) -> float:
    points = hw.compute.elementwise_points
    if points:
        sizes = np.log([p[0] for p in points])
        rates = [p[1] for p in points]
        gb_per_s = float(np.interp(math.log(max(bytes_moved, 1.0)), sizes, rates))
        return gb_per_s * 1e9
    return hw.memory_bandwidth_bytes_per_s * hw.compute.memory_bound_efficiency


def elementwise_time_s(bytes_moved: float, hw: HardwareProfile) -> float:
    if bytes_moved <= 0:
        return 0.0
    return hw.kernel_launch_s + bytes_moved / achieved_bandwidth_bytes_per_s(bytes_moved, hw)


def _measured_gemm_efficiency(shape: GemmShape, hw: HardwareProfile) -> float:
    """Efficiency of the nearest measured GEMM in log-shape space, corrected for the
    difference in wave quantization between the two shapes."""
    peak = hw.gpu.peak_bf16_tflop_per_s
    tiles = [tuple(t) for t in hw.compute.gemm_tiles]
    target = np.log([shape.m, shape.n, shape.k, shape.batch])
    best_point, best_distance = None, math.inf
    for point in hw.compute.gemm_points:
        distance = float(np.sum((np.log([point.m, point.n, point.k, point.batch]) - target) ** 2))
        if distance < best_distance:
            best_point, best_distance = point, distance
    assert best_point is not None
    measured = GemmShape(best_point.m, best_point.n, best_point.k, best_point.batch)
    ratio = wave_efficiency(shape, hw.gpu.num_sms, tiles) / wave_efficiency(measured, hw.gpu.num_sms, tiles)
    return min(1.0, best_point.tflop_per_s / peak * ratio)
