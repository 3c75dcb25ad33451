"""MLA and MTP wired into the workload (`workload.mla_layer`, `workload.mtp`,
`workload.model`, `workload.mla_mfu`): the MLA op graph's GEMMs, core FLOPs and saved
bytes are `workload.mla`'s formulas, the MTP layer sits on the last stage only, the
parameters per stage add up to the model's count, and MFU counts what Megatron counts."""

from __future__ import annotations

import pytest
import yaml

from simcluster.config import ConfigError
from simcluster.config.scenario import parse_scenario
from simcluster.workload.flops import layer_widths
from simcluster.workload.layer import LayerOps
from simcluster.workload.mla import MLAShape, mla_forward_flops, mla_rank_gemms, mla_saved_bytes
from simcluster.workload.mla_layer import DENSE_ATTENTION_MODULES, MLALayerSpec, mla_attention_ops
from simcluster.workload.mla_mfu import ModelShape, variant_model_flops
from simcluster.workload.model import build_workload, mla_spec
from simcluster.workload.moe_config import MoEConfig
from simcluster.workload.moe_params import MoEModelShape, mtp_extra_forward_flops, param_counts
from simcluster.workload.ops import Module, OpKind, Pass
from tests.paths import ROOT

DSV3 = ROOT / "scenarios" / "moe" / "deepseek-v3-h100.yaml"
MLA_MODULES = {Module.MLA_DOWN, Module.MLA_UP, Module.MLA_Q_PROJ, Module.PROJ}


def _data(**changes):
    data = yaml.safe_load(DSV3.read_text())
    for dotted, value in changes.items():
        section, *rest = dotted.split(".")
        target = data[section]
        for key in rest[:-1]:
            target = target[key]
        if value is None:
            target.pop(rest[-1], None)
        else:
            target[rest[-1]] = value
    return data


def _scenario(**changes):
    return parse_scenario(_data(**changes), "s.yaml")


# a small DeepSeek-V3-shaped model: quick to build, the same structure
SMALL = {
    "model.num_layers": 6,
    "model.hidden_size": 512,
    "model.num_attention_heads": 8,
    "model.seq_length": 256,
    "model.vocab_size": 1024,
    "model.ffn_hidden_size": 1024,
    "model.moe.num_experts": 8,
    "model.moe.router_topk": 2,
    "model.moe.ffn_hidden_size": 256,
    "model.moe.shared_expert_ffn_hidden_size": 256,
    "model.moe.first_k_dense_layers": 1,
    "model.mla.q_lora_rank": 96,
    "model.mla.kv_lora_rank": 64,
    "model.mla.qk_head_dim": 32,
    "model.mla.qk_pos_emb_head_dim": 16,
    "model.mla.v_head_dim": 32,
    "parallel.pp": 2,
    "parallel.dp": 4,
    "parallel.ep": 8,
    "parallel.first_pipeline_num_layers": None,
    "parallel.last_pipeline_num_layers": None,
    "training.global_batch_size": 16,
}


def _small(**changes):
    return _scenario(**(SMALL | changes))


def _mla_kind(scenario):
    workload = build_workload(scenario)
    kind = workload.layer_kind
    assert kind is not None and kind.mla is not None
    return workload, kind


def _mla_ops(layer: LayerOps, pass_: Pass):
    ops = layer.forward if pass_ is Pass.FORWARD else layer.backward
    return [op for op in ops if op.module in MLA_MODULES | {Module.FLASH, Module.ROPE}]


@pytest.mark.parametrize(
    "changes", [{}, {"parallel.tp": 1, "parallel.sequence_parallel": False, "parallel.dp": 8}]
)
def test_forward_gemms_are_mla_rank_gemms(changes):
    """Every forward GEMM of the MLA block is one of `mla.mla_rank_gemms`' shapes."""
    workload, kind = _mla_kind(_small(**changes))
    cfg = kind.config
    expected = mla_rank_gemms(
        MLAShape(cfg.hidden_size, cfg.num_attention_heads, kind.mla.mla),
        cfg.tokens,
        cfg.tp,
        cfg.sequence_parallel,
    )
    got = {
        op.name: op.gemm
        for op in workload.layer.forward
        if op.kind is OpKind.GEMM and op.module in MLA_MODULES
    }
    assert got == expected


