"""FP8 / FP4 routed experts priced with the measured grouped-GEMM ratio carried over
(`costs.grouped_gemm.quantized_expert_gemm_time_s`, the profile key
`compute.grouped_ratio_for_quantized`): t = max(quantized model · r, the quantized floor),
r = measured bf16 grouped time / bf16 GEMM-model time at the op's kind and shape."""

from __future__ import annotations

import pytest

from simcluster.config.choices import Dtype, Fp8Recipe
from simcluster.config.files import read_yaml
from simcluster.config.hardware import GroupedGemmPoint, HardwareProfile, load_hardware
from simcluster.config.scenario import load_scenario
from simcluster.costs.chunk import op_time_s
from simcluster.costs.compute import gemm_time_s, quantized_gemm_floor_s, quantized_gemm_time_s
from simcluster.costs.grouped_gemm import grouped_gemm_ratio, grouped_gemm_time_s
from simcluster.costs.stage_pricing import pricing_layout
from simcluster.workload.grouped_gemm import expert_gemm_kind
from simcluster.workload.model import build_workload
from simcluster.workload.ops import GemmShape, Module, Op, OpKind, Pass
from tests.paths import ROOT

SHIPPED = load_hardware("h100-sxm5-80gb")
QWEN = load_scenario(ROOT / "scenarios" / "moe" / "qwen3-30b-a3b-h100.yaml")


def _layer_ops(hw: HardwareProfile) -> tuple[Op, ...]:
    workload = build_workload(QWEN, hw.fp8_weight_copies)
    seg = next(s for st in workload.stages for c in st.chunks for s in c.segments if s.kind.moe)
    return seg.layer.forward + seg.layer.backward


OPS = _layer_ops(SHIPPED)
LAYOUT = pricing_layout(QWEN, SHIPPED)
FC1 = next(
    op for op in OPS if op.module is Module.EXPERT_FC1 and op.kind is OpKind.GEMM and op.pass_ is Pass.FORWARD
)
assert FC1.gemm is not None and expert_gemm_kind(FC1) == "fc1"


def profile(hw: HardwareProfile, points: list[GroupedGemmPoint], carry: bool) -> HardwareProfile:
    update = {"grouped_gemm_points": points, "grouped_ratio_for_quantized": carry}
    return hw.model_copy(update={"compute": hw.compute.model_copy(update=update)})


def fc1_point(hw: HardwareProfile, tflop_per_s: float) -> GroupedGemmPoint:
    """A grouped point at exactly the Qwen3-30B-A3B fc1 expert GEMM's shape."""
    g = FC1.gemm
    assert g is not None
    return GroupedGemmPoint(kind="fc1", groups=g.batch, m=g.m, n=g.n, k=g.k, tflop_per_s=tflop_per_s)


def price(op: Op, hw: HardwareProfile, dtype: Dtype = Dtype.FP8) -> float:
    return op_time_s(op, hw, LAYOUT.tp, dtype, Fp8Recipe.DELAYED, experts=LAYOUT.experts)


def test_the_ratio_is_one_where_the_points_equal_the_gemm_model():
    """Points at the GEMM model's own rate at every expert shape: r = 1 and every FP8 expert
    is priced exactly as the FP8 GEMM model prices it (the carry-over adds nothing of its own)."""
    points = []
    experts = [op for op in OPS if expert_gemm_kind(op) is not None]
    assert len(experts) == 6
    for op in experts:
        g = op.gemm
        assert g is not None
        rate = g.flops / (gemm_time_s(g, SHIPPED) - SHIPPED.kernel_launch_s) / 1e12
        points.append(
            GroupedGemmPoint(kind=expert_gemm_kind(op), groups=g.batch, m=g.m, n=g.n, k=g.k, tflop_per_s=rate)
        )
    hw = profile(SHIPPED, points, carry=True)
    for op in experts:
        assert op.gemm is not None
        assert grouped_gemm_ratio(expert_gemm_kind(op), op.gemm, hw) == pytest.approx(1.0, rel=1e-12)
        quantized = quantized_gemm_time_s(op.gemm, hw, Dtype.FP8, Fp8Recipe.DELAYED)
        assert price(op, hw) == pytest.approx(
            max(quantized, quantized_gemm_floor_s(op.gemm, hw, Dtype.FP8, Fp8Recipe.DELAYED))
        )
        assert price(op, hw) == pytest.approx(quantized, rel=1e-12), op.name


