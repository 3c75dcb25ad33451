"""The four kernels of the Megatron-core / TE attention and MoE block that the op graph once
walked but did not price (docs/moe.md, "Kernels walked, now priced"): the query copy
(`layer._query_copy`), TE's layout copy of V (`layer._value_copy`), the QKV split's
backward concat (`layer._qkv_grad_concat`) and the MoE block input's gradient add
(`moe_layer._input_grad_adds`): where each runs, its bytes, and that none keeps anything."""

from dataclasses import replace

import pytest

from simcluster.config.choices import AttentionBackend, Normalization, PositionEmbedding, Recompute
from simcluster.config.scenario import load_scenario
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.model import build_workload
from simcluster.workload.ops import Module, Pass
from tests.paths import ROOT

NEW = (Module.QUERY_COPY, Module.VALUE_COPY, Module.QKV_GRAD_CONCAT, Module.MOE_INPUT_GRAD_ADD)

# Qwen3-30B-A3B's attention as docs/moe.md's walk sizes it: s = 4096, b = 1, h = 2048,
# 32 query heads and 4 KV groups of d = 128, TP 1, RoPE, QK-norm, flash
QWEN = LayerConfig(
    hidden_size=2048, num_attention_heads=32, num_query_groups=4, kv_channels=128, seq_length=4096,
    micro_batch_size=1, tp=1, normalization=Normalization.RMSNORM, position_embedding=PositionEmbedding.ROPE,
    attention_backend="flash", activation="swiglu", hidden_dropout=0.0, attention_dropout=0.0,
    qk_layernorm=True,
)  # fmt: skip
E, S = 2, 4096


def _by_module(ops, module):
    return [op for op in ops if op.module is module]


def _names(cfg):
    ops = layer_ops(cfg)
    return {op.name for op in ops.forward + ops.backward}


def test_qwen3_30b_bytes_are_the_walks():
    """docs/moe.md's table: 2·e·s·a·d = 67.1 MB, 2·e·s·g·d = 8.4 MB, 2·e·s·(a + 2g)·d = 83.9 MB."""
    ops = {op.name: op for op in layer_ops(QWEN).forward + layer_ops(QWEN).backward}
    assert ops["attn.query_copy"].bytes_moved == 2 * E * S * 32 * 128 == 67_108_864
    assert ops["attn.value_copy"].bytes_moved == 2 * E * S * 4 * 128 == 8_388_608
    assert ops["attn.qkv_grad_concat.bwd"].bytes_moved == 2 * E * S * (32 + 8) * 128 == 83_886_080
    assert ops["attn.query_copy"].pass_ is Pass.FORWARD and ops["attn.value_copy"].pass_ is Pass.FORWARD
    assert ops["attn.qkv_grad_concat.bwd"].pass_ is Pass.INPUT_GRAD


def test_order_split_copies_then_norms_rope_core_and_concat_before_the_qkv_backward():
    forward = [op.name for op in layer_ops(QWEN).forward]
    assert forward.index("attn.qkv") + 1 == forward.index("attn.query_copy")
    assert forward.index("attn.rope") + 1 == forward.index("attn.value_copy")
    assert forward.index("attn.value_copy") + 1 == forward.index("attn.flash")
    backward = layer_ops(QWEN).backward
    at = [op.name for op in backward].index("attn.qkv_grad_concat.bwd")
    assert backward[at - 1].module is Module.QK_NORM and backward[at + 1].module is Module.QKV


@pytest.mark.parametrize(
    ("changes", "copied"),
    [
        ({}, True),  # 4 groups of 8 heads on the rank: the reshape copies
        ({"tp": 4}, True),  # one group a rank, but QK-norm's .contiguous() copies the view
        ({"tp": 4, "qk_layernorm": False}, False),  # one group a rank: a view, RoPE writes the new Q
        ({"qk_layernorm": False}, True),  # several groups of several heads: the reshape copies
        ({"num_query_groups": 32, "qk_layernorm": False}, False),  # MHA: groups of one head, a view
    ],
)
def test_query_copy_runs_where_the_reshape_or_the_norm_copies(changes, copied):
    cfg = replace(QWEN, **changes)
    queries = _by_module(layer_ops(cfg).forward, Module.QUERY_COPY)
    assert len(queries) == int(copied)
    if copied:
        assert queries[0].bytes_moved == 2 * E * S * 32 * 128 / cfg.tp


