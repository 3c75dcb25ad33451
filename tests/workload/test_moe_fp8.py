"""FP8 and NVFP4 experts (`workload.fp8`, `workload.moe_layer`, `workload.model`): the routed
and shared experts' GEMMs are Transformer Engine linears, the router is not; the experts
keep quantized inputs for backward; their FP8 weight copies are in static memory, gathered
over the expert-data-parallel group under fp8_param_gather."""

from __future__ import annotations

import pytest
import yaml

from simcluster.config.scenario import parse_scenario
from simcluster.workload.fp8 import EXPERT_LINEARS, is_te_linear_gemm, te_linear_weight_params
from simcluster.workload.model import build_workload
from simcluster.workload.ops import Module, OpKind, Pass
from tests.paths import ROOT

QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"


def _scenario(dtype="bf16", shared=0, recipe="delayed", **training):
    data = yaml.safe_load(QWEN.read_text())
    data["model"]["moe"]["shared_expert_ffn_hidden_size"] = shared
    data["parallel"].update(tp=2, dp=16, sequence_parallel=True, etp=1)
    data["training"].update(dtype=dtype, fp8_recipe=recipe, **training)
    return parse_scenario(data, "s.yaml")


def _moe_layer(scenario, copies=2):
    workload = build_workload(scenario, copies)
    seg = next(s for s in workload.stages[0].chunks[0].segments if s.kind.moe)
    return workload, seg.layer


def test_expert_and_shared_gemms_are_te_linears_and_the_router_is_not():
    _, layer = _moe_layer(_scenario("fp8", shared=1536))
    gemms = [op for op in layer.forward + layer.backward if op.kind is OpKind.GEMM]
    te = {op.module for op in gemms if is_te_linear_gemm(op)}
    assert {Module.EXPERT_FC1, Module.EXPERT_FC2, Module.SHARED_FC1, Module.SHARED_FC2} <= te
    assert Module.ROUTER not in te and any(op.module is Module.ROUTER for op in gemms)


def test_fp8_experts_keep_one_byte_inputs():
    """Expert fc1 / fc2 and shared fc2 inputs drop from 2 bytes to 1; the shared fc1 adds an
    FP8 copy of its local (SP) input, T·h bytes; nothing else changes."""
    _, bf16 = _moe_layer(_scenario("bf16", shared=1536))
    _, fp8 = _moe_layer(_scenario("fp8", shared=1536))
    moe_modules = {Module.EXPERT_FC1, Module.EXPERT_FC2, Module.SHARED_FC1, Module.SHARED_FC2}
    saved = {
        op.module: op.saved_bytes
        for op in bf16.forward
        if op.kind is OpKind.GEMM and op.module in moe_modules
    }
    saved8 = {
        op.module: op.saved_bytes for op in fp8.forward if op.kind is OpKind.GEMM and op.module in moe_modules
    }
    for module in (Module.EXPERT_FC1, Module.EXPERT_FC2, Module.SHARED_FC2):
        assert saved8[module] == pytest.approx(saved[module] / 2)
    shared_fc1 = next(op for op in fp8.forward if op.module is Module.SHARED_FC1 and op.kind is OpKind.GEMM)
    local_elements = shared_fc1.gemm.m * shared_fc1.gemm.k / 2  # gathered over tp = 2
    assert saved8[Module.SHARED_FC1] == pytest.approx(saved[Module.SHARED_FC1] + local_elements)
    router = [op.saved_bytes for op in bf16.forward if op.module is Module.ROUTER]
    assert router == [op.saved_bytes for op in fp8.forward if op.module is Module.ROUTER]


@pytest.mark.parametrize(("dtype", "recipe"), [("fp8", "tensorwise"), ("fp4", "delayed")])
def test_current_scaling_and_nvfp4_give_every_expert_gemm_its_quantization_and_drop_the_dense_mlps(
    dtype, recipe
):
    """Each FP8_SCALE op is followed (past its all-reduce / gather) by a TE GEMM of the MoE
    layer; none is left over from the dense MLP the MoE block replaced."""
    _, layer = _moe_layer(_scenario(dtype, shared=1536, recipe=recipe))
    for ops in (layer.forward, layer.backward):
        assert not [op for op in ops if op.module in (Module.FC1, Module.FC2)]
        scales = [i for i, op in enumerate(ops) if op.module is Module.FP8_SCALE]
        assert scales
        for i in scales:
            nxt = next(op for op in ops[i + 1 :] if op.kind is not OpKind.COLLECTIVE)
            assert is_te_linear_gemm(nxt), (ops[i].name, nxt.name)
        expert_fprops = [op for op in ops if op.module in EXPERT_LINEARS and op.pass_ is not Pass.WEIGHT_GRAD]
        assert len(scales) >= len(expert_fprops)


def test_expert_fp8_weight_copies_are_static_memory_and_gathered_over_edp():
    """Static weights grow by copies × (dense + expert) TE weights; with fp8_param_gather the
    expert parameter all-gather (expert-data-parallel group) carries 1 byte per expert weight
    instead of 2, and the dense gather loses only the dense TE weights' byte."""
    base = build_workload(_scenario("bf16", use_distributed_optimizer=True), 2)
    fp8 = build_workload(_scenario("fp8", use_distributed_optimizer=True), 2)
    gathered = build_workload(_scenario("fp8", use_distributed_optimizer=True, fp8_param_gather=True), 2)
    stage = len(fp8.stages) - 1
    chunks = fp8.stages[stage].chunks
    te = sum(s.num_layers * te_linear_weight_params(s.layer.forward) for c in chunks for s in c.segments)
    expert_te = sum(
        s.num_layers * te_linear_weight_params(s.layer.forward, EXPERT_LINEARS)
        for c in chunks
        for s in c.segments
    )
    assert expert_te > 0 and te > expert_te
    grow = fp8.stages[stage].static.weight_bytes - base.stages[stage].static.weight_bytes
    assert grow == pytest.approx(2 * te)  # two FP8 copies (Hopper), 1 byte each
    assert base.stages[stage].expert_param_gather_bytes - gathered.stages[
        stage
    ].expert_param_gather_bytes == pytest.approx(expert_te)
    assert base.stages[stage].param_gather_bytes - gathered.stages[stage].param_gather_bytes == pytest.approx(
        te - expert_te
    )
    # expert weights per rank: E/ep local experts × (h·2f + f·h) per MoE layer
    moe = fp8.scenario.model.moe
    layers = sum(s.num_layers for c in chunks for s in c.segments if s.kind.moe)
    h = fp8.scenario.model.hidden_size
    assert expert_te == layers * (moe.num_experts // 8) * 3 * h * moe.ffn_hidden_size
