"""The H100 lessons carried to the other shipped profiles as declared assumptions (issue 20):
their burst GEMM ceilings scaled by what the H100 sustains over its own burst (MAMF)
figures, Azure's cuBLASLt FP8 points by what the H100 sustains over Azure's H100 point,
and the H100's per-kind memory-bound fractions, each with a `sources:` entry saying ASSUMED."""

import pytest

from simcluster.config.files import read_yaml
from simcluster.config.hardware import load_hardware
from tests.h100_measured import h100_measured
from tests.paths import ROOT

RATIOS = h100_measured.sustained_ratios()
H100_KINDS = load_hardware("h100-sxm5-80gb").compute.memory_bound_efficiency_by_kind
# The public burst ceilings (MAMF, bf16 and FP8) each profile scales, from their sources.
MAMF = {"h200-sxm-141gb": (0.803, 0.734), "b200-sxm-180gb": (0.776, 0.763), "gb200-nvl72": (0.729, 0.723)}


def _sig(value: float) -> float:
    return float(f"{value:.4g}")


def test_the_ratios_are_what_the_h100_measurements_say():
    """687.4 / 794.5, 1214.3 / 1402.6, 1203 / 1290.1."""
    assert RATIOS == {"mamf_bf16": 0.8652, "mamf_fp8": 0.8657, "cublaslt_fp8": 0.9324}


@pytest.mark.parametrize("stem", sorted(MAMF))
def test_burst_ceilings_are_scaled_to_sustained_load(stem):
    compute = load_hardware(stem).compute
    bf16, fp8 = MAMF[stem]
    assert compute.gemm_max_efficiency == _sig(bf16 * RATIOS["mamf_bf16"])
    assert compute.fp8_gemm_max_efficiency == _sig(fp8 * RATIOS["mamf_fp8"])


@pytest.mark.parametrize("stem", sorted(MAMF))
def test_per_kind_memory_bound_fractions_are_the_h100s(stem):
    assert load_hardware(stem).compute.memory_bound_efficiency_by_kind == H100_KINDS


@pytest.mark.parametrize("stem", sorted(MAMF))
@pytest.mark.parametrize(
    "key",
    ["gemm_max_efficiency", "fp8_gemm_max_efficiency", "fp8_gemm_points", "memory_bound_efficiency_by_kind"],
)
def test_each_carried_value_is_declared_an_assumption_with_its_reason(stem, key):
    source = read_yaml(ROOT / "hwprofiles" / f"{stem}.yaml")["compute"]["sources"][key]
    assert source.startswith("ASSUMED")
    assert "h100" in source.lower()


def test_h200_fp8_point_is_azures_figure_times_the_h100_ratio():
    """Azure ND H200 v5 cuBLASLt 8192³: 1300.6 TFLOP/s published, × 0.9324."""
    points = load_hardware("h200-sxm-141gb").compute.fp8_gemm_points
    cube = next(p for p in points if p.m == p.n == p.k == 8192)
    assert cube.tflop_per_s == _sig(1300.6 * RATIOS["cublaslt_fp8"])


def test_a100_public_takes_the_gemm_lesson_but_not_the_memory_bound_one():
    """MAMF 0.869 × 0.8652; the per-kind fractions contradict Table 4 there (see its source)."""
    compute = load_hardware("a100-sxm4-80gb-public").compute
    assert compute.gemm_max_efficiency == _sig(0.869 * RATIOS["mamf_bf16"])
    assert compute.memory_bound_efficiency_by_kind == {}
    assert "NOT" in compute.sources["gemm_max_efficiency"]
