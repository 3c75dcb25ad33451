"""The shipped H100 profile's compute model is what the committed H100 measurements say
(docs/calibration/h100-2026-11-26/): each measured value equals the derivation of
benchmarks/h100_measured.py, and each names its file in `sources`."""

import pytest

from simcluster.config.files import read_yaml
from simcluster.config.hardware import load_hardware
from tests.h100_measured import h100_measured
from tests.paths import ROOT

DATA = read_yaml(ROOT / "hwprofiles" / "h100-sxm5-80gb.yaml")
DERIVED = h100_measured.constants()


@pytest.mark.parametrize("key", sorted(DERIVED))
def test_each_measured_constant_is_the_derivation_from_the_committed_files(key):
    shipped = DATA["compute"][key]
    if key.endswith("_points"):
        shipped = [{**point, "tflop_per_s": float(point["tflop_per_s"])} for point in shipped]
    assert shipped == DERIVED[key]


@pytest.mark.parametrize("key", sorted(DERIVED))
def test_each_measured_constant_says_where_it_was_measured(key):
    source = DATA["compute"]["sources"][key]
    assert "measured" in source
    assert "docs/calibration/h100-2026-11-26/" in source or ".json" in source


def test_the_ceilings_are_the_sustained_rates_not_the_burst_ones():
    """687.4 / 989 and 1214.3 / 1979: 13-15 % below the burst MAMF ceilings (0.803, 0.709)."""
    compute = load_hardware("h100-sxm5-80gb").compute
    assert compute.gemm_max_efficiency * 989 == pytest.approx(687.4, abs=0.1)
    assert compute.fp8_gemm_max_efficiency is not None
    assert compute.fp8_gemm_max_efficiency * 1979 == pytest.approx(1214.3, abs=0.2)
    assert compute.gemm_max_efficiency / 0.803 == pytest.approx(0.865, abs=0.002)


def test_fused_norm_and_rope_run_at_about_a_third_of_the_bandwidth():
    """RMSNorm 1,183 GB/s and RoPE 1,139 GB/s of 3,350; a copy 3,019."""
    compute = load_hardware("h100-sxm5-80gb").compute
    assert compute.memory_bound_efficiency_by_kind["layernorm"] * 3350 == pytest.approx(1183, abs=2)
    assert compute.memory_bound_efficiency_by_kind["rope"] * 3350 == pytest.approx(1139, abs=2)
    assert compute.memory_bound_efficiency * 3350 == pytest.approx(3019, abs=2)


def test_the_profile_says_it_was_measured_and_the_network_was_not():
    provenance = load_hardware("h100-sxm5-80gb").provenance
    assert provenance.kind == "measured"
    assert DATA["provenance"]["network_from"] == "public-measurements"
    assert DATA["network"]["measured"] == "datasheet"
