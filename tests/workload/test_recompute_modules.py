"""`training.recompute_modules` in the op graph (`workload.layer`, `workload.moe_layer`): what
each Megatron-core module frees equals its formula (docs/moe.md, "recompute_modules
(simulator)"), its re-run ops are forward ops priced in the backward, and the default set
([core_attn]) is today's selective recompute exactly."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simcluster.config.choices import Activation, AttentionBackend, Recompute
from simcluster.config.moe_choices import RecomputeModule as RM
from simcluster.config.scenario import parse_scenario
from simcluster.workload.flops import hardware_flops, layer_widths, model_flops
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.memory import layer_activation_bytes
from simcluster.workload.model import build_workload, kind_ops
from simcluster.workload.moe import shared_expert_shape
from simcluster.workload.moe_layer import layer_rows
from simcluster.workload.moe_memory import moe_saved_bytes
from simcluster.workload.moe_mfu import moe_model_flops
from simcluster.workload.ops import Module, OpKind, Pass
from tests.paths import ROOT

QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"


def _dense(modules=None, **changes) -> LayerConfig:
    base = dict(
        hidden_size=256, num_attention_heads=8, seq_length=128, micro_batch_size=2, ffn_hidden_size=512,
        tp=2, sequence_parallel=True, recompute=Recompute.SELECTIVE, num_query_groups=4,
        activation=Activation.SWIGLU, attention_backend=AttentionBackend.FLASH, hidden_dropout=0.0,
        attention_dropout=0.0,
    )  # fmt: skip
    base.update(changes)
    return LayerConfig(**base, recompute_modules=None if modules is None else frozenset(modules))


def test_default_modules_are_todays_selective_recompute():
    """null and [core_attn] are one configuration (equal configs, equal ops); a set is only
    kept under selective recompute."""
    assert _dense() == _dense({RM.CORE_ATTN})
    assert layer_ops(_dense()) == layer_ops(_dense({RM.CORE_ATTN}))
    assert _dense({RM.MLP}, recompute=Recompute.NONE).recompute_modules is None
    assert _dense({RM.MLP}, recompute=Recompute.FULL) == _dense(recompute=Recompute.FULL)


def test_empty_set_recomputes_nothing():
    """`--recompute-modules` with no module under selective: the layer of recompute none."""
    empty = layer_ops(_dense(set()))
    none = layer_ops(_dense(recompute=Recompute.NONE))
    assert empty.forward == none.forward and empty.recompute == ()


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("activation", [Activation.SWIGLU, Activation.GELU])
@pytest.mark.parametrize("backend", [AttentionBackend.FLASH, AttentionBackend.UNFUSED])
def test_mlp_frees_the_mlp_activations_and_fc1_input(sp, activation, backend):
    """mlp keeps only norm 2's input: it frees e·sb·h·r (fc1's ln_out) + the activation's
    input e·sb·f·glu/t + fc2's input e·sb·f/t, by hand and by the closed form."""
    cfg = _dense(
        {RM.CORE_ATTN, RM.MLP}, sequence_parallel=sp, activation=activation, attention_backend=backend
    )
    base = replace(cfg, recompute_modules=frozenset({RM.CORE_ATTN}))
    e, sb, h, f, t = 2, 128 * 2, 256, 512, 2
    r = 1 / t if sp else 1
    glu = 2 if activation is Activation.SWIGLU else 1
    freed = e * sb * h * r + e * sb * f * glu / t + e * sb * f / t
    assert layer_ops(base).saved_bytes - layer_ops(cfg).saved_bytes == pytest.approx(freed, rel=1e-12)
    closed = layer_activation_bytes(
        128, 2, h, 8, t, sp, Recompute.SELECTIVE, ffn=f, query_groups=4, activation=activation,
        flash=backend is AttentionBackend.FLASH, hidden_dropout=False, attention_dropout=False,
        recompute_modules=cfg.recompute_modules,
    )  # fmt: skip
    assert layer_ops(cfg).saved_bytes == pytest.approx(closed, rel=1e-12)


def test_mlp_without_core_attn_keeps_the_attention_core():
    """[mlp] alone does not checkpoint the core: the attention saves what it saves without
    recompute (the LSE included), and only the MLP re-runs."""
    cfg = _dense({RM.MLP})
    none = layer_ops(_dense(recompute=Recompute.NONE))
    flash = [op for op in layer_ops(cfg).forward if op.module is Module.FLASH]
    assert flash == [op for op in none.forward if op.module is Module.FLASH]
    assert {op.module for op in layer_ops(cfg).recompute} == {
        Module.LAYERNORM, Module.FC1, Module.SWIGLU, Module.FC2
    }  # fmt: skip
    closed = layer_activation_bytes(
        128, 2, 256, 8, 2, True, Recompute.SELECTIVE, ffn=512, query_groups=4, activation=Activation.SWIGLU,
        flash=True, hidden_dropout=False, attention_dropout=False, recompute_modules=cfg.recompute_modules,
    )  # fmt: skip
    assert layer_ops(cfg).saved_bytes == pytest.approx(closed, rel=1e-12)


