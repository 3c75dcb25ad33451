"""The routed experts' grouped GEMMs priced from a profile's measured grouped points
(`costs.grouped_gemm`): measured shapes as measured, the curve interpolated in log tokens and
log G, shapes outside the grid bounded by the ceilings, and only expert GEMMs touched."""

from __future__ import annotations

import math

import pytest

from simcluster.config.choices import Dtype, Fp8Recipe
from simcluster.config.hardware import GroupedGemmPoint, HardwareProfile, load_hardware
from simcluster.config.scenario import load_scenario
from simcluster.costs.chunk import op_time_s
from simcluster.costs.compute import gemm_memory_roofline_s, gemm_time_s, quantized_gemm_time_s
from simcluster.costs.grouped_gemm import grouped_gemm_flop_per_s, grouped_gemm_time_s, grouped_placement
from simcluster.costs.stage_pricing import PricingLayout, pricing_layout
from simcluster.simulation import run_simulation
from simcluster.workload.grouped_gemm import expert_gemm_kind
from simcluster.workload.model import build_workload
from simcluster.workload.ops import GemmShape, Module, Op, OpKind
from tests.paths import ROOT

SHIPPED = load_hardware("h100-sxm5-80gb")
# The synthetic points below stand alone: the base is the H100 profile without its measured
# grouped points (what every expert GEMM was priced by before them: the GEMM model), and
# without the FP8 carry-over that needs them (tests/costs/test_costs_grouped_fp8.py).
H100 = SHIPPED.model_copy(
    update={
        "compute": SHIPPED.compute.model_copy(
            update={"grouped_gemm_points": [], "grouped_ratio_for_quantized": False}
        )
    }
)
HIDDEN, FFN = 2048, 768  # Qwen3-30B-A3B's expert: fc1 n = 2·768, k = 2048


def synthetic_tflop(groups: int, tokens: int) -> float:
    """A saturating curve: more tokens per expert and more groups fill the GPU."""
    return 600.0 * tokens / (tokens + 2048.0 / groups)


def with_points(hw: HardwareProfile, kinds: tuple[str, ...] = ("fc1",)) -> HardwareProfile:
    points = [
        GroupedGemmPoint(kind=kind, groups=g, m=t, n=2 * FFN, k=HIDDEN, tflop_per_s=synthetic_tflop(g, t))
        for kind in kinds
        for g in (1, 4, 16)
        for t in (128, 512, 2048, 8192)
    ]
    return hw.model_copy(update={"compute": hw.compute.model_copy(update={"grouped_gemm_points": points})})


HW = with_points(H100)


def fc1(groups: int, tokens: int) -> GemmShape:
    return GemmShape(tokens, 2 * FFN, HIDDEN, groups)


def test_a_measured_shape_is_priced_at_its_own_rate():
    shape = fc1(4, 512)
    expected = HW.kernel_launch_s + shape.flops / (synthetic_tflop(4, 512) * 1e12)
    assert grouped_gemm_time_s("fc1", shape, HW) == pytest.approx(expected, rel=1e-12)
    assert grouped_placement("fc1", shape, HW.compute.grouped_gemm_points) == "measured"


def test_tokens_between_points_are_log_linear_and_within_their_rates():
    """M = 1024 halfway (in log) between measured 512 and 2048: the geometric mean."""
    rate = grouped_gemm_flop_per_s("fc1", fc1(4, 1024), HW) / 1e12
    assert rate == pytest.approx(math.sqrt(synthetic_tflop(4, 512) * synthetic_tflop(4, 2048)), rel=1e-9)
    assert grouped_placement("fc1", fc1(4, 1024), HW.compute.grouped_gemm_points) == "interpolated"


def test_groups_between_series_blend_the_two_nearest():
    """G = 8 between measured 4 and 16 (equal log distance): their geometric mean."""
    rate = grouped_gemm_flop_per_s("fc1", fc1(8, 2048), HW) / 1e12
    assert rate == pytest.approx(math.sqrt(synthetic_tflop(4, 2048) * synthetic_tflop(16, 2048)), rel=1e-9)
    assert synthetic_tflop(4, 2048) < rate < synthetic_tflop(16, 2048)