def test_value_copy_follows_tes_layout_check():
    """RoPE or QK-norm: V alone (e·s·b·k/t each way); MHA without either: sbh3d, nothing;
    GQA without either: K and V, and Q where it is still a view (one group a rank)."""
    d = 128
    rope = _by_module(layer_ops(replace(QWEN, tp=2, qk_layernorm=False)).forward, Module.VALUE_COPY)
    assert [op.bytes_moved for op in rope] == [2 * E * S * 4 * d / 2]
    learned = replace(QWEN, position_embedding=PositionEmbedding.LEARNED, qk_layernorm=False)
    assert not _by_module(layer_ops(replace(learned, num_query_groups=32)).forward, Module.VALUE_COPY)
    kv = _by_module(layer_ops(learned).forward, Module.VALUE_COPY)  # Q already copied by the reshape
    assert [op.bytes_moved for op in kv] == [2 * E * S * 2 * 4 * d]
    one_group = replace(learned, tp=4)  # Q a view: TE copies all three
    qkv = _by_module(layer_ops(one_group).forward, Module.VALUE_COPY)
    assert [op.bytes_moved for op in qkv] == [2 * E * S * (32 + 2 * 4) * d / 4]
    assert not _by_module(layer_ops(one_group).forward, Module.QUERY_COPY)
    # the unfused core sits behind the same DotProductAttention: the same copy
    unfused = replace(QWEN, attention_backend=AttentionBackend.UNFUSED)
    copies = _by_module(layer_ops(unfused).forward, Module.VALUE_COPY)
    assert [op.name for op in copies] == ["attn.value_copy"]


def test_concat_is_skipped_only_where_te_writes_one_dqkv():
    """Flash, MHA, no RoPE, no QK-norm: TE's fused backward writes dQ, dK, dV into one sbh3d
    buffer and `SplitAlongDim.backward` returns it; every other flash layout concatenates.
    The unfused core's cat is inside the context copy's measured backward site: not added."""
    mha = replace(QWEN, num_query_groups=32, position_embedding=PositionEmbedding.LEARNED, qk_layernorm=False)
    assert "attn.qkv_grad_concat.bwd" not in _names(mha)
    assert "attn.qkv_grad_concat.bwd" not in _names(replace(QWEN, attention_backend=AttentionBackend.UNFUSED))
    assert "attn.qkv_grad_concat.bwd" in _names(replace(mha, position_embedding=PositionEmbedding.ROPE))
    assert "attn.qkv_grad_concat.bwd" in _names(replace(mha, qk_layernorm=True))
    assert "attn.qkv_grad_concat.bwd" in _names(replace(mha, num_query_groups=8))


def test_none_keeps_anything_so_saved_bytes_are_unchanged():
    """The copies are what the norms, RoPE and the core save (counted there); the concat and
    the add are backward. So every op of the four keeps 0 bytes, in every recompute mode."""
    for recompute in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL):
        ops = layer_ops(replace(QWEN, recompute=recompute))
        new = [op for op in ops.forward + ops.backward + ops.recompute if op.module in NEW]
        assert new and all(op.saved_bytes == 0 for op in new)


def test_recompute_reruns_the_forward_copies():
    """Full recompute re-runs the layer's forward, both copies included; selective `core_attn`
    re-runs the core, which holds TE's layout copy but not Megatron's query reshape."""
    full = [op.name for op in layer_ops(replace(QWEN, recompute=Recompute.FULL)).recompute]
    assert {"attn.query_copy", "attn.value_copy"} <= set(full)
    selective = [op.name for op in layer_ops(replace(QWEN, recompute=Recompute.SELECTIVE)).recompute]
    assert selective == ["attn.value_copy", "attn.flash"]


def _segments(path):
    workload = build_workload(load_scenario(ROOT / path))
    return [segment for stage in workload.stages for chunk in stage.chunks for segment in chunk.segments]


def test_moe_add_once_without_shared_experts_and_twice_with_them():
    """moe_layer.py:558-561: router and dispatcher (and the shared experts) read the pre-MLP
    norm's output; each extra consumer is one add of two [T, h] gradients, 3·e·T·h."""
    qwen = [s for s in _segments("scenarios/moe/qwen3-30b-a3b-h100.yaml") if s.kind.moe is not None]
    backward = qwen[0].layer.backward
    adds = _by_module(backward, Module.MOE_INPUT_GRAD_ADD)
    cfg, layout = qwen[0].kind.config, qwen[0].kind.moe.layout
    tokens = cfg.seq_length * cfg.micro_batch_size / cfg.tp  # the rank's router rows
    assert layout.cp == 1 and [op.bytes_moved for op in adds] == [3 * E * tokens * cfg.hidden_size]
    names = [op.name for op in backward]
    assert names.index("moe.router.dgrad") + 1 == names.index("moe.input_grad_add")
    assert backward[names.index("moe.input_grad_add") + 2].module is Module.LAYERNORM  # after router.wgrad
    deepseek = [s for s in _segments("scenarios/moe/deepseek-v3-h100.yaml") if s.kind.moe is not None]
    names = [op.name for op in deepseek[0].layer.backward if op.module is Module.MOE_INPUT_GRAD_ADD]
    assert names == ["moe.input_grad_add", "moe.shared.input_grad_add"]


def test_dense_layers_have_no_moe_add_and_mla_none_of_the_attention_copies():
    """DeepSeek-V3's first dense layers carry no MoE add; its MLA attention replaces the
    standard attention block, copies and concat included."""
    segments = _segments("scenarios/moe/deepseek-v3-h100.yaml")
    dense = [s for s in segments if s.kind.moe is None]
    assert dense and not any(_by_module(s.layer.backward, Module.MOE_INPUT_GRAD_ADD) for s in dense)
    for segment in segments:
        assert segment.kind.mla is not None
        ops = segment.layer.forward + segment.layer.backward + segment.layer.recompute
        assert not [op for op in ops if op.module in NEW[:3]]
