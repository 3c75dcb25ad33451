"""Per-kind memory-bound efficiencies (`compute.memory_bound_efficiency_by_kind`): an op of a
listed kind runs at that fraction of HBM, a backward kind at its forward's, any other op at
`memory_bound_efficiency`; a measured per-kind curve still comes first. Hand-computed on
the A100 public profile (2,039 GB/s, e_mem 0.85, launch 2 µs)."""

import pytest

from simcluster.config.hardware import load_hardware
from simcluster.costs.compute import OPTIMIZER_KIND, elementwise_time_s, kind_efficiency

A100 = load_hardware("a100-sxm4-80gb-public")
LAUNCH_S = 2e-6
HBM = 2039e9
BYTES = 1e9


def _with_compute(**fields: object):
    return A100.model_copy(update={"compute": A100.compute.model_copy(update=fields)})


BY_KIND = _with_compute(memory_bound_efficiency_by_kind={"layernorm": 0.25, "optimizer": 0.5})


def test_a_listed_kind_runs_at_its_fraction_of_the_bandwidth():
    assert elementwise_time_s(BYTES, BY_KIND, "layernorm") == pytest.approx(LAUNCH_S + BYTES / (0.25 * HBM))


def test_a_backward_kind_takes_its_forwards_efficiency():
    assert kind_efficiency(BY_KIND, "layernorm.bwd") == 0.25
    assert elementwise_time_s(BYTES, BY_KIND, "layernorm.bwd") == elementwise_time_s(
        BYTES, BY_KIND, "layernorm"
    )


def test_a_kind_not_listed_and_no_kind_run_at_the_generic_efficiency():
    generic = LAUNCH_S + BYTES / (0.85 * HBM)
    assert elementwise_time_s(BYTES, BY_KIND, "swiglu") == pytest.approx(generic)
    assert elementwise_time_s(BYTES, BY_KIND) == pytest.approx(generic)


def test_the_optimizer_step_has_its_own_kind():
    assert elementwise_time_s(BYTES, BY_KIND, OPTIMIZER_KIND) == pytest.approx(LAUNCH_S + BYTES / (0.5 * HBM))


def test_a_measured_kind_curve_comes_before_the_kind_efficiency_and_the_efficiency_before_the_generic_curve():
    """Curve for layernorm 100 GB/s flat, generic curve 10 GB/s: layernorm at 100, optimizer
    at 0.5 · HBM (its efficiency beats the generic curve), swiglu at 10."""
    hw = _with_compute(
        memory_bound_efficiency_by_kind={"layernorm": 0.25, "optimizer": 0.5},
        elementwise_points_by_op={"layernorm": [(1e6, 100.0)]},
        elementwise_points=[(1e6, 10.0)],
    )
    assert elementwise_time_s(BYTES, hw, "layernorm") == pytest.approx(LAUNCH_S + BYTES / 100e9)
    assert elementwise_time_s(BYTES, hw, OPTIMIZER_KIND) == pytest.approx(LAUNCH_S + BYTES / (0.5 * HBM))
    assert elementwise_time_s(BYTES, hw, "swiglu") == pytest.approx(LAUNCH_S + BYTES / 10e9)


def test_a_profile_without_the_key_prices_as_before():
    assert A100.compute.memory_bound_efficiency_by_kind == {}
    assert kind_efficiency(A100, "layernorm") is None


def test_an_efficiency_above_one_is_refused():
    data = A100.model_dump()
    data["compute"]["memory_bound_efficiency_by_kind"] = {"swiglu": 1.2}
    with pytest.raises(ValueError, match="memory_bound_efficiency_by_kind.*at most 1"):
        type(A100).model_validate(data)
