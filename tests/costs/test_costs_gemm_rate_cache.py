"""`measured_gemm_flop_per_s` remembers rates per profile object: the same answer as the
interpolation, and never one profile's rate for another."""

from __future__ import annotations

from simcluster.config.choices import Dtype
from simcluster.config.hardware import load_hardware
from simcluster.costs.compute import _measured_gemm_flop_per_s, measured_gemm_flop_per_s
from simcluster.workload.ops import GemmShape


def test_remembered_rate_is_the_interpolated_one_and_per_profile():
    """Asked twice, the rate equals the interpolation; a profile whose measured points are
    all twice as fast (a copy, equal in every other field) gets twice the rate, not the
    first profile's remembered one."""
    hw = load_hardware("h100-sxm5-80gb")
    shape = GemmShape(4096, 7168, 2048, 1)
    first = measured_gemm_flop_per_s(shape, hw, Dtype.BF16)
    assert (
        measured_gemm_flop_per_s(shape, hw, Dtype.BF16)
        == first
        == _measured_gemm_flop_per_s(shape, hw, Dtype.BF16)
    )
    faster_points = [p.model_copy(update={"tflop_per_s": 2 * p.tflop_per_s}) for p in hw.compute.gemm_points]
    faster_compute = hw.compute.model_copy(update={"gemm_points": faster_points, "gemm_max_efficiency": 1.0})
    faster = hw.model_copy(update={"compute": faster_compute})
    capped = _measured_gemm_flop_per_s(shape, faster, Dtype.BF16)
    assert measured_gemm_flop_per_s(shape, faster, Dtype.BF16) == capped != first
