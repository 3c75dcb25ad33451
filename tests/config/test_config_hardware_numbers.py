"""Every number in a hardware profile is a physical quantity: finite, not negative, tables
positive and sorted, the all-reduce time growing with the message, at least one GEMM tile."""

import copy

import pytest

from simcluster.config import ConfigError
from simcluster.config.files import read_yaml
from simcluster.config.hardware import parse_hardware
from tests.paths import ROOT

A100 = read_yaml(ROOT / "hwprofiles" / "a100-sxm4-80gb.yaml")


def _edited(section: str, key: str, value):
    data = copy.deepcopy(A100)
    data[section][key] = value
    return data


@pytest.mark.parametrize(
    ("section", "key", "value", "expected"),
    [
        ("gpu", "peak_bf16_tflop_per_s", float("inf"), "tflop_per_s: value inf: Input should be a finite"),
        ("network", "nic_achieved_gb_per_s", float("nan"), "network.nic_achieved_gb_per_s: value nan"),
        ("network", "nvlink_latency_us", float("inf"), "network.nvlink_latency_us: value inf"),
        ("network", "collective_base_latency_us", -3.0, "greater than or equal to 0"),
        ("network", "nvlink_allreduce_busbw", [[1.0, -5.0], [2.0, 10.0]], "busbw: no number"),
        ("network", "nvlink_allreduce_busbw", [[1.0, 0.0]], "busbw: every entry must be positive"),
        ("network", "nvlink_allreduce_busbw", [[100.0, 200.0], [1.0, 10.0]], "strictly increasing"),
        ("network", "nvlink_allreduce_busbw", [[1.0, 10.0], [2.0, 1000.0]], "(the time) must not decrease"),
        ("compute", "gemm_tiles", [], "gemm_tiles: List should have at least 1 item"),
        ("compute", "gemm_tiles", [[128, 128, 5.0]], "relative efficiency is at most 1"),
        ("compute", "gemm_tiles", [[0, 128, 1.0]], "gemm_tiles: every entry must be positive"),
        ("compute", "elementwise_points", [[0.0, 10.0]], "elementwise_points: every entry must be positive"),
        ("compute", "elementwise_points_by_op", {"softmax": [[10.0, 1], [1.0, 2]]}, "strictly increasing"),
        ("gpu", "num_sms", True, "gpu.num_sms: value True: must be an integer, not a boolean"),
        ("network", "nic_achieved_gb_per_s", 1e-300, "a number is outside 1e-06 to 1e+15"),
    ],
)
def test_unphysical_numbers_are_refused(section, key, value, expected):
    """Each of the issue's inputs (inf, NaN, negative / unsorted / zero tables, no tiles) is
    one error naming the profile, the field and the value."""
    with pytest.raises(ConfigError) as caught:
        parse_hardware(_edited(section, key, value), "edited.yaml")
    assert "edited.yaml" in str(caught.value) and expected in str(caught.value)


def test_a_new_numeric_field_is_covered_without_naming_it():
    """The checks walk the fields: a section subclass with a new table gets them too."""
    from simcluster.config.hardware import ComputeModel

    class WithNewTable(ComputeModel):
        new_points: list[tuple[float, float]] = []

    data = {**A100["compute"], "new_points": [[2.0, 1.0], [1.0, 1.0]]}
    with pytest.raises(ValueError, match="new_points: sizes must be strictly increasing"):
        WithNewTable.model_validate(data)
    with pytest.raises(ValueError, match="finite"):
        WithNewTable.model_validate({**data, "new_points": [[1.0, float("inf")]]})


def test_shipped_busbw_dip_is_accepted():
    """The measured A100 sweep's busbw dips at 16 MB while the time still grows: valid."""
    profile = parse_hardware(A100, "a100.yaml")
    rates = [rate for _, rate in profile.network.nvlink_allreduce_busbw]
    assert any(later < earlier for earlier, later in zip(rates, rates[1:]))


def test_a_reserve_larger_than_the_device_is_refused():
    """The CUDA context and NCCL buffers cannot take the whole device (plan would fill a
    negative capacity)."""
    data = _edited("gpu", "nccl_buffers_mib", 90000)
    with pytest.raises(ConfigError, match="must be below memory_capacity_mib"):
        parse_hardware(data, "x.yaml")