@pytest.mark.parametrize("tp", [1, 2])
def test_block_flops_summed_over_tp_ranks_are_mla_forward_flops(tp):
    """tp × one rank's MLA GEMM and core FLOPs == the whole layer's `mla_forward_flops`
    (causal core, no window): the down projections split by rows, the rest by heads."""
    changes = {"parallel.tp": tp, "parallel.sequence_parallel": tp > 1, "parallel.dp": 8 // tp}
    workload, kind = _mla_kind(_small(**changes))
    cfg = kind.config
    rank = sum(op.flops for op in _mla_ops(workload.layer, Pass.FORWARD))
    shape = MLAShape(cfg.hidden_size, cfg.num_attention_heads, kind.mla.mla)
    assert tp * rank == pytest.approx(
        mla_forward_flops(shape, cfg.micro_batch_size, cfg.seq_length), rel=1e-12
    )


def _ln1_and_bda_saved(layer: LayerOps) -> float:
    ops = layer.forward
    ln1 = next(op for op in ops if op.name == "ln1")
    bda = next(op for op in ops if op.name == "attn.bias_dropout_add")
    return ln1.saved_bytes + bda.saved_bytes


@pytest.mark.parametrize(
    ("modules", "up_proj", "minus_lse"),
    [
        (None, False, False),
        (["mla_up_proj"], True, False),
        (["core_attn"], False, True),
        (["core_attn", "mla_up_proj"], True, True),
    ],
)
def test_saved_bytes_are_mla_saved_bytes(modules, up_proj, minus_lse):
    """The attention block keeps ln1's input, `mla.mla_saved_bytes` and the bias-dropout-add's
    mask; `core_attn` recompute frees the LSE on top."""
    changes = (
        {} if modules is None else {"training.recompute": "selective", "training.recompute_modules": modules}
    )
    workload, kind = _mla_kind(_small(**changes))
    cfg = kind.config
    shape = MLAShape(cfg.hidden_size, cfg.num_attention_heads, kind.mla.mla)
    expected = mla_saved_bytes(shape, cfg.tokens, cfg.tp, cfg.sequence_parallel, cfg.element_bytes, up_proj)
    if minus_lse:
        expected -= 4 * cfg.tokens * cfg.num_attention_heads / cfg.tp
    attention = [
        op
        for op in workload.layer.forward
        if op.module in MLA_MODULES | {Module.FLASH, Module.ROPE, Module.LAYERNORM}
        and op.name not in ("ln1", "ln2")
    ]
    assert sum(op.saved_bytes for op in attention) == pytest.approx(expected, rel=1e-12)
    assert _ln1_and_bda_saved(workload.layer) > 0


def test_mla_up_proj_recompute_reruns_the_up_projections_and_core_attn_the_flash_forward():
    workload, _ = _mla_kind(
        _small(**{"training.recompute": "selective", "training.recompute_modules": ["mla_up_proj"]})
    )
    names = {op.name for op in workload.layer.recompute}
    assert {"attn.q_up", "attn.kv_up", "attn.rope", "attn.q_up.ln", "attn.kv_up.ln"} <= names
    assert "attn.flash" not in names
    assert all(op.saved_bytes == 0 for op in workload.layer.recompute)
    workload, _ = _mla_kind(_small(**{"training.recompute": "selective"}))
    assert [op.name for op in workload.layer.recompute] == ["attn.flash"]


def test_mla_replaces_the_dense_attention_and_keeps_the_moe_mlp():
    workload, _ = _mla_kind(_small())
    for ops in (workload.layer.forward, workload.layer.backward):
        modules = {op.module for op in ops}
        assert not modules & (DENSE_ATTENTION_MODULES - {Module.PROJ, Module.FLASH, Module.ROPE})
        assert {Module.MLA_DOWN, Module.MLA_UP, Module.EXPERT_FC1, Module.ROUTER} <= modules


def test_backward_has_dgrad_and_wgrad_for_every_forward_gemm():
    """Each MLA GEMM of the forward has its input-gradient and weight-gradient GEMMs with the
    same FLOPs (2·m·n·k each way)."""
    workload, kind = _mla_kind(_small())
    forward, backward, _ = mla_attention_ops(kind.config, kind.mla)
    for op in (op for op in forward if op.kind is OpKind.GEMM):
        grads = [b for b in backward if b.name in (f"{op.name}.dgrad", f"{op.name}.wgrad")]
        assert [g.pass_ for g in grads] == [Pass.INPUT_GRAD, Pass.WEIGHT_GRAD]
        assert all(g.flops == op.flops for g in grads)


def test_core_has_the_qk_and_v_head_dims():
    """The flash op contracts Q·K over qk + rope and P·V over v: 2·b·n/tp·s²/2·(192 + 128)."""
    workload, kind = _mla_kind(_scenario())
    flash = next(op for op in workload.layer.forward if op.module is Module.FLASH)
    assert flash.attention.head_dim == 192 and flash.attention.v_head_dim == 128
    s, n = 4096, 128 // 2
    assert flash.flops == 2.0 * n * s * s / 2 * (192 + 128)


def test_mtp_layer_is_on_the_last_stage_only():
    workload = build_workload(_small())
    *others, last = workload.stages
    assert sum(c.num_layers for stage in workload.stages for c in stage.chunks) == 6 + 1
    assert last.chunks[-1].segments[-1].num_layers == 1
    assert last.chunks[-1].segments[-1].kind.moe is not None  # the model's last layer is MoE
    assert any(op.name.startswith("mtp0.") for op in last.chunks[-1].output.forward)
    for stage in others:
        assert sum(c.num_layers for c in stage.chunks) == 3
        assert all(c.output is None for c in stage.chunks)
    no_mtp = build_workload(_small(**{"model.mtp_num_layers": 0}))
    assert no_mtp.stages[-1].chunks[-1].output.saved_bytes < last.chunks[-1].output.saved_bytes
    # MTP reads the word embedding on the last stage: its gradient is reduced with stage 0's
    assert last.embedding_grad_bytes > 0 and no_mtp.stages[-1].embedding_grad_bytes == 0


def test_params_per_stage_add_up_to_the_model_count():
    """At tp = 1, pp = 1, ep = 1 the stage's parameters are `moe_params.param_counts` (MLA,
    MoE, MTP) plus the linear biases simcluster counts (Megatron's default add_bias_linear:
    linear_proj's h per attention, fc1 and fc2's on each dense MLP)."""
    scenario = _small(
        **{
            "parallel.pp": 1,
            "parallel.ep": 1,
            "parallel.dp": 1,
            "parallel.tp": 1,
            "parallel.sequence_parallel": False,
            "training.global_batch_size": 4,
        }
    )
    m = scenario.model
    (stage,) = build_workload(scenario).stages
    moe = MoEConfig(**m.moe.model_dump())
    counts = param_counts(
        MoEModelShape(
            m.num_layers,
            m.hidden_size,
            m.vocab_size,
            m.num_attention_heads,
            m.ffn_size,
            moe,
            mla=mla_spec(scenario).mla,
            mtp_num_layers=1,
        )
    )
    h, dense = m.hidden_size, moe.first_k_dense_layers
    biases = (m.num_layers + 1) * h + dense * (2 * m.ffn_size + h)
    assert stage.num_params == counts.total + biases


def test_mfu_counts_mla_linears_unhalved_core_and_the_mtp_layer():
    scenario = _small()
    m, tr = scenario.model, scenario.training
    B, s, L, v, h = tr.global_batch_size, m.seq_length, m.num_layers, m.vocab_size, m.hidden_size
    moe = MoEConfig(**m.moe.model_dump())
    spec = mla_spec(scenario)
    widths = layer_widths(build_workload(scenario).layer_config)
    shape = ModelShape(widths, m.num_attention_heads, moe, spec, 1)
    model, hardware = variant_model_flops(B, s, L, v, shape, tr.recompute)
    no_mtp, _ = variant_model_flops(
        B, s, L, v, ModelShape(widths, m.num_attention_heads, moe, spec, 0), tr.recompute
    )
    mla = MLAShape(h, m.num_attention_heads, spec.mla)
    attention = 2.0 * B * s * mla.linear_weights + 2 * (
        mla_forward_flops(mla, B, s) - 2.0 * B * s * mla.linear_weights
    )
    mlp_moe = 2.0 * B * s * 3 * h * (2 * 256 + 256)  # top-2 experts + the shared one, SwiGLU
    assert no_mtp == pytest.approx(
        3 * (L * attention + 3 * B * s * 2 * h * 1024 + 5 * mlp_moe + 2.0 * B * s * h * v)
    )
    extra = mtp_extra_forward_flops(B * s, h, v)
    assert model - no_mtp == pytest.approx(3 * (attention + mlp_moe + extra))
    assert hardware == model  # no recompute


def test_golden_dense_kinds_have_no_mla():
    """A scenario without MLA builds the same layer kind as before (mla None)."""
    workload = build_workload(_small(**{"model.mla": None, "model.mtp_num_layers": 0}))
    assert workload.layer_kind is not None and workload.layer_kind.mla is None


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"training.attention_backend": "unfused"}, "training.attention_backend"),
        ({"parallel.cp": 2, "parallel.dp": 2}, "parallel.cp"),
        ({"model.num_query_groups": 4}, "model.num_query_groups"),
    ],
)
def test_mla_settings_not_priced_are_one_clear_error(changes, field):
    with pytest.raises(ConfigError) as caught:
        _small(**changes)
    assert f"{field}=" in str(caught.value) or f"{field}: value" in str(caught.value)


