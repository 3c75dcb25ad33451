"""The MoE layer wired into the workload (`workload.moe_layer`, `workload.model`,
`workload.moe_mfu`): its op graph's FLOPs and saved bytes are the building blocks'
formulas, expert parallelism moves expert work without changing its total, expert
weights shrink with ep, chunks hold dense first layers and MoE layers, and MFU counts
active parameters."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simcluster.config.scenario import load_scenario, parse_scenario
from simcluster.workload.flops import layer_forward_flops, layer_widths
from simcluster.workload.model import build_workload, kind_ops, layer_config
from simcluster.workload.moe import moe_forward_flops, rank_forward_flops
from simcluster.workload.moe_config import MoEConfig
from simcluster.workload.moe_layer import MoELayerSpec, layer_rows, moe_mlp_ops
from simcluster.workload.moe_memory import moe_saved_bytes
from simcluster.workload.moe_mfu import moe_layer_forward_flops, moe_model_flops
from simcluster.workload.moe_params import MoEModelShape, param_counts
from simcluster.workload.ops import CollectiveKind, CommGroup, Module, OpKind, Pass
from tests.paths import ROOT

MIXTRAL = ROOT / "scenarios" / "moe" / "mixtral-8x7b-h100.yaml"
QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"
EXPERT_MODULES = {Module.ROUTER, Module.EXPERT_FC1, Module.EXPERT_FC2, Module.SHARED_FC1, Module.SHARED_FC2}


def _data(path=QWEN, **changes):
    import yaml

    data = yaml.safe_load(path.read_text())
    for dotted, value in changes.items():
        section, *rest = dotted.split(".")
        target = data[section]
        for key in rest[:-1]:
            target = target[key]
        target[rest[-1]] = value
    return data


def _scenario(path=QWEN, **changes):
    return parse_scenario(_data(path, **changes), "s.yaml")


def _moe_kind(scenario):
    workload = build_workload(scenario)
    kind = workload.layer_kind
    assert kind is not None and kind.moe is not None
    return workload, kind


def _forward_gemm_flops(ops, modules):
    return sum(
        op.flops for op in ops if op.kind is OpKind.GEMM and op.pass_ is Pass.FORWARD and op.module in modules
    )


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"model.moe.load_imbalance": 1.5},
        {"model.moe.shared_expert_ffn_hidden_size": 1536},
        {"parallel.tp": 2, "parallel.dp": 16, "parallel.sequence_parallel": True},
        {"parallel.tp": 2, "parallel.dp": 16, "parallel.sequence_parallel": True, "parallel.etp": 1},
    ],
)
def test_op_graph_flops_are_the_building_blocks_formula(changes):
    scenario = _scenario(**changes)
    workload, kind = _moe_kind(scenario)
    spec, cfg = kind.moe, kind.config
    rows = layer_rows(cfg, spec)
    expected = rank_forward_flops(rows, cfg.hidden_size, spec.moe, spec.layout, gated=True)
    ops = workload.layer.forward
    assert _forward_gemm_flops(ops, {Module.ROUTER}) == pytest.approx(expected.router, rel=1e-12)
    assert _forward_gemm_flops(ops, {Module.EXPERT_FC1, Module.EXPERT_FC2}) == pytest.approx(
        expected.experts, rel=1e-12
    )
    assert _forward_gemm_flops(ops, {Module.SHARED_FC1, Module.SHARED_FC2}) == pytest.approx(
        expected.shared, rel=1e-12
    )
    # backward: an input-gradient and a weight-gradient GEMM per forward GEMM, same FLOPs each
    back = [op for op in workload.layer.backward if op.kind is OpKind.GEMM and op.module in EXPERT_MODULES]
    assert sum(op.flops for op in back) == pytest.approx(2 * expected.total, rel=1e-12)


def test_mean_rank_times_the_ranks_is_moe_py_block_flops():
    """Balanced routing: the stage's tp·cp·dp ranks together do moe.moe_forward_flops of the
    dp microbatches, router included."""
    scenario = _scenario()
    workload, kind = _moe_kind(scenario)
    par, m = scenario.parallel, scenario.model
    per_rank = _forward_gemm_flops(workload.layer.forward, EXPERT_MODULES)
    ranks = par.tp * par.cp * par.dp
    tokens = m.seq_length * scenario.training.micro_batch_size * par.dp
    assert per_rank * ranks == pytest.approx(
        moe_forward_flops(tokens, m.hidden_size, kind.moe.moe, True), rel=1e-12
    )


@pytest.mark.parametrize("path", [QWEN, MIXTRAL])
def test_ep_does_not_change_total_expert_flops(path):
    totals = {}
    for ep in (1, 2, 4, 8):
        scenario = _scenario(path, **{"parallel.ep": ep})
        workload, _ = _moe_kind(scenario)
        par = scenario.parallel
        per_rank = _forward_gemm_flops(workload.layer.forward, {Module.EXPERT_FC1, Module.EXPERT_FC2})
        totals[ep] = per_rank * par.tp * par.cp * par.dp
        # the per-expert shape: batch = local experts
        fc1 = next(op for op in workload.layer.forward if op.module is Module.EXPERT_FC1)
        assert fc1.gemm.batch == scenario.model.moe.num_experts // ep
    assert len({round(v) for v in totals.values()}) == 1, totals


def test_sequential_experts_are_one_gemm_per_local_expert_with_the_same_flops():
    grouped = _moe_kind(_scenario())[0].layer
    sequential = _moe_kind(_scenario(**{"training.moe_grouped_gemm": False}))[0].layer
    local = 128 // 8
    count = lambda ops: sum(1 for op in ops if op.module is Module.EXPERT_FC1)  # noqa: E731
    assert count(grouped.forward) == 1 and count(sequential.forward) == local
    modules = {Module.EXPERT_FC1, Module.EXPERT_FC2}
    assert _forward_gemm_flops(sequential.forward, modules) == _forward_gemm_flops(grouped.forward, modules)


@pytest.mark.parametrize(
    "changes", [{}, {"model.moe.shared_expert_ffn_hidden_size": 1536}, {"parallel.ep": 2}]
)
def test_saved_bytes_are_moe_memory_plus_the_block_input(changes):
    scenario = _scenario(**changes)
    _, kind = _moe_kind(scenario)
    cfg, spec = kind.config, kind.moe
    forward, _ = moe_mlp_ops(cfg, spec)
    e = cfg.element_bytes
    expected = moe_saved_bytes(
        layer_rows(cfg, spec), cfg.hidden_size, spec.moe, spec.layout, True, e, e
    ).total
    block_input = e * cfg.region_tokens * cfg.hidden_size
    assert sum(op.saved_bytes for op in forward) == pytest.approx(expected + block_input, rel=1e-12)


def test_moe_layer_keeps_the_dense_attention_and_drops_the_dense_mlp():
    scenario = _scenario()
    workload, kind = _moe_kind(scenario)
    dense = kind_ops(type(kind)(kind.config, kind.cp))
    modules = {op.module for op in workload.layer.forward + workload.layer.backward}
    assert not modules & {Module.FC1, Module.FC2}
    attention = [op for op in dense.forward if op.module in {Module.QKV, Module.FLASH, Module.PROJ}]
    assert all(op in workload.layer.forward for op in attention)


def test_dispatch_and_combine_are_all_to_alls_over_the_ep_group_each_way():
    workload, _ = _moe_kind(_scenario())
    for phase in (workload.layer.forward, workload.layer.backward):
        a2a = [op for op in phase if op.collective is CollectiveKind.ALL_TO_ALL]
        assert len(a2a) == 3  # tokens and probs out, tokens back
        assert {op.group for op in a2a} == {CommGroup.EP}
    # ep = 1, etp = 1: nothing to send
    single, _ = _moe_kind(_scenario(**{"parallel.ep": 1}))
    assert not [op for op in single.layer.forward if op.kind is OpKind.COLLECTIVE]


def test_full_recompute_keeps_only_the_layer_input_and_reruns_the_moe_block():
    workload, _ = _moe_kind(_scenario(**{"training.recompute": "full"}))
    layer = workload.layer
    assert [op.saved_bytes > 0 for op in layer.forward].count(True) == 1
    assert any(op.module is Module.EXPERT_FC1 for op in layer.recompute)


def test_expert_weights_shrink_with_ep_and_dense_memory_does_not():
    statics = {}
    for ep in (1, 2, 4, 8):
        stage = build_workload(_scenario(MIXTRAL, **{"parallel.ep": ep})).stages[1]
        statics[ep] = stage
    for a, b in ((1, 2), (2, 4), (4, 8)):
        assert statics[b].static.weight_bytes < statics[a].static.weight_bytes
        assert statics[b].expert_gradient_bytes == pytest.approx(statics[a].expert_gradient_bytes / 2)
        assert statics[b].dp_gradient_bytes == statics[a].dp_gradient_bytes
    # Mixtral stage 1: 8 MoE layers; one expert 3·4096·14336 params, E/ep per rank
    expert = 3 * 4096 * 14336
    assert statics[8].expert_gradient_bytes == 4 * 8 * 1 * expert


def test_first_dense_layers_are_their_own_segment():
    scenario = _scenario(**{"model.moe.first_k_dense_layers": 30})  # pp 2: 24 layers a stage
    workload = build_workload(scenario)
    first, second = (stage.chunks[0].segments for stage in workload.stages)
    assert [(s.kind.moe is None, s.num_layers) for s in first] == [(True, 24)]
    assert [(s.kind.moe is None, s.num_layers) for s in second] == [(True, 6), (False, 18)]
    assert any(op.module is Module.FC1 for op in second[0].layer.forward)


def test_dense_scenarios_build_one_dense_segment():
    scenario = load_scenario(ROOT / "scenarios" / "modern" / "llama3-8b-h100.yaml")
    workload = build_workload(scenario)
    for stage in workload.stages:
        assert stage.expert_gradient_bytes == 0.0
        for chunk in stage.chunks:
            assert len(chunk.segments) == 1 and chunk.segments[0].kind.moe is None


def test_mfu_counts_active_parameters_without_the_router():
    """Megatron's convention (docs/moe.md): forward model FLOPs less the attention core are
    2·tokens·(active parameters − input embedding − norms − routers), with the output layer
    counted once as the logits GEMM."""
    scenario = load_scenario(MIXTRAL)
    m, tr = scenario.model, scenario.training
    cfg = layer_config(scenario)
    widths = layer_widths(cfg)
    moe = MoEConfig(**m.moe.model_dump())
    B, s, L, v = tr.global_batch_size, m.seq_length, m.num_layers, m.vocab_size
    model, hardware = moe_model_flops(B, s, L, v, widths, moe, tr.recompute)
    assert hardware == model  # no recompute
    core = L * 4.0 * B * s * s * widths.attention_width
    counts = param_counts(
        MoEModelShape(
            L, m.hidden_size, v, m.num_attention_heads, m.ffn_size, moe, num_query_groups=m.query_groups
        )
    )
    linear = counts.active - counts.embedding - counts.norms - L * m.moe.num_experts * m.hidden_size
    assert model / 3 - core == pytest.approx(2.0 * B * s * linear, rel=1e-12)
    # Mixtral 8x7B's published 12.9B active parameters (docs/moe.md table)
    assert round(counts.active / 1e9, 1) == 12.9
    # a dense first layer counts its whole MLP
    with_dense, _ = moe_model_flops(B, s, L, v, widths, replace(moe, first_k_dense_layers=1), tr.recompute)
    delta = layer_forward_flops(B, s, widths) - moe_layer_forward_flops(B, s, widths, moe)
    assert with_dense - model == pytest.approx(3 * delta, rel=1e-12)


def test_moe_layer_spec_is_a_cache_key_by_value():
    a, b = _moe_kind(_scenario())[1].moe, _moe_kind(_scenario())[1].moe
    assert a == b and hash(a) == hash(b) and isinstance(a, MoELayerSpec)
