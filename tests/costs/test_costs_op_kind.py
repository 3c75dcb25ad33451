"""Op kinds: every op of a layer falls in exactly one kind, as its name and kind say."""

from __future__ import annotations

import pytest

from simcluster.calibration.shapes import standin_ops
from simcluster.costs.op_kind import OpCategory, op_category
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import CollectiveKind, GemmShape, collective, elementwise, gemm

PAPER = LayerConfig(hidden_size=1024, num_attention_heads=16, seq_length=256, micro_batch_size=1, tp=2)
MODERN = LayerConfig(
    hidden_size=1024,
    num_attention_heads=16,
    num_query_groups=4,
    seq_length=256,
    micro_batch_size=1,
    tp=2,
    sequence_parallel=True,
    activation="swiglu",
    normalization="rmsnorm",
    position_embedding="rope",
    attention_backend="flash",
)


@pytest.mark.parametrize(
    ("op", "category"),
    [
        (gemm("attn.qkv", GemmShape(8, 8, 8)), OpCategory.GEMM),  # not the attention core's "attn.qk"
        (gemm("attn.qk", GemmShape(8, 8, 8, 2)), OpCategory.ATTENTION),
        (gemm("attn.av.dgrad_v", GemmShape(8, 8, 8, 2)), OpCategory.ATTENTION),
        (elementwise("attn.softmax.bwd", 8.0), OpCategory.ATTENTION),
        (elementwise("attn.dropout", 8.0), OpCategory.ATTENTION),
        (elementwise("attn.context_copy", 8.0), OpCategory.MEMORY_BOUND),
        (elementwise("attn.rope", 8.0), OpCategory.MEMORY_BOUND),
        (elementwise("mlp.fc2.bias_dropout_add.bwd", 8.0), OpCategory.MEMORY_BOUND),
        (elementwise("attn.allgather.standin_all_gather", 8.0), OpCategory.STANDIN_COPY),
        (collective("attn.allgather", CollectiveKind.ALL_GATHER, 8.0), OpCategory.COMMUNICATION),
    ],
)
def test_an_op_is_of_the_kind_its_name_says(op, category: OpCategory) -> None:
    assert op_category(op) is category


def test_the_paper_layer_has_gemm_attention_and_memory_bound_ops() -> None:
    ops = layer_ops(PAPER)
    kinds = {op_category(op) for op in (*ops.forward, *ops.backward)}
    assert kinds == {OpCategory.GEMM, OpCategory.ATTENTION, OpCategory.MEMORY_BOUND, OpCategory.COMMUNICATION}


def test_a_flash_layer_has_one_attention_op_each_way_and_stand_ins_replace_its_collectives() -> None:
    ops = layer_ops(MODERN)
    attention = [op.name for op in (*ops.forward, *ops.backward) if op_category(op) is OpCategory.ATTENTION]
    assert attention == ["attn.flash", "attn.flash.bwd"]
    standin = {op_category(op) for op in standin_ops(ops.forward, MODERN.tp)}
    assert OpCategory.STANDIN_COPY in standin and OpCategory.COMMUNICATION not in standin
