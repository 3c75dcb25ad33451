"""gpt-oss's routed-expert extras in the MoE op graph (`workload.gptoss_experts`): the GLU's
eager clamp and the fc2 bias's per-expert loop, counted from the code they stand for
(fused_bias_geglu.py `weighted_bias_quick_geglu_impl`, experts.py `TEGroupedMLP._apply_bias`)."""

from __future__ import annotations

import pytest
import yaml

from simcluster.config.errors import ConfigError
from simcluster.config.scenario import parse_scenario
from simcluster.workload.gptoss_experts import glu_clamp_backward_bytes
from simcluster.workload.layer import layer_ops
from simcluster.workload.model import build_workload
from simcluster.workload.moe_layer import layer_rows, moe_layer_ops, moe_mlp_ops
from simcluster.workload.moe_memory import expert_static_memory
from simcluster.workload.ops import Module, Pass
from tests.paths import ROOT

GPT_OSS = ROOT / "scenarios" / "moe" / "gpt-oss-120b-h100.yaml"
EXTRAS = ("router_bias", "expert_bias", "activation_func_clamp_value")


def _scenario(*, moe=None, training=None):
    data = yaml.safe_load(GPT_OSS.read_text())
    for key in EXTRAS:
        data["model"]["moe"].pop(key, None)
    data["model"]["moe"].update(moe or {})
    data["training"].update(training or {})
    return parse_scenario(data, "s.yaml")


def _kind(**changes):
    kind = build_workload(_scenario(**changes)).layer_kind
    assert kind is not None and kind.moe is not None
    return kind.config, kind.moe


def _of(ops, module):
    return [op for op in ops if op.module is module]


CLAMP = {"activation_func_clamp_value": 7.0}
BIAS = {"expert_bias": True}


def test_without_the_keys_the_graph_has_neither_op():
    """Defaults: no clamp, no fc2 bias ops (every earlier scenario keeps its graph)."""
    forward, backward = moe_mlp_ops(*_kind())
    assert not _of(forward + backward, Module.GLU_CLAMP)
    assert not _of(forward + backward, Module.EXPERT_BIAS)


def test_clamp_is_three_kernels_forward_seven_backward_between_fc1_and_the_glu():
    """Two clamps and a cat after fc1, before the fused GLU; backward: the gate's compare +
    where, the linear half's two compares + and + where, chunk's cat (7), after the GLU's."""
    forward, backward = moe_mlp_ops(*_kind(moe=CLAMP))
    modules = [op.module for op in forward]
    first = modules.index(Module.GLU_CLAMP)
    assert modules[first - 1] is Module.EXPERT_FC1
    assert modules[first : first + 4] == [Module.GLU_CLAMP] * 3 + [Module.SWIGLU]
    back = [op.module for op in backward]
    start = back.index(Module.GLU_CLAMP)
    assert back[start - 1] is Module.SWIGLU and back[start : start + 8] == [Module.GLU_CLAMP] * 7 + [
        Module.EXPERT_FC1
    ]
    assert all(op.pass_ is Pass.INPUT_GRAD for op in _of(backward, Module.GLU_CLAMP))


def test_clamp_bytes_by_hand():
    """Forward: two clamps over [re, f] (read + write each) and the cat over [re, 2f]:
    8·e·re·f; backward (11·e + 8)·re·f (e-byte grads and inputs, 1-byte masks)."""
    cfg, spec = _kind(moe=CLAMP)
    e, re, f = cfg.element_bytes, layer_rows(cfg, spec).busiest_expert, spec.moe.ffn_hidden_size
    forward, backward = moe_mlp_ops(cfg, spec)
    assert sum(op.bytes_moved for op in _of(forward, Module.GLU_CLAMP)) == pytest.approx(8 * e * re * f)
    expected = (e + 1) + (1 + 2 * e) + 2 * (e + 1) + 3 + (1 + 2 * e) + 4 * e
    assert sum(op.bytes_moved for op in _of(backward, Module.GLU_CLAMP)) == pytest.approx(expected * re * f)
    assert glu_clamp_backward_bytes(e, re, f) == pytest.approx(expected * re * f)


def test_clamp_saves_its_cat_unless_moe_act_recomputes_it():
    """The fused GLU saves the cat's output [re, 2f] (its input); under moe_act's checkpoint
    it is not saved and the three clamp kernels re-run before the GLU in the backward."""
    cfg, spec = _kind(moe=CLAMP)
    e, re = cfg.element_bytes, layer_rows(cfg, spec).busiest_expert
    plain_cfg, plain_spec = _kind()
    saved = sum(op.saved_bytes for op in moe_mlp_ops(cfg, spec)[0])
    plain = sum(op.saved_bytes for op in moe_mlp_ops(plain_cfg, plain_spec)[0])
    assert saved - plain == pytest.approx(e * re * 2 * spec.moe.ffn_hidden_size)

    act = {"recompute": "selective", "recompute_modules": ["moe_act"]}
    cfg, spec = _kind(moe=CLAMP, training=act)
    plain_cfg, plain_spec = _kind(training=act)
    ops = moe_layer_ops(layer_ops(cfg), cfg, spec)
    plain_ops = moe_layer_ops(layer_ops(plain_cfg), plain_cfg, plain_spec)
    assert sum(op.saved_bytes for op in ops.forward) == sum(op.saved_bytes for op in plain_ops.forward)
    rerun = [op.module for op in ops.recompute if op.module in (Module.GLU_CLAMP, Module.SWIGLU)]
    assert rerun == [Module.GLU_CLAMP] * 3 + [Module.SWIGLU]


