"""The quantized experts' row padding (`workload.moe_fp8_padding`): Transformer Engine's
Fp8Padding / Fp8Unpadding around the grouped expert GEMMs wherever the dispatcher leaves the
rows unaligned (alltoall, allgather, DeepEP), never with Hybrid-EP (it pads in its dispatch)
or BF16, and with capacity padding only when the capacity is not a multiple of the alignment."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from simcluster.config.choices import Dtype, Fp8Recipe
from simcluster.config.moe_choices import FlexBackend, TokenDispatcher
from simcluster.config.scenario import parse_scenario
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.model import build_workload
from simcluster.workload.moe_fp8_padding import align_rows, experts_padded
from simcluster.workload.ops import Module, Pass
from tests.paths import ROOT

QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"
BASE = LayerConfig(hidden_size=64, num_attention_heads=4, seq_length=16, micro_batch_size=1)


def _scenario(dtype="fp8", dispatcher="alltoall", backend=None, recipe="delayed"):
    data = yaml.safe_load(QWEN.read_text())
    data["parallel"].update(ep=8, dp=8)
    training = {"dtype": dtype, "moe_token_dispatcher": dispatcher}
    if dtype == "fp8":
        training["fp8_recipe"] = recipe
    if backend:
        training["moe_flex_dispatcher_backend"] = backend
    data["training"].update(training)
    return parse_scenario(data, "s.yaml")


def _layer(scenario):
    workload = build_workload(scenario)
    return next(s for s in workload.stages[0].chunks[0].segments if s.kind.moe).layer


def _pads(ops):
    return [op for op in ops if op.module is Module.EXPERT_FP8_PADDING]


def test_fp8_alltoall_experts_pad_before_fc1_and_unpad_after_fc2():
    """Forward: hidden and probs padded just before fc1, the output unpadded just after fc2;
    backward the mirror. Each moves its rows once each way; nothing is saved."""
    layer = _layer(_scenario())
    forward = layer.forward
    names = [op.name for op in forward]
    fc1 = names.index("moe.experts.fc1")
    fc2 = names.index("moe.experts.fc2")
    assert names[fc1 - 2 : fc1] == ["moe.experts.fp8_pad", "moe.experts.fp8_pad_probs"]
    assert names[fc2 + 1] == "moe.experts.fp8_unpad"
    rows = next(op for op in forward if op.name == "moe.experts.fc1").gemm
    busiest = rows.m * rows.batch  # dropless, balanced: every local expert's rows
    h = 2048
    pad = forward[fc1 - 2]
    assert pad.bytes_moved == pytest.approx(2 * 2 * busiest * h)
    assert forward[fc1 - 1].bytes_moved == pytest.approx(2 * 2 * busiest)
    assert all(op.saved_bytes == 0 for op in _pads(forward))
    backward = _pads(layer.backward)
    assert [op.name for op in backward] == [
        "moe.experts.fp8_unpad.bwd",
        "moe.experts.fp8_pad.bwd",
        "moe.experts.fp8_pad_probs.bwd",
    ]
    assert all(op.pass_ is Pass.INPUT_GRAD for op in backward)
    back_names = [op.name for op in layer.backward]
    assert back_names.index("moe.experts.fp8_unpad.bwd") < back_names.index("moe.experts.fc2.dgrad")
    assert back_names.index("moe.experts.fp8_pad.bwd") > back_names.index("moe.experts.fc1.wgrad")


def test_no_padding_in_bf16_or_with_hybridep():
    assert not _pads(_layer(_scenario(dtype="bf16")).forward)
    hybridep = _layer(_scenario(dispatcher="flex", backend="hybridep", recipe="mxfp8"))
    assert not _pads(hybridep.forward + hybridep.backward)
    deepep = _layer(_scenario(dispatcher="flex", backend="deepep"))
    assert len(_pads(deepep.forward)) == 3


def test_capacity_padding_pads_only_a_misaligned_capacity():
    """Padded to capacity (`MoEConfig.pad_to_capacity`), every local expert holds exactly its
    capacity's rows: padded only when they are not a multiple of the recipe's alignment."""
    fp8 = replace(BASE, dtype=Dtype.FP8, fp8_recipe=Fp8Recipe.TENSORWISE)
    mx = replace(fp8, fp8_recipe=Fp8Recipe.MXFP8)
    a2a, deepep = TokenDispatcher.ALLTOALL, FlexBackend.DEEPEP
    assert not experts_padded(fp8, a2a, deepep, rows_per_expert=2048)
    assert experts_padded(fp8, a2a, deepep, rows_per_expert=2072)
    assert not experts_padded(fp8, a2a, deepep, rows_per_expert=2064)
    assert experts_padded(mx, a2a, deepep, rows_per_expert=2064)  # 16 | 2064, 32 does not
    assert experts_padded(fp8, a2a, deepep, rows_per_expert=None)  # dropless: counts as routed
    assert not experts_padded(BASE, a2a, deepep, rows_per_expert=None)  # bf16


def test_the_alignment_is_transformer_engines_per_recipe():
    assert align_rows(replace(BASE, dtype=Dtype.FP8, fp8_recipe=Fp8Recipe.TENSORWISE)) == 16
    assert align_rows(replace(BASE, dtype=Dtype.FP8, fp8_recipe=Fp8Recipe.MXFP8)) == 32
    assert align_rows(replace(BASE, dtype=Dtype.FP4)) == 128