def test_an_fp8_expert_scales_by_the_measured_ratio_at_a_measured_shape():
    """A grouped kernel measured at 300 TFLOP/s where the GEMM model gives ~680: r > 2, and the
    FP8 fc1 costs the FP8 model's time times that r (well above its floor)."""
    hw = profile(SHIPPED, [fc1_point(SHIPPED, 300.0)], carry=True)
    g = FC1.gemm
    assert g is not None
    r = (hw.kernel_launch_s + g.flops / 300e12) / gemm_time_s(g, hw)
    assert r > 2.0
    assert grouped_gemm_ratio("fc1", g, hw) == pytest.approx(r, rel=1e-12)
    quantized = quantized_gemm_time_s(g, hw, Dtype.FP8, Fp8Recipe.DELAYED)
    assert price(FC1, hw) == pytest.approx(quantized * r, rel=1e-12)
    off = profile(SHIPPED, [fc1_point(SHIPPED, 300.0)], carry=False)
    assert price(FC1, off) == quantized


def test_a_ratio_below_one_is_kept_but_never_under_the_quantized_floor():
    """A grouped kernel measured faster than the GEMM model: r < 1 is carried, but the FP8
    expert is never priced past the FP8 ceiling or under its quantized bytes."""
    g = FC1.gemm
    assert g is not None
    fast = profile(SHIPPED, [fc1_point(SHIPPED, 1000.0)], carry=True)
    r = grouped_gemm_ratio("fc1", g, fast)
    assert r < 0.8
    quantized = quantized_gemm_time_s(g, fast, Dtype.FP8, Fp8Recipe.DELAYED)
    floor = quantized_gemm_floor_s(g, fast, Dtype.FP8, Fp8Recipe.DELAYED)
    assert quantized * r < floor  # the FP8 model already prices this shape near its ceiling
    assert price(FC1, fast) == floor
    peak_fp8 = fast.peak_fp8_flop_per_s
    assert peak_fp8 is not None and fast.compute.fp8_gemm_max_efficiency is not None
    assert floor >= fast.kernel_launch_s + g.flops / (peak_fp8 * fast.compute.fp8_gemm_max_efficiency)


def test_the_floor_counts_quantized_operands_and_the_ceiling():
    """The floor is launch + max(FLOPs at the FP8 ceiling, 1-byte operands + bf16 output over
    the copy bandwidth): a 16-bit GEMM's bytes would be about twice as many."""
    hw = SHIPPED
    g = FC1.gemm
    assert g is not None and hw.peak_fp8_flop_per_s is not None
    assert hw.compute.fp8_gemm_max_efficiency is not None
    copy = hw.memory_bandwidth_bytes_per_s * hw.compute.memory_bound_efficiency
    moved = g.batch * (1 * (g.m * g.k + g.k * g.n) + 2 * g.m * g.n)
    ceiling = hw.peak_fp8_flop_per_s * hw.compute.fp8_gemm_max_efficiency
    expected = hw.kernel_launch_s + max(g.flops / ceiling, moved / copy)
    assert quantized_gemm_floor_s(g, hw, Dtype.FP8, Fp8Recipe.DELAYED) == pytest.approx(expected, rel=1e-12)


def test_without_the_key_every_op_is_priced_as_before():
    """Flag off (the default): FP8 experts keep the FP8 GEMM model even with grouped points;
    flag on: only the six FP8 expert GEMMs move, every other op (attention, router, dense
    GEMMs, collectives, bf16 pricing) is priced exactly as with the flag off."""
    on, off = SHIPPED, profile(SHIPPED, SHIPPED.compute.grouped_gemm_points, carry=False)
    assert on.compute.grouped_ratio_for_quantized
    moved = 0
    for op in OPS:
        for dtype in (Dtype.FP8, Dtype.BF16):
            before, after = price(op, off, dtype), price(op, on, dtype)
            if dtype is Dtype.FP8 and expert_gemm_kind(op) is not None:
                assert op.gemm is not None
                assert before == quantized_gemm_time_s(op.gemm, off, Dtype.FP8, Fp8Recipe.DELAYED)
                moved += after != before
            else:
                assert after == before, (op.name, dtype)
    assert moved == 6