def test_fc2_bias_is_a_python_loop_over_the_local_experts():
    """Forward: a mul and an add per local expert, then one cat (2·local + 1 kernels) after
    fc2; backward: the mul's two gradients (mul + reduction each) per expert, then split's
    two cats (4·local + 2), before fc2's dgrad."""
    cfg, spec = _kind(moe=BIAS)
    local = spec.moe.num_experts // spec.layout.ep
    forward, backward = moe_mlp_ops(cfg, spec)
    fwd, bwd = _of(forward, Module.EXPERT_BIAS), _of(backward, Module.EXPERT_BIAS)
    assert len(fwd) == 2 * local + 1 and len(bwd) == 4 * local + 2
    modules = [op.module for op in forward]
    assert modules[modules.index(Module.EXPERT_BIAS) - 1] is Module.EXPERT_FC2
    back = [op.module for op in backward]
    last = len(back) - 1 - back[::-1].index(Module.EXPERT_BIAS)
    assert back[last + 1] is Module.EXPERT_FC2


def test_fc2_bias_bytes_by_hand():
    """Forward Σ over experts of r·h·e (b·p written, reading b and p) + 3·e·r·h (the add),
    then the cat 2·e·re·h; backward per expert 2·(2·e·r·h + e·r) + e·r·h + e·h + e·r·h + e·r,
    then the cats 2·e·re·h + 2·e·re."""
    cfg, spec = _kind(moe=BIAS)
    e, h, re = cfg.element_bytes, cfg.hidden_size, layer_rows(cfg, spec).busiest_expert
    local = spec.moe.num_experts // spec.layout.ep
    r = re / local
    forward, backward = moe_mlp_ops(cfg, spec)
    fwd = local * (e * (r * h + h + r) + 3 * e * r * h) + 2 * e * re * h
    assert sum(op.bytes_moved for op in _of(forward, Module.EXPERT_BIAS)) == pytest.approx(fwd)
    bwd = local * (2 * (2 * e * r * h + e * r) + (e * r * h + e * h) + (e * r * h + e * r))
    bwd += 2 * e * re * h + 2 * e * re
    assert sum(op.bytes_moved for op in _of(backward, Module.EXPERT_BIAS)) == pytest.approx(bwd)
    assert sum(op.saved_bytes for op in _of(forward, Module.EXPERT_BIAS)) == 0


def test_expert_bias_adds_fc1_and_fc2_biases_to_each_local_expert():
    """TEGroupedMLP's biases: fc1's 2f/etp and fc2's h per local expert."""
    _, spec = _kind(moe=BIAS)
    moe, layout = spec.moe, spec.layout
    with_bias = expert_static_memory(2880, moe, layout, True, True, True, 4)
    without = expert_static_memory(2880, moe, layout, True, True, False, 4)
    local = moe.num_experts // layout.ep
    extra = local * (2 * moe.ffn_hidden_size / layout.expert_tp + 2880)
    assert with_bias.expert_params_per_rank - without.expert_params_per_rank == extra


def test_a_clamp_of_zero_is_refused():
    with pytest.raises(ConfigError, match="activation_func_clamp_value"):
        _scenario(moe={"activation_func_clamp_value": 0})


def test_megatron_flags_carry_the_biases_and_the_clamp():
    """Export writes --activation-func-clamp-value and no --disable-bias-linear for gpt-oss
    (Megatron's add_bias_linear default); --disable-bias-linear on a MoE line drops both
    biases and the dense linears' (`model.add_bias_linear` false); on a dense line it is read
    as `add_bias_linear` false too, not listed as not modelled."""
    from simcluster.config.megatron_export import to_megatron_args
    from simcluster.config.megatron_import import parse_megatron_args

    scenario = _scenario(moe={**CLAMP, **BIAS, "router_bias": True})
    line = to_megatron_args(scenario, 8)
    assert "--activation-func-clamp-value 7.0" in line and "--disable-bias-linear" not in line
    back = parse_megatron_args(line, scenario.hardware, scenario.name).requested["model"]["moe"]
    assert (back["router_bias"], back["expert_bias"], back["activation_func_clamp_value"]) == (
        True,
        True,
        7.0,
    )
    plain = to_megatron_args(_scenario(), 8)
    assert "--disable-bias-linear" in plain
    back = parse_megatron_args(plain, scenario.hardware, scenario.name).requested["model"]
    assert "router_bias" not in back["moe"] and "expert_bias" not in back["moe"]
    assert back["add_bias_linear"] is False
    with pytest.raises(ConfigError, match="router_bias"):
        to_megatron_args(_scenario(moe=BIAS), 8)
    dense = "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 1 "
    imported = parse_megatron_args(
        dense + "--disable-bias-linear --activation-func-clamp-value 7", "h100-sxm5-80gb"
    )
    assert not any("--disable-bias-linear" in flag for flag in imported.not_modelled)
    assert imported.requested["model"]["add_bias_linear"] is False
    assert any("--activation-func-clamp-value" in flag for flag in imported.not_modelled)
