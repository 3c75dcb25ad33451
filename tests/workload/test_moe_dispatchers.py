"""The allgather and flex token dispatchers in the MoE layer's op graph
(`workload.moe_layer`): each collective and memory-bound kernel carries the building
blocks' bytes (`moe.dispatch_messages`, `moe.permute_bytes`, `moe_flex.flex_messages`), the
backward mirrors the forward as Megatron-core's autograd functions do, and the saved bytes
are `moe_memory`'s."""

from __future__ import annotations

import pytest
import yaml

from simcluster.config.moe_choices import TokenDispatcher
from simcluster.config.scenario import parse_scenario
from simcluster.workload.model import build_workload
from simcluster.workload.moe import dispatch_messages, permute_bytes
from simcluster.workload.moe_layer import layer_rows, moe_mlp_ops
from simcluster.workload.moe_memory import moe_saved_bytes
from simcluster.workload.ops import CollectiveKind, CommGroup, Module, OpKind, Pass
from tests.paths import ROOT

QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"


def _scenario(dispatcher="allgather", **parallel):
    data = yaml.safe_load(QWEN.read_text())
    data["parallel"].update(parallel)
    data["training"]["moe_token_dispatcher"] = dispatcher
    return parse_scenario(data, "s.yaml")


def _kind(scenario):
    kind = build_workload(scenario).layer_kind
    assert kind is not None and kind.moe is not None
    return kind.config, kind.moe


def _collectives(ops):
    return [op for op in ops if op.kind is OpKind.COLLECTIVE and op.group is not CommGroup.TP]


@pytest.mark.parametrize(
    "parallel", [{}, {"ep": 4}, {"tp": 2, "dp": 16, "sequence_parallel": True, "ep": 4, "etp": 2}]
)
def test_allgather_messages_are_dispatch_messages_over_etp_ep_and_mirror_in_backward(parallel):
    """Forward: routing map, probs and tokens all-gathered over etp·ep, the expert output
    reduce-scattered back; backward: that reduce-scatter's all-gather, then the tokens' and
    probs' reduce-scatters (the routing map is gathered under no_grad: no backward)."""
    cfg, spec = _kind(_scenario(**parallel))
    rows = layer_rows(cfg, spec)
    e = cfg.element_bytes
    want = {
        m.name: m.busiest_bytes
        for m in dispatch_messages(
            rows, cfg.hidden_size, spec.moe, spec.layout, TokenDispatcher.ALLGATHER, e, e
        )
    }
    forward, backward = moe_mlp_ops(cfg, spec)
    fwd = _collectives(forward)
    assert [(op.name, op.collective) for op in fwd] == [
        ("moe.routing_map_allgather", CollectiveKind.ALL_GATHER),
        ("moe.probs_allgather", CollectiveKind.ALL_GATHER),
        ("moe.dispatch_allgather", CollectiveKind.ALL_GATHER),
        ("moe.combine_reduce_scatter", CollectiveKind.REDUCE_SCATTER),
    ]
    assert all(op.group is CommGroup.ETP_EP and op.message_bytes == want[op.name] for op in fwd)
    bwd = _collectives(backward)
    assert [(op.name, op.collective) for op in bwd] == [
        ("moe.combine_reduce_scatter.bwd", CollectiveKind.ALL_GATHER),
        ("moe.dispatch_allgather.bwd", CollectiveKind.REDUCE_SCATTER),
        ("moe.probs_allgather.bwd", CollectiveKind.REDUCE_SCATTER),
    ]
    assert all(op.message_bytes == want[op.name.removesuffix(".bwd")] for op in bwd)
    # n = etp·ep ranks' tokens gathered: T·n·h·e
    n = spec.layout.ep * spec.layout.expert_tp
    assert want["moe.dispatch_allgather"] == rows.tokens * n * cfg.hidden_size * e


def test_allgather_permute_bytes_and_no_chunk_sort():
    cfg, spec = _kind(_scenario())
    rows = layer_rows(cfg, spec)
    e = cfg.element_bytes
    moved = permute_bytes(
        rows, cfg.hidden_size, spec.moe, spec.layout, e, e, dispatcher=TokenDispatcher.ALLGATHER
    )
    forward, backward = moe_mlp_ops(cfg, spec)
    by_name = {op.name: op for op in forward + backward}
    assert by_name["moe.permute"].bytes_moved == moved.permute == by_name["moe.permute.bwd"].bytes_moved
    assert by_name["moe.unpermute"].bytes_moved == moved.unpermute
    assert not [op for op in forward + backward if op.module is Module.MOE_SORT_CHUNKS]
    # the allgather's unpermute writes the gathered [T·n, h], not [T, h]
    alltoall = permute_bytes(rows, cfg.hidden_size, spec.moe, spec.layout, e, e)
    assert moved.unpermute > alltoall.unpermute


def test_allgather_saved_bytes_are_moe_memory_with_its_permute():
    cfg, spec = _kind(_scenario())
    forward, _ = moe_mlp_ops(cfg, spec)
    e = cfg.element_bytes
    rows = layer_rows(cfg, spec)
    saved = moe_saved_bytes(
        rows, cfg.hidden_size, spec.moe, spec.layout, True, e, e, dispatcher=TokenDispatcher.ALLGATHER
    )
    block_input = e * cfg.region_tokens * cfg.hidden_size
    assert sum(op.saved_bytes for op in forward) == pytest.approx(saved.total + block_input, rel=1e-12)
    alltoall = moe_saved_bytes(rows, cfg.hidden_size, spec.moe, spec.layout, True, e, e)
    assert saved.permute != alltoall.permute


def test_allgather_with_one_rank_sends_nothing():
    cfg, spec = _kind(_scenario(ep=1))
    forward, backward = moe_mlp_ops(cfg, spec)
    assert not _collectives(forward) and not _collectives(backward)
    assert all(op.pass_ is not Pass.FORWARD for op in backward)
