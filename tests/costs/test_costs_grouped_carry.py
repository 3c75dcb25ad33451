"""A profile without measured grouped GEMMs carrying another profile's measured grouped /
GEMM-model ratio (`compute.grouped_ratio_from`, `costs.grouped_gemm.ratio_source`): its expert
GEMMs cost its own GEMM model times the H100's ratio at the same kind and shape, bounded by its
own byte roofline; without the key they cost its own GEMM model, as before."""

from __future__ import annotations

import pytest

from simcluster.config.choices import Dtype, Fp8Recipe
from simcluster.config.errors import ConfigError
from simcluster.config.hardware import HardwareProfile, load_hardware
from simcluster.config.scenario import load_scenario
from simcluster.costs.chunk import op_time_s
from simcluster.costs.compute import (
    gemm_memory_roofline_s,
    gemm_time_s,
    quantized_gemm_floor_s,
    quantized_gemm_time_s,
)
from simcluster.costs.grouped_gemm import grouped_gemm_ratio, ratio_source
from simcluster.costs.stage_pricing import pricing_layout
from simcluster.workload.grouped_gemm import expert_gemm_kind
from simcluster.workload.model import build_workload
from simcluster.workload.ops import Module, Op, OpKind
from tests.paths import ROOT

H100 = load_hardware("h100-sxm5-80gb")
B200 = load_hardware("b200-sxm-180gb")
QWEN = load_scenario(ROOT / "scenarios" / "moe" / "qwen3-30b-a3b-h100.yaml")


def _without_carry(hw: HardwareProfile) -> HardwareProfile:
    update = {"grouped_ratio_from": None, "grouped_ratio_for_quantized": False}
    return hw.model_copy(update={"compute": hw.compute.model_copy(update=update)})


def _expert_gemms(hw: HardwareProfile) -> list[Op]:
    workload = build_workload(QWEN, hw.fp8_weight_copies)
    seg = next(s for st in workload.stages for c in st.chunks for s in c.segments if s.kind.moe)
    ops = seg.layer.forward + seg.layer.backward
    return [
        op for op in ops if op.kind is OpKind.GEMM and op.module in (Module.EXPERT_FC1, Module.EXPERT_FC2)
    ]


def _price(op: Op, hw: HardwareProfile, dtype: Dtype) -> float:
    layout = pricing_layout(QWEN, hw)
    return op_time_s(op, hw, layout.tp, dtype, Fp8Recipe.DELAYED, experts=layout.experts)


def test_the_shipped_h200_and_blackwell_profiles_carry_the_h100_ratio():
    for name in ("h200-sxm-141gb", "b200-sxm-180gb", "b300-sxm-288gb", "gb200-nvl72", "gb300-nvl72"):
        hw = load_hardware(name)
        assert not hw.compute.grouped_gemm_points and hw.compute.grouped_ratio_from == "h100-sxm5-80gb"
        assert ratio_source(hw, "fc1") is not None and ratio_source(hw, "fc1").name == H100.name
        assert "ASSUMED" in hw.compute.sources["grouped_ratio_from"]
    assert ratio_source(H100, "fc1") is H100  # a profile with its own points uses them


def test_a_16_bit_expert_gemm_is_its_own_gemm_model_times_the_h100_ratio():
    ops = _expert_gemms(B200)
    assert len({expert_gemm_kind(op) for op in ops}) == 6  # fc1 / fc2 x forward, dgrad, wgrad
    slower = 0
    for op in ops:
        assert op.gemm is not None
        kind = expert_gemm_kind(op)
        assert kind is not None
        r = grouped_gemm_ratio(kind, op.gemm, H100)
        expected = max(
            gemm_time_s(op.gemm, B200, Dtype.BF16) * r,
            B200.kernel_launch_s + gemm_memory_roofline_s(op.gemm, B200),
        )
        assert _price(op, B200, Dtype.BF16) == pytest.approx(expected, rel=1e-12)
        assert _price(op, _without_carry(B200), Dtype.BF16) == pytest.approx(
            gemm_time_s(op.gemm, B200, Dtype.BF16), rel=1e-12
        )
        slower += r > 1
    assert slower >= 4  # at 256 tokens per expert the measured grouped kernel is mostly slower


def test_an_fp8_expert_gemm_carries_the_same_ratio():
    op = next(op for op in _expert_gemms(B200) if expert_gemm_kind(op) == "fc1")
    assert op.gemm is not None
    r = grouped_gemm_ratio("fc1", op.gemm, H100)
    model = quantized_gemm_time_s(op.gemm, B200, Dtype.FP8, Fp8Recipe.DELAYED)
    floor = quantized_gemm_floor_s(op.gemm, B200, Dtype.FP8, Fp8Recipe.DELAYED)
    assert _price(op, B200, Dtype.FP8) == pytest.approx(max(model * r, floor), rel=1e-12)
    assert _price(op, B200, Dtype.FP8) != pytest.approx(_price(op, _without_carry(B200), Dtype.FP8))


def test_a_named_profile_without_grouped_points_is_refused():
    hw = B200.model_copy(
        update={"compute": B200.compute.model_copy(update={"grouped_ratio_from": "a100-sxm4-80gb"})}
    )
    with pytest.raises(
        ConfigError, match="grouped_ratio_from.*'a100-sxm4-80gb' has no compute.grouped_gemm_points"
    ):
        ratio_source(hw, "fc1")


def test_own_points_and_a_named_source_together_are_refused():
    data = H100.model_dump(mode="json", by_alias=True)
    data["compute"]["grouped_ratio_from"] = "h100-sxm5-80gb"
    with pytest.raises(ValueError, match="grouped_ratio_from is for a profile without grouped_gemm_points"):
        HardwareProfile.model_validate(data)