def test_an_fp4_expert_carries_the_ratio_on_a_blackwell_profile():
    b200 = load_hardware("b200-sxm-180gb")
    assert b200.peak_fp4_flop_per_s is not None  # its own points (here) take the place of the H100's
    g = FC1.gemm
    assert g is not None
    hw = profile(b200, [fc1_point(b200, 300.0)], carry=True)
    r = grouped_gemm_ratio("fc1", g, hw)
    assert r == pytest.approx(grouped_gemm_time_s("fc1", g, hw) / gemm_time_s(g, hw), rel=1e-12)
    expected = max(
        quantized_gemm_time_s(g, hw, Dtype.FP4, Fp8Recipe.DELAYED) * r,
        quantized_gemm_floor_s(g, hw, Dtype.FP4, Fp8Recipe.DELAYED),
    )
    assert price(FC1, hw, Dtype.FP4) == pytest.approx(expected, rel=1e-12)
    assert price(FC1, hw, Dtype.FP4) > quantized_gemm_time_s(g, hw, Dtype.FP4, Fp8Recipe.DELAYED)


def test_the_key_needs_grouped_points_or_a_profile_to_carry_them_from():
    data = read_yaml(ROOT / "hwprofiles" / "b200-sxm-180gb.yaml")
    del data["compute"]["grouped_ratio_from"]
    with pytest.raises(
        ValueError,
        match="grouped_ratio_for_quantized needs compute.grouped_gemm_points or compute.grouped_ratio_from",
    ):
        HardwareProfile.model_validate(data)


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "hwprofiles").glob("*.yaml")))
def test_the_carry_over_is_declared_where_a_grouped_ratio_exists_and_says_it_is_assumed(name):
    """The H100 (its own points) and the profiles carrying its ratio (`grouped_ratio_from`)
    declare it; the A100s, with neither, do not."""
    hw = load_hardware(name)
    has_ratio = bool(hw.compute.grouped_gemm_points) or hw.compute.grouped_ratio_from is not None
    assert hw.compute.grouped_ratio_for_quantized is has_ratio
    assert has_ratio is not name.startswith("a100")
    if hw.compute.grouped_ratio_for_quantized:
        source = hw.compute.sources["grouped_ratio_for_quantized"]
        assert source.startswith("ASSUMED") and "Risk" in source


def test_the_doc_script_prints_what_the_pricing_gives():
    """docs/calibration/grouped_fp8_carry.py, whose tables docs/calibration/grouped_gemm.md
    quotes: its carried price is the op's FP8 price on the shipped H100, and r > 1 on the
    Qwen3-30B-A3B fc2 (the measured grouped kernel slower than the GEMM model there)."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "calibration" / "grouped_fp8_carry.py"), "--json"],
        capture_output=True, text=True, check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)},
    ).stdout  # fmt: skip
    rows = json.loads(out)["public_h100_fp8_expert_gemms"]
    qwen = {r["kind"]: r for r in rows if r["run"] == "bridge26.04-qwen3-30b-a3b-h100-fp8cs"}
    assert len(rows) == 4 * 6 and set(qwen) == {
        "fc1",
        "fc2",
        "fc1.dgrad",
        "fc2.dgrad",
        "fc1.wgrad",
        "fc2.wgrad",
    }
    for row in qwen.values():
        if row["kind"] in ("fc1", "fc2"):  # the forward ones, rebuilt as ops here
            g = GemmShape(row["m"], row["n"], row["k"], row["groups"])
            module = Module.EXPERT_FC1 if row["kind"] == "fc1" else Module.EXPERT_FC2
            op = Op("expert", OpKind.GEMM, gemm=g, module=module, pass_=Pass.FORWARD)
            assert row["carried_us"] == round(price(op, SHIPPED) * 1e6, 1)
        expected = max(row["fp8_model_us"] * row["ratio"], row["floor_us"])
        assert row["carried_us"] == pytest.approx(expected, abs=0.2)  # the printed figures are rounded
    assert qwen["fc2"]["ratio"] > 1.05
