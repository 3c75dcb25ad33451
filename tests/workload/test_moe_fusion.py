"""The op graph of the fused MoE router and permutation (`workload.moe_fusion`,
`workload.moe_layer` with `training.moe_router_fusion` / `moe_permute_fusion`): HBM bytes and
saved bytes of TE's fused kernels (TE @71bbefbf), by hand on the host tests' layer: T = 4096
tokens, h = 2048, E = 16 experts, top-2, ep 8 (2 local experts), bf16, R = Re = 8192 rows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simcluster.config.moe_choices import FlexBackend, TokenDispatcher
from simcluster.workload.moe_config import ExpertLayout, MoEConfig
from simcluster.workload.moe_fusion import (
    fused_router_saved_bytes,
    fused_topk_bytes,
    row_id_map_bytes,
)
from simcluster.workload.moe_layer import MoELayerSpec
from tests.costs.test_costs_moe_host import _segment
from tests.costs.test_costs_moe_host_fusion import _scenario

T, H, E, K, R = 4096, 2048, 16, 2, 8192


def _op(scenario, name, backward=False):
    segment = _segment(scenario)
    ops = segment.layer.backward if backward else segment.layer.forward
    return next(op for op in ops if op.name == name)


def test_fused_topk_bytes_by_hand():
    """T = 10, E = 4, bf16: forward 40·(2 + 2 + 1 + 4), backward 40·(2 + 4 + 1 + 2)."""
    assert fused_topk_bytes(10, 4, 2) == (360, 360)


def test_fused_router_keeps_its_map_and_fp32_scores():
    """5·T·E, whatever the score function; a capacity factor adds its bool mask T·E."""
    moe = MoEConfig(num_experts=8, router_topk=2, ffn_hidden_size=32)
    assert fused_router_saved_bytes(100, moe) == 100 * 8 * 5
    assert fused_router_saved_bytes(100, replace(moe, capacity_factor=1.0)) == 100 * 8 * 6


def test_router_fusion_op_graph():
    """The top-k op: unfused it keeps T·k·(8 + 4) (indices, fp32 softmax) and moves
    T·E·e + T·k·(e + 8) + T·E·(e + 1); fused it keeps T·E·5 and moves T·E·9 each way."""
    plain, fused = _scenario(), _scenario(router=True)
    assert _op(plain, "moe.router_topk").saved_bytes == T * K * 12
    assert _op(plain, "moe.router_topk").bytes_moved == T * E * 2 + T * K * 10 + T * E * 3
    assert _op(fused, "moe.router_topk").saved_bytes == T * E * 5
    assert _op(fused, "moe.router_topk").bytes_moved == T * E * 9
    assert _op(fused, "moe.router_topk.bwd", backward=True).bytes_moved == T * E * 9
    # the permutation is untouched by the router's fusion
    assert _op(fused, "moe.permute") == _op(plain, "moe.permute")


def test_permute_fusion_op_graph():
    """Fused permute: the row-id map's three passes, each token read once, R rows and probs
    written, R probs gathered, the map's per-row reads; it keeps the int32 [T, 2E + 1] map and
    the two chunk sorts' Re·4 maps. Backward writes the tokens and the dense probs' gradient."""
    plain, fused = _scenario(), _scenario(permute=True)
    map_reads = (2 * R + T) * 4
    assert row_id_map_bytes(T, E) == T * E * 17 + T * (2 * E + 1) * 4
    forward = row_id_map_bytes(T, E) + T * H * 2 + R * (H * 2 + 2) + R * 2 + map_reads
    assert _op(fused, "moe.permute").bytes_moved == forward == 52_101_120
    assert _op(plain, "moe.permute").bytes_moved == 2 * R * (H * 2 + 2) == 67_141_632
    assert _op(fused, "moe.permute").saved_bytes == T * (2 * E + 1) * 4 + 2 * R * 4
    backward = R * (H * 2 + 2) + T * H * 2 + T * E * 2 + map_reads
    assert _op(fused, "moe.permute.bwd", backward=True).bytes_moved == backward
    assert _op(fused, "moe.unpermute").bytes_moved == (R + T) * H * 2 + map_reads
    assert _op(fused, "moe.sort_chunks").bytes_moved == 2 * R * H * 2 + 2 * R * 4
    assert _op(fused, "moe.router_topk") == _op(plain, "moe.router_topk")


def test_hybridep_op_graph_ignores_permute_fusion():
    """HybridEP permutes in its own kernel: the op graph is the same with the key."""
    plain = _segment(_scenario(dispatcher="flex", backend="hybridep")).layer
    fused = _segment(_scenario(permute=True, dispatcher="flex", backend="hybridep")).layer
    assert (fused.forward, fused.backward) == (plain.forward, plain.backward)


@pytest.mark.parametrize(
    ("dispatcher", "backend"),
    [(TokenDispatcher.ALLGATHER, FlexBackend.DEEPEP), (TokenDispatcher.FLEX, FlexBackend.DEEPEP)],
)
def test_spec_refuses_permute_fusion_it_does_not_price(dispatcher, backend):
    """allgather and DeepEP's fused paths are not priced: the spec says so, naming the field."""
    moe = MoEConfig(num_experts=8, router_topk=2, ffn_hidden_size=32)
    layout = ExpertLayout(tp=1, cp=1, dp=4, ep=4)
    with pytest.raises(ValueError, match="permute_fusion=True is not priced"):
        MoELayerSpec(moe, layout, dispatcher, flex_backend=backend, permute_fusion=True)
    assert MoELayerSpec(moe, layout, dispatcher, flex_backend=backend, router_fusion=True).router_fusion