def test_spec_reads_the_recompute_modules():
    assert mla_spec(_small()) == MLALayerSpec(mla_spec(_small()).mla)
    spec = mla_spec(
        _small(**{"training.recompute": "selective", "training.recompute_modules": ["mla_up_proj"]})
    )
    assert spec is not None and spec.recompute_up_proj and not spec.recompute_core_attn


def test_the_deepseek_v3_scenario_runs_fits_and_counts_megatron_flops():
    """The shipped scenario simulates (steady state), every stage fits in 80 GB, its model
    FLOPs are `mla_mfu.variant_model_flops`' count, and per token they sit between 6 × the
    active parameters without and with the input embedding plus the attention core (a check
    of scale: DeepSeek-V3 has 37B active parameters, arXiv 2412.19437)."""
    from simcluster.config.scenario import load_scenario_and_hardware
    from simcluster.simulation import run_simulation

    scenario, hw = load_scenario_and_hardware(DSV3)
    result = run_simulation(scenario, hw, steady_state=True).result
    assert all(stage.fits for stage in result.stages)
    m, tr = scenario.model, scenario.training
    widths = layer_widths(build_workload(scenario).layer_config)
    shape = ModelShape(widths, m.num_attention_heads, MoEConfig(**m.moe.model_dump()), mla_spec(scenario), 1)
    B, s = tr.global_batch_size, m.seq_length
    expected, _ = variant_model_flops(B, s, m.num_layers, m.vocab_size, shape, tr.recompute)
    assert result.model_flops == expected
    per_token = result.model_flops / (B * s)
    assert 6 * 37e9 < per_token < 6 * 37e9 * 1.5


