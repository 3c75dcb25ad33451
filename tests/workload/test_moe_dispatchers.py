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
from simcluster.workload.moe_flex import expected_destinations, flex_messages, flex_permute
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


def test_flex_messages_are_deepep_copies_scaled_by_the_load_imbalance():
    """DeepEP's dispatch sends each token once per destination rank with its indices and
    probabilities (`moe_flex.flex_messages`), combine returns h·e per copy; the busiest rank's
    bytes are li × the mean's; backward mirrors each kernel with the same bytes."""
    for li in (1.0, 1.5):
        data = yaml.safe_load(QWEN.read_text())
        data["training"]["moe_token_dispatcher"] = "flex"
        data["model"]["moe"]["load_imbalance"] = li
        cfg, spec = _kind(parse_scenario(data, "s.yaml"))
        rows = layer_rows(cfg, spec)
        flex = flex_messages(rows, cfg.hidden_size, spec.moe, spec.layout, 8, cfg.element_bytes)
        forward, backward = moe_mlp_ops(cfg, spec)
        fwd, bwd = _collectives(forward), _collectives(backward)
        assert [op.name for op in fwd] == ["moe.deepep_dispatch", "moe.deepep_combine"]
        assert [op.name for op in bwd] == ["moe.deepep_combine.bwd", "moe.deepep_dispatch.bwd"]
        dispatch, combine = fwd
        assert dispatch.deepep.send_bytes == pytest.approx(li * flex.dispatch_bytes, rel=1e-12)
        assert combine.deepep.send_bytes == pytest.approx(li * flex.combine_bytes, rel=1e-12)
        assert dispatch.message_bytes == dispatch.deepep.send_bytes
        assert bwd[1].deepep == dispatch.deepep and bwd[0].deepep == combine.deepep
        # per token and destination: h·e + k·(8 + 4) out, h·e back
        per_copy = cfg.hidden_size * cfg.element_bytes
        copies = rows.tokens * expected_destinations(spec.moe, 8) * li
        assert dispatch.deepep.send_bytes == pytest.approx(copies * (per_copy + 8 * 12), rel=1e-12)
        # across two domains of 4 ranks: D(2 nodes)·(1 − 1/2) copies a token cross
        across = rows.tokens * expected_destinations(spec.moe, 2) * 0.5 * li * (per_copy + 8 * 12)
        assert dispatch.deepep.bytes_across(2) == pytest.approx(across, rel=1e-12)
        assert dispatch.deepep.bytes_across(1) == 0.0


def test_flex_permute_and_saved_bytes():
    """The received tokens (li·T·D(ep)) are permuted into the local experts' rows and back;
    the forward keeps the flex permute's saved bytes in place of the alltoall's."""
    cfg, spec = _kind(_scenario("flex"))
    rows = layer_rows(cfg, spec)
    moved = flex_permute(rows, cfg.hidden_size, spec.moe, spec.layout, cfg.element_bytes)
    h, e = cfg.hidden_size, cfg.element_bytes
    n = rows.tokens * expected_destinations(spec.moe, 8)
    assert moved.received_tokens == pytest.approx(n)
    assert moved.permute == pytest.approx(n * h * e + rows.busiest_expert * (h * e + 4))
    forward, _ = moe_mlp_ops(cfg, spec)
    permute = next(op for op in forward if op.name == "moe.permute")
    assert permute.saved_bytes == moved.saved == pytest.approx((n * 128 / 8 + rows.busiest_expert) * 8)
    assert not [op for op in forward if op.module is Module.MOE_SORT_CHUNKS]