def test_mlp_reruns_the_mlp_forward_in_the_backward():
    """The re-run ops are the MLP's forward ops (norm 2, SP gather, fc1, activation, fc2,
    reduce-scatter), keeping nothing; the backward itself is unchanged."""
    cfg = _dense({RM.CORE_ATTN, RM.MLP})
    ops, base = layer_ops(cfg), layer_ops(_dense())
    mlp = ops.recompute[: len(ops.recompute) - len(base.recompute)]
    assert all(op.pass_ is Pass.FORWARD and op.saved_bytes == 0 for op in ops.recompute)
    assert ops.recompute[len(mlp) :] == base.recompute
    assert [op.name for op in mlp] == [
        "ln2", "mlp.allgather", "mlp.fc1", "mlp.swiglu", "mlp.fc2", "mlp.reducescatter"
    ]  # fmt: skip
    assert ops.backward == base.backward
    h, f, tokens = 256, 512, 256
    gemm_flops = sum(op.flops for op in mlp if op.kind is OpKind.GEMM)
    assert gemm_flops == 2 * tokens * h * (2 * f + f) / 2  # fc1 (2f wide) and fc2, split by t = 2


def test_layernorm_is_a_no_op_on_the_dense_te_layer():
    """Megatron-core's TE spec fuses both norms into the LayerNormLinears (IdentityOp
    norms), so layernorm checkpoints nothing in a dense layer."""
    assert layer_ops(_dense({RM.CORE_ATTN, RM.LAYERNORM})) == layer_ops(_dense())


def test_hardware_flops_count_what_the_modules_rerun():
    """HFU: [core_attn] is today's count bit for bit; mlp adds 2Bs·glu·h·f per layer;
    without core_attn the core's 4Bs²·q is not counted."""
    cfg = _dense()
    widths = layer_widths(cfg)
    B, s, L, v = 64, 128, 4, 1000
    today = hardware_flops(B, s, L, v, widths, Recompute.SELECTIVE)
    assert hardware_flops(B, s, L, v, widths, Recompute.SELECTIVE, frozenset({RM.CORE_ATTN})) == today
    mlp = 2 * B * s * 3 * 256 * 512
    both = hardware_flops(B, s, L, v, widths, Recompute.SELECTIVE, frozenset({RM.CORE_ATTN, RM.MLP}))
    assert both == pytest.approx(today + L * mlp, rel=1e-12)
    only_mlp = hardware_flops(B, s, L, v, widths, Recompute.SELECTIVE, frozenset({RM.MLP}))
    assert only_mlp == pytest.approx(model_flops(B, s, L, v, widths) + L * mlp, rel=1e-12)


# ---- MoE layers -------------------------------------------------------------------------


def _moe(modules, **training):
    import yaml

    data = yaml.safe_load(QWEN.read_text())
    data["training"].update(recompute="selective", **training)
    if modules is not None:
        data["training"]["recompute_modules"] = [m.value for m in modules]
    data["model"]["moe"]["shared_expert_ffn_hidden_size"] = 512  # Qwen3 has none: exercise them
    workload = build_workload(parse_scenario(data, "s.yaml"))
    kind = workload.layer_kind
    assert kind is not None and kind.moe is not None
    return workload, kind


def _moe_formula(kind, modules):
    cfg, spec = kind.config, kind.moe
    rows = layer_rows(cfg, spec)
    e = cfg.element_bytes
    return moe_saved_bytes(
        rows, cfg.hidden_size, spec.moe, spec.layout, gated=True, element_bytes=e, probs_bytes=e,
        recompute=tuple(modules),
    ).total  # fmt: skip


@pytest.mark.parametrize(
    "modules",
    [
        (RM.MOE_ACT,),
        (RM.SHARED_EXPERTS,),
        (RM.MOE,),
        (RM.MOE_ACT, RM.SHARED_EXPERTS),
        (RM.MOE, RM.MOE_ACT, RM.SHARED_EXPERTS),
    ],
    ids=lambda m: "+".join(x.value for x in m),
)
def test_moe_modules_free_what_moe_saved_bytes_says(modules):
    """The MoE layer's saved bytes drop by exactly `moe_memory.moe_saved_bytes`'s drop for the
    same modules (the block input stays: the checkpoints keep it)."""
    _, base = _moe([RM.CORE_ATTN])
    _, kind = _moe([RM.CORE_ATTN, *modules])
    freed = kind_ops(base).saved_bytes - kind_ops(kind).saved_bytes
    expected = _moe_formula(base, ()) - _moe_formula(kind, modules)
    assert freed == pytest.approx(expected, rel=1e-12) and freed > 0


