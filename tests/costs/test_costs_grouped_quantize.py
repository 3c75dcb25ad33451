"""TE `GroupedLinear`'s per-expert split quantization (`workload.fp8.grouped_split_quantize_kernels`,
priced in `costs.chunk._op_seconds`): `tex.split_quantize` quantizes each of the L local
experts' splits with its own quantizer under current scaling (zero-amax, amax, scale, cast:
4 launches a split), MXFP8 and block scaling (one cast a split); delayed scaling and NVFP4 run
one fused launch. The graph already prices one cast (and, under current scaling, one amax and
one scale op) per grouped GEMM input: the rest are added at the profile's kernel launch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simcluster.config.choices import Dtype, Fp8Recipe
from simcluster.config.scenario import load_scenario_and_hardware
from simcluster.costs.chunk import fp8_cast_s, op_time_s, price_ops
from simcluster.costs.placement import expert_groups, tp_group
from simcluster.workload.fp8 import (
    CURRENT_SCALING_SPLIT_KERNELS,
    grouped_split_quantize_extra_kernels,
    grouped_split_quantize_kernels,
)
from simcluster.workload.model import build_workload
from simcluster.workload.ops import GemmShape, Module, Pass, gemm
from tests.paths import ROOT

QWEN3_30B_H100 = ROOT / "benchmarks" / "public_runs" / "bridge26.04-qwen3-30b-a3b-h100-fp8cs.yaml"
FC1 = gemm(
    "moe.experts.fc1",
    GemmShape(m=4096, n=1536, k=2048, batch=8),
    module=Module.EXPERT_FC1,
    pass_=Pass.FORWARD,
)


@pytest.mark.parametrize(
    ("dtype", "recipe", "kernels"),
    [
        (Dtype.FP8, Fp8Recipe.TENSORWISE, 4 * 8),
        (Dtype.FP8, Fp8Recipe.MXFP8, 8),
        (Dtype.FP8, Fp8Recipe.BLOCKWISE, 8),
        (Dtype.FP8, Fp8Recipe.DELAYED, 1),
        (Dtype.FP4, Fp8Recipe.DELAYED, 1),
    ],
)
def test_launches_per_grouped_input_follow_split_quantize(dtype, recipe, kernels):
    assert grouped_split_quantize_kernels(dtype, recipe, 8) == kernels


def test_what_the_graph_prices_already_is_not_counted_twice():
    """Current scaling: 4L less the amax op, the scale op and the cast; MXFP8: L less the cast."""
    assert grouped_split_quantize_extra_kernels(FC1, Dtype.FP8, Fp8Recipe.TENSORWISE) == 4 * 8 - 3
    assert grouped_split_quantize_extra_kernels(FC1, Dtype.FP8, Fp8Recipe.MXFP8) == 8 - 1
    assert grouped_split_quantize_extra_kernels(FC1, Dtype.FP8, Fp8Recipe.DELAYED) == 0


def test_only_grouped_expert_fprop_and_dgrad_in_a_quantized_run_add_launches():
    wgrad = replace(FC1, name="moe.experts.fc1.wgrad", pass_=Pass.WEIGHT_GRAD)
    dgrad = replace(FC1, name="moe.experts.fc1.dgrad", pass_=Pass.INPUT_GRAD)
    one_expert = replace(FC1, gemm=replace(FC1.gemm, batch=1))
    dense = replace(FC1, module=Module.FC1, gemm=replace(FC1.gemm, batch=1))
    tensorwise = (Dtype.FP8, Fp8Recipe.TENSORWISE)
    assert grouped_split_quantize_extra_kernels(dgrad, *tensorwise) == 29
    assert grouped_split_quantize_extra_kernels(wgrad, *tensorwise) == 0  # reuses both quantized operands
    assert grouped_split_quantize_extra_kernels(one_expert, *tensorwise) == 0
    assert grouped_split_quantize_extra_kernels(dense, *tensorwise) == 0
    assert grouped_split_quantize_extra_kernels(FC1, Dtype.BF16, Fp8Recipe.TENSORWISE) == 0


def test_the_qwen3_h100_experts_pay_the_launches_of_their_local_experts():
    """Qwen3-30B-A3B on H100 (128 experts, EP 16: 8 local), FP8 current scaling: each grouped
    fprop / dgrad GEMM costs its GEMM, its cast and (4·8 − 3) kernel launches."""
    scenario, hw = load_scenario_and_hardware(QWEN3_30B_H100)
    local = scenario.model.moe.num_experts // scenario.parallel.ep
    layer = build_workload(scenario, hw.fp8_weight_copies).layer
    tp, experts = tp_group(scenario, hw), expert_groups(scenario, hw)
    recipe = layer.fp8_recipe
    for ops in (layer.forward, layer.backward):
        for index, op in enumerate(ops):
            if op.module not in (Module.EXPERT_FC1, Module.EXPERT_FC2) or op.gemm is None:
                continue
            alone = price_ops((op,), hw, tp, Dtype.FP8, fp8_recipe=recipe, experts=experts).compute_s
            base = op_time_s(op, hw, tp, Dtype.FP8, recipe, experts)
            if op.pass_ is Pass.WEIGHT_GRAD:
                assert alone == pytest.approx(base, rel=1e-12)
                continue
            assert op.gemm.batch == local
            launches = (CURRENT_SCALING_SPLIT_KERNELS * local - 3) * hw.kernel_launch_s
            cast = fp8_cast_s(ops, index, hw, tp, recipe, Dtype.FP8)
            assert alone == pytest.approx(base + cast + launches, rel=1e-12)
