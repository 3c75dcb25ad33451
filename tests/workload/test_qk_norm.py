"""`model.qk_layernorm` (Megatron --qk-layernorm, Qwen3): a norm over each query and key head
between the QKV projection and RoPE (`workload.layer._qk_norm`): the key's contiguous copy and
two norm kernels forward, two norm backwards; each norm keeps its input."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simcluster.config.choices import Normalization, PositionEmbedding, Recompute
from simcluster.config.megatron_args import parse_megatron_args, to_megatron_args
from simcluster.config.scenario import load_scenario, parse_scenario
from simcluster.costs.compute import elementwise_kind
from simcluster.costs.host import kernels_issued
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.model import build_workload, layer_config
from simcluster.workload.ops import Module, Pass
from tests.paths import ROOT

QWEN3_30B_FILE = ROOT / "scenarios" / "moe" / "qwen3-30b-a3b-h100.yaml"
DEEPSEEK_FILE = ROOT / "scenarios" / "moe" / "deepseek-v3-h100.yaml"

# Qwen3-30B-A3B's attention on a rank: h 2048, 32 query heads and 4 groups of 128, tp 2
QWEN = LayerConfig(
    hidden_size=2048, num_attention_heads=32, num_query_groups=4, kv_channels=128, seq_length=512,
    micro_batch_size=2, tp=2, sequence_parallel=True, normalization=Normalization.RMSNORM,
    position_embedding=PositionEmbedding.ROPE, attention_backend="flash", activation="swiglu",
    hidden_dropout=0.0, attention_dropout=0.0, qk_layernorm=True,
)  # fmt: skip
TOKENS, E = 512 * 2, 2
Q, K = E * TOKENS * 32 * 128 / 2, E * TOKENS * 4 * 128 / 2  # bytes of the rank's query / key heads


def _names(ops):
    return [op.name for op in ops]


def test_off_by_default_and_the_qwen3_files_turn_it_on():
    """The default layer has no QK-norm op (so every result without the key stays ==); the
    Qwen3 scenarios set it, as Megatron-Bridge's Qwen3 MoE bridge does (`qk_layernorm = True`)."""
    plain = replace(QWEN, qk_layernorm=False)
    ops = layer_ops(plain)
    assert not [op for op in ops.forward + ops.backward if op.module in (Module.QK_NORM, Module.KEY_COPY)]
    assert layer_config(load_scenario(QWEN3_30B_FILE)).qk_layernorm


def test_norms_sit_between_qkv_and_rope_each_way():
    ops = layer_ops(QWEN)
    forward, backward = _names(ops.forward), _names(ops.backward)
    at = forward.index("attn.qkv")
    expected = ["attn.query_copy", "attn.key_copy", "attn.q.ln", "attn.k.ln", "attn.rope"]
    assert forward[at + 1 : at + 6] == expected
    at = backward.index("attn.rope.bwd")
    assert backward[at + 1 : at + 4] == ["attn.q.ln.bwd", "attn.k.ln.bwd", "attn.qkv_grad_concat.bwd"]
    assert ops.backward[at + 4].module is Module.QKV  # then the QKV backward (SP: its all-gather)


def test_bytes_and_saved_inputs_follow_the_head_widths():
    """Forward: the copy reads and writes the key (2k), each norm reads x and writes y and
    keeps x; backward: x, dy in, dx out (3 per element). The saved bytes grow by q + k."""
    on, off = layer_ops(QWEN), layer_ops(replace(QWEN, qk_layernorm=False))
    ops = {op.name: op for op in on.forward + on.backward}
    assert ops["attn.key_copy"].bytes_moved == 2 * K and ops["attn.key_copy"].saved_bytes == 0
    assert (ops["attn.q.ln"].bytes_moved, ops["attn.q.ln"].saved_bytes) == (2 * Q, Q)
    assert (ops["attn.k.ln"].bytes_moved, ops["attn.k.ln"].saved_bytes) == (2 * K, K)
    assert ops["attn.q.ln.bwd"].bytes_moved == 3 * Q and ops["attn.k.ln.bwd"].bytes_moved == 3 * K
    assert on.saved_bytes - off.saved_bytes == pytest.approx(Q + K, rel=1e-12)


def test_norms_run_the_models_norm_kernel():
    """An RMSNorm model's QK-norm is priced by the "rmsnorm" curve, a LayerNorm model's by
    "layernorm"; the copy by the generic curve."""
    ops = {op.name: op for op in layer_ops(QWEN).forward + layer_ops(QWEN).backward}
    assert elementwise_kind(ops["attn.q.ln"]) == "rmsnorm"
    assert elementwise_kind(ops["attn.k.ln.bwd"]) == "rmsnorm.bwd"
    assert elementwise_kind(ops["attn.key_copy"]) == "key_copy"
    layernorm = {
        op.name: op for op in layer_ops(replace(QWEN, normalization=Normalization.LAYERNORM)).forward
    }
    assert elementwise_kind(layernorm["attn.q.ln"]) == "layernorm"


def test_full_recompute_keeps_nothing_of_them_and_reruns_them():
    ops = layer_ops(replace(QWEN, recompute=Recompute.FULL))
    norms = [op for op in ops.forward if op.module in (Module.QK_NORM, Module.KEY_COPY)]
    assert norms and all(op.saved_bytes == 0 for op in norms)
    rerun = [op.name for op in ops.recompute if op.module in (Module.QK_NORM, Module.KEY_COPY)]
    assert rerun == [op.name for op in norms]


def test_host_issues_three_kernels_forward_and_two_backward():
    on, off = layer_ops(QWEN), layer_ops(replace(QWEN, qk_layernorm=False))
    assert kernels_issued(on.forward, QWEN.dtype) - kernels_issued(off.forward, QWEN.dtype) == 3
    assert kernels_issued(on.backward, QWEN.dtype) - kernels_issued(off.backward, QWEN.dtype) == 2
    assert all(op.pass_ is Pass.INPUT_GRAD for op in on.backward if op.module is Module.QK_NORM)


def test_parameters_add_two_head_wide_norms_per_layer():
    scenario = load_scenario(QWEN3_30B_FILE)
    data = scenario.model_dump(mode="json")
    data["model"]["qk_layernorm"] = False
    without = parse_scenario(data, "s.yaml")
    layers = scenario.model.num_layers // scenario.parallel.pp
    gained = build_workload(scenario).stages[0].num_params - build_workload(without).stages[0].num_params
    assert gained == layers * 2 * 128  # RMSNorm: one weight per element of the head


def test_mla_keeps_its_own_latent_norms():
    """With MLA, Megatron's --qk-layernorm is the latent norms the MLA layer always has: the
    standard attention's head norms are not added."""
    scenario = load_scenario(DEEPSEEK_FILE)
    data = scenario.model_dump(mode="json")
    data["model"]["qk_layernorm"] = True
    assert not layer_config(parse_scenario(data, "s.yaml")).qk_layernorm


def test_megatron_flag_round_trips():
    scenario = load_scenario(QWEN3_30B_FILE)
    line = to_megatron_args(scenario)
    assert line.split().count("--qk-layernorm") == 1
    imported = parse_megatron_args(line, scenario.hardware, scenario.name)
    assert imported.requested["model"]["qk_layernorm"] is True
    assert (
        not parse_megatron_args(line.replace("--qk-layernorm", ""), scenario.hardware)
        .requested["model"]
        .get("qk_layernorm")
    )