def test_moe_act_and_shared_experts_by_hand():
    """moe_act frees fc2's input Re·e·f (the busiest rank's rows); shared_experts the shared
    fc1 output and fc2 input T·e·(2f_s + f_s)."""
    _, base = _moe([RM.CORE_ATTN])
    cfg, spec = base.config, base.moe
    rows, e = layer_rows(cfg, spec), cfg.element_bytes
    _, act = _moe([RM.CORE_ATTN, RM.MOE_ACT])
    f = spec.moe.ffn_hidden_size
    assert kind_ops(base).saved_bytes - kind_ops(act).saved_bytes == pytest.approx(
        rows.busiest_expert * e * f
    )
    _, shared = _moe([RM.CORE_ATTN, RM.SHARED_EXPERTS])
    fs = shared_expert_shape(cfg.hidden_size, spec.moe, True)
    assert fs.fc1_width == 2 * 512
    expected = rows.tokens * e * (fs.fc1_width + fs.ffn_hidden_size)
    assert kind_ops(base).saved_bytes - kind_ops(shared).saved_bytes == pytest.approx(expected)


def test_layernorm_frees_the_moe_block_input():
    """In a MoE layer the pre-MLP norm is a TENorm of its own: layernorm frees its output,
    e·T·h with T the rank's s·b/(cp·tp) tokens, and re-runs the norm."""
    _, base = _moe([RM.CORE_ATTN])
    _, norm = _moe([RM.CORE_ATTN, RM.LAYERNORM])
    cfg = base.config
    expected = cfg.element_bytes * cfg.region_tokens * cfg.hidden_size
    assert kind_ops(base).saved_bytes - kind_ops(norm).saved_bytes == pytest.approx(expected)
    (rerun,) = [op for op in kind_ops(norm).recompute if op.module is Module.LAYERNORM]
    assert rerun.saved_bytes == 0 and rerun.pass_ is Pass.FORWARD
    # moe + layernorm: nothing of the block is left but the norm's own input
    _, both = _moe([RM.MOE, RM.LAYERNORM])
    _, moe_only = _moe([RM.MOE])
    assert kind_ops(moe_only).saved_bytes - kind_ops(both).saved_bytes == pytest.approx(expected)


def test_mlp_is_ignored_in_moe_layers_but_applies_to_the_dense_first_layers():
    """Megatron sets recompute_mlp only when the layer is not a MoE layer."""
    _, base = _moe([RM.CORE_ATTN])
    _, mlp = _moe([RM.CORE_ATTN, RM.MLP])
    assert kind_ops(mlp) == kind_ops(base)
    dense_kind = replace(mlp, moe=None)  # a dense first layer of the same model
    assert any(op.module is Module.FC1 for op in kind_ops(dense_kind).recompute)


def test_moe_reruns_the_whole_block_and_nested_checkpoints_again():
    """moe re-runs every forward op of the block, dispatch all-to-alls included; with
    moe_act inside it the activation re-runs once more (Megatron's nested checkpoints)."""
    _, base = _moe([RM.CORE_ATTN])
    _, moe = _moe([RM.CORE_ATTN, RM.MOE])
    _, nested = _moe([RM.CORE_ATTN, RM.MOE, RM.MOE_ACT])
    block = kind_ops(moe).recompute[: -len(kind_ops(base).recompute)]
    assert any(op.collective is not None and "dispatch" in op.name for op in block)
    assert {op.module for op in block} >= {Module.ROUTER, Module.EXPERT_FC1, Module.EXPERT_FC2}
    assert all(op.pass_ is Pass.FORWARD and op.saved_bytes == 0 for op in block)
    swiglu = [op for op in kind_ops(nested).recompute if op.name == "moe.experts.swiglu"]
    assert len(swiglu) == 2
    assert kind_ops(moe).backward == kind_ops(base).backward


def test_moe_hardware_flops_count_the_rerun_experts():
    """HFU with moe adds the block's active GEMMs (no router) per MoE layer; moe_act nothing."""
    workload, kind = _moe([RM.CORE_ATTN])
    scenario = workload.scenario
    m, tr = scenario.model, scenario.training
    widths = layer_widths(kind.config)
    from simcluster.workload.moe_config import MoEConfig

    moe = MoEConfig(**m.moe.model_dump())
    args = (tr.global_batch_size, m.seq_length, m.num_layers, m.vocab_size, widths, moe, Recompute.SELECTIVE)
    model, today = moe_model_flops(*args)
    assert moe_model_flops(*args, frozenset({RM.CORE_ATTN, RM.MOE_ACT})) == (model, pytest.approx(today))
    _, with_moe = moe_model_flops(*args, frozenset({RM.CORE_ATTN, RM.MOE}))
    tokens, h = tr.global_batch_size * m.seq_length, m.hidden_size
    per_token = 2 * h * 3 * moe.ffn_hidden_size * moe.router_topk + 2 * h * 3 * 512
    assert with_moe - today == pytest.approx(m.num_layers * tokens * per_token, rel=1e-12)
