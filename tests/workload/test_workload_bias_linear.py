"""`model.add_bias_linear` (Megatron-core TransformerConfig.add_bias_linear; `--disable-bias-linear`
sets it false): without linear biases the bias-dropout-adds reduce no bias gradient, GeLU runs
unfused with no bias gradient, and the parameter count loses exactly the QKV, proj, fc1 and fc2
biases. Default true: every existing result is unchanged."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from simcluster.config import ConfigError
from simcluster.config.scenario import load_scenario, parse_scenario
from simcluster.costs.compute import elementwise_kind
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.model import build_workload, layer_config
from simcluster.workload.ops import Module
from tests.paths import ROOT

LLAMA3_8B = ROOT / "scenarios" / "modern" / "llama3-8b-h100.yaml"
MIXTRAL = ROOT / "scenarios" / "moe" / "mixtral-8x7b-h100.yaml"

# a GPT layer on one rank of tp 2 with SP, dropout 0.1: s·b = 1024 tokens, h 1024, f 4096
GPT = LayerConfig(
    hidden_size=1024, num_attention_heads=16, seq_length=512, micro_batch_size=2, tp=2,
    sequence_parallel=True,
)  # fmt: skip
E, TOKENS = 2, 1024
REGION = TOKENS / 2 * 1024  # elements of [s/t, b, h] (SP region)
F_SLICE = TOKENS * 4096 / 2  # elements of [s, b, f/t]


def _by_name(ops):
    return {op.name: op for op in ops}


def _mapping(path, **model):
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["model"].update(model)
    return data


def test_the_default_is_true_and_an_explicit_true_changes_nothing():
    """The layer config's and the scenario's default is Megatron's (biases on); writing the
    key true gives the same scenario, layer and workload as leaving it out."""
    assert LayerConfig(
        hidden_size=64, num_attention_heads=4, seq_length=8, micro_batch_size=1
    ).add_bias_linear
    plain = load_scenario(LLAMA3_8B)
    explicit = parse_scenario(_mapping(LLAMA3_8B, add_bias_linear=True), LLAMA3_8B)
    assert plain.model.add_bias_linear and explicit == plain
    assert build_workload(explicit) == build_workload(plain)


def test_dropout_backward_loses_the_bias_grad_reduction_and_gelu_its_re_read():
    """Dropout 0.1: each bias-dropout-add backward moves 3e + mask per element with a bias and
    2e + mask without (the dropout's backward alone); the GeLU backward 4e → 3e per element
    (F.gelu's backward, no bias-grad re-read). Nothing else in the layer changes."""
    with_bias, without = layer_ops(GPT), layer_ops(replace(GPT, add_bias_linear=False))
    before, after = _by_name(with_bias.backward), _by_name(without.backward)
    for name in ("attn.proj.bias_dropout_add.bwd", "mlp.fc2.bias_dropout_add.bwd"):
        assert before[name].bytes_moved == (3 * E + 1) * REGION
        assert after[name].bytes_moved == (2 * E + 1) * REGION
        assert elementwise_kind(after[name]) == "bias_dropout_add.bwd"
    assert before["mlp.bias_gelu.bwd"].bytes_moved == 4 * E * F_SLICE
    assert after["mlp.bias_gelu.bwd"].bytes_moved == 3 * E * F_SLICE
    changed = {"attn.proj.bias_dropout_add.bwd", "mlp.fc2.bias_dropout_add.bwd", "mlp.bias_gelu.bwd"}
    assert {n: op for n, op in before.items() if n not in changed} == {
        n: op for n, op in after.items() if n not in changed
    }
    assert without.forward == with_bias.forward and without.recompute == with_bias.recompute


def test_at_dropout_0_the_backward_add_vanishes_and_the_forward_is_the_residual_add():
    """Dropout 0: with a bias the backward is only the bias-grad reduction (e per element) and
    the forward kernel a bias add; without a bias there is no backward kernel at all and the
    forward `residual + x` is the residual add's kernel, with the same bytes (3e)."""
    cfg = replace(GPT, hidden_dropout=0.0, attention_dropout=0.0, activation="swiglu")
    with_bias, without = layer_ops(cfg), layer_ops(replace(cfg, add_bias_linear=False))
    bwd = [op for op in with_bias.backward if op.module is Module.BIAS_DROPOUT_ADD]
    assert [op.bytes_moved for op in bwd] == [E * REGION, E * REGION]
    assert not [op for op in without.backward if op.module is Module.BIAS_DROPOUT_ADD]
    assert len(without.backward) == len(with_bias.backward) - 2
    for name in ("attn.bias_dropout_add", "mlp.bias_dropout_add"):
        biased, plain = _by_name(with_bias.forward)[name], _by_name(without.forward)[name]
        assert elementwise_kind(biased) == "bias_add"
        assert elementwise_kind(plain) == "residual_grad_add"
        assert plain.bytes_moved == biased.bytes_moved == 3 * E * REGION
    # SwiGLU's bytes are the same with bias None (SwiGLUFunction in place of BiasSwiGLUFunction)
    swiglu = [op for op in with_bias.backward if op.module is Module.SWIGLU]
    assert swiglu == [op for op in without.backward if op.module is Module.SWIGLU]


def test_saved_bytes_do_not_depend_on_the_biases():
    """A bias keeps nothing for backward (the adds keep only the dropout mask)."""
    for dropout in (0.0, 0.1):
        cfg = replace(GPT, hidden_dropout=dropout, attention_dropout=dropout)
        assert layer_ops(replace(cfg, add_bias_linear=False)).saved_bytes == layer_ops(cfg).saved_bytes


def _per_layer_biases(model: dict, tp: int, moe: bool) -> float:
    """Bias parameters of one layer on a rank, from the file's dims: column-parallel QKV
    (q + 2k) and fc1 (2f gated) over t, row-parallel proj and fc2 (h each) replicated; a MoE
    layer's MLP is the experts' (their biases are `model.moe.expert_bias`)."""
    h, a = model["hidden_size"], model["num_attention_heads"]
    d = h // a
    q, k = a * d, model.get("num_query_groups", a) * d
    fc1 = 2 * model["ffn_hidden_size"] if model.get("activation") == "swiglu" else model["ffn_hidden_size"]
    if moe:
        return (q + 2 * k) / tp + h
    return (q + 2 * k + fc1) / tp + 2 * h


@pytest.mark.parametrize("tp", [1, 2])
def test_dense_parameters_drop_by_exactly_the_bias_count(tp):
    """Llama 3 8B (GQA, SwiGLU): every stage's parameters, weights and gradient buffer drop by
    (q + 2k + 2f)/t + 2h per layer it holds."""
    data = _mapping(LLAMA3_8B)
    data["parallel"].update(tp=tp, pp=2)
    with_bias = build_workload(parse_scenario(data, LLAMA3_8B))
    data["model"]["add_bias_linear"] = False
    without = build_workload(parse_scenario(data, LLAMA3_8B))
    per_layer = _per_layer_biases(data["model"], tp, moe=False)
    for a, b in zip(with_bias.stages, without.stages, strict=True):
        layers = with_bias.scenario.pipeline_split.stage_layers[a.stage]
        assert a.num_params - b.num_params == pytest.approx(layers * per_layer, rel=1e-12)
        assert a.static.weight_bytes - b.static.weight_bytes == pytest.approx(
            2 * layers * per_layer, rel=1e-9
        )
        assert a.dp_gradient_bytes - b.dp_gradient_bytes == pytest.approx(2 * layers * per_layer, rel=1e-9)


def test_moe_layers_lose_their_attention_biases_and_the_experts_keep_theirs():
    """Mixtral (experts without biases, `expert_bias` false): each MoE layer's dense
    parameters drop by the QKV and proj biases, (q + 2k)/t + h; the routed experts' count is
    unchanged."""
    with_bias = build_workload(load_scenario(MIXTRAL))
    without = build_workload(parse_scenario(_mapping(MIXTRAL, add_bias_linear=False), MIXTRAL))
    data = _mapping(MIXTRAL)
    per_layer = _per_layer_biases(data["model"], data["parallel"]["tp"], moe=True)
    for a, b in zip(with_bias.stages, without.stages, strict=True):
        layers = with_bias.scenario.pipeline_split.stage_layers[a.stage]
        assert a.num_params - b.num_params == pytest.approx(layers * per_layer, rel=1e-12)
        assert a.expert_gradient_bytes == b.expert_gradient_bytes


def test_layer_config_carries_the_key():
    scenario = parse_scenario(_mapping(LLAMA3_8B, add_bias_linear=False), LLAMA3_8B)
    assert layer_config(scenario).add_bias_linear is False


@pytest.mark.parametrize("value", ["no", 0, None])
def test_a_non_boolean_is_a_clear_error(value):
    with pytest.raises(ConfigError, match=r"model\.add_bias_linear.*true or false"):
        parse_scenario(_mapping(LLAMA3_8B, add_bias_linear=value), LLAMA3_8B)
    with pytest.raises(ValueError, match="LayerConfig.add_bias_linear must be True or False"):
        replace(GPT, add_bias_linear=value)


def test_expert_or_router_biases_need_the_linear_biases():
    """Megatron builds the router's and the experts' biases from add_bias_linear: asking for
    them with it false is refused, naming both keys."""
    data = _mapping(MIXTRAL, add_bias_linear=False)
    data["model"]["moe"].update(router_bias=True, expert_bias=True)
    with pytest.raises(ConfigError) as error:
        parse_scenario(data, MIXTRAL)
    text = str(error.value)
    assert "model.moe.router_bias: value true with model.add_bias_linear false" in text
    assert "model.moe.expert_bias: value true with model.add_bias_linear false" in text