@pytest.mark.parametrize("up_proj", [False, True])
def test_without_a_query_bottleneck_q_proj_is_one_column_parallel_linear(up_proj):
    """q_lora_rank null (DeepSeek-V2-Lite): one linear_q_proj h -> n·(qk + rope); the block's
    FLOPs over the tp ranks and its saved bytes are still `workload.mla`'s."""
    data = _data(**SMALL)
    data["model"]["mla"]["q_lora_rank"] = None
    if up_proj:
        data["training"].update(recompute="selective", recompute_modules=["mla_up_proj"])
    workload, kind = _mla_kind(parse_scenario(data, "s.yaml"))
    cfg = kind.config
    names = {op.name for op in workload.layer.forward}
    assert "attn.q_proj" in names and "attn.q_down" not in names
    shape = MLAShape(cfg.hidden_size, cfg.num_attention_heads, kind.mla.mla)
    rank = sum(op.flops for op in _mla_ops(workload.layer, Pass.FORWARD))
    assert cfg.tp * rank == pytest.approx(
        mla_forward_flops(shape, cfg.micro_batch_size, cfg.seq_length), rel=1e-12
    )
    expected = mla_saved_bytes(shape, cfg.tokens, cfg.tp, cfg.sequence_parallel, cfg.element_bytes, up_proj)
    attention = [
        op
        for op in workload.layer.forward
        if op.module in MLA_MODULES | {Module.FLASH, Module.ROPE, Module.LAYERNORM}
        and op.name not in ("ln1", "ln2")
    ]
    assert sum(op.saved_bytes for op in attention) == pytest.approx(expected, rel=1e-12)