@pytest.mark.parametrize(
    ("groups", "tokens"), [(4, 8), (1, 1), (64, 8192), (4, 10**6), (1024, 128)]
)  # fmt: skip
def test_shapes_outside_the_grid_are_bounded_by_the_ceilings(groups, tokens):
    """Never faster than the best GEMM, never under the bytes over the copy bandwidth, and
    never priced by extending a trend: the rate is at most the nearest series' end."""
    shape = fc1(groups, tokens)
    ceiling = HW.peak_flop_per_s(Dtype.BF16) * HW.compute.gemm_max_efficiency
    rate = grouped_gemm_flop_per_s("fc1", shape, HW)
    seconds = grouped_gemm_time_s("fc1", shape, HW)
    assert rate <= ceiling
    assert rate <= max(synthetic_tflop(g, t) for g in (1, 4, 16) for t in (128, 8192)) * 1e12
    assert seconds >= HW.kernel_launch_s + gemm_memory_roofline_s(shape, HW)
    assert seconds >= HW.kernel_launch_s + shape.flops / ceiling
    assert grouped_placement("fc1", shape, HW.compute.grouped_gemm_points) == "bounded"


def test_few_tokens_per_expert_are_held_to_the_weight_bytes():
    """At M = 8 per expert (below the grid) the weights dominate the bytes: the time is the
    memory roofline, not the flat-held rate's tiny compute time."""
    shape = fc1(16, 8)
    assert grouped_gemm_time_s("fc1", shape, HW) == HW.kernel_launch_s + gemm_memory_roofline_s(shape, HW)


def _qwen_forward_ops() -> tuple[tuple[Op, ...], PricingLayout]:
    scenario = load_scenario(ROOT / "scenarios" / "moe" / "qwen3-30b-a3b-h100.yaml")
    workload = build_workload(scenario, H100.fp8_weight_copies)
    seg = next(s for s in workload.stages[0].chunks[0].segments if s.kind.moe)
    return seg.layer.forward + seg.layer.backward, pricing_layout(scenario, H100)


def test_the_hook_changes_only_the_expert_gemms_of_a_measured_kind():
    """With fc1 points, every fc1 expert GEMM is priced from them; every other op (fc2, whose
    kind has no points, the router, attention, collectives) exactly as without them."""
    ops, layout = _qwen_forward_ops()
    changed = 0
    for op in ops:
        before = op_time_s(op, H100, layout.tp, Dtype.BF16, experts=layout.experts)
        after = op_time_s(op, HW, layout.tp, Dtype.BF16, experts=layout.experts)
        if op.module is Module.EXPERT_FC1 and expert_gemm_kind(op) == "fc1":
            assert op.gemm is not None
            assert after == grouped_gemm_time_s("fc1", op.gemm, HW) != before
            changed += 1
        else:
            assert after == before, op.name
    assert changed == 1


def test_quantized_and_fp32_experts_keep_their_pricing():
    """The points are 16-bit measurements: without `grouped_ratio_for_quantized` FP8 experts
    keep the FP8 GEMM model, and fp32 ones always the GEMM model, whatever grouped points the
    profile has."""
    ops, layout = _qwen_forward_ops()
    expert = next(op for op in ops if op.module is Module.EXPERT_FC1 and op.kind is OpKind.GEMM)
    assert expert.gemm is not None
    fp8 = op_time_s(expert, HW, layout.tp, Dtype.FP8, Fp8Recipe.DELAYED, experts=layout.experts)
    assert fp8 == quantized_gemm_time_s(expert.gemm, H100, Dtype.FP8, Fp8Recipe.DELAYED)
    fp32 = op_time_s(expert, HW, layout.tp, Dtype.FP32, experts=layout.experts)
    assert fp32 == gemm_time_s(expert.gemm, H100, Dtype.FP32)


def test_a_dense_scenario_is_unchanged_by_grouped_points():
    scenario = load_scenario(ROOT / "scenarios" / "modern" / "llama3-8b-h100.yaml")
    assert scenario.model.moe is None
    every_kind = with_points(H100, ("fc1", "fc2", "fc1.dgrad", "fc2.dgrad", "fc1.wgrad", "fc2.wgrad"))
    assert run_simulation(scenario, every_kind).result == run_simulation(scenario, H100).result


def test_a_moe_scenario_moves_with_the_points():
    """Qwen3-30B-A3B with every kind at a slow 100 TFLOP/s: a slower step than the GEMM model's."""
    scenario = load_scenario(ROOT / "scenarios" / "moe" / "qwen3-30b-a3b-h100.yaml")
    points = [
        p.model_copy(update={"tflop_per_s": 100.0})
        for p in with_points(
            H100, ("fc1", "fc2", "fc1.dgrad", "fc2.dgrad", "fc1.wgrad", "fc2.wgrad")
        ).compute.grouped_gemm_points
    ]
    slow = H100.model_copy(
        update={"compute": H100.compute.model_copy(update={"grouped_gemm_points": points})}
    )
    base = run_simulation(scenario, H100).result.iteration_time_s
    assert run_simulation(scenario, slow).result.iteration_time_s > base
