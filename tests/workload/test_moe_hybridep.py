"""Hybrid-EP's messages and ops (`workload.moe_flex.hybridep_messages`,
`moe_layer._hybridep_dispatch_ops`): a copy per destination rank / domain carrying the token
and its destination's probs; the scan only on the forward dispatch; the staging copy on the
dispatches; the routing map gathered once; the handle, not Megatron's argsort, saved."""

import pytest
import yaml

from simcluster.config.moe_choices import FlexBackend
from simcluster.config.scenario import parse_scenario
from simcluster.workload.model import build_workload
from simcluster.workload.moe import routed_rows
from simcluster.workload.moe_config import ExpertLayout, MoEConfig
from simcluster.workload.moe_flex import expected_destinations, hybridep_handle_bytes, hybridep_messages
from simcluster.workload.ops import CollectiveKind, Module, OpKind, Pass
from tests.paths import ROOT

DEEPSEEK = MoEConfig(256, 8, 2048, router_score="sigmoid", router_num_groups=8, router_group_topk=4)
QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"


def test_hybridep_messages_deepseek_on_8_nodes():
    """ep 64 on 8-GPU nodes, 4096 tokens: D(64) copies of h·2 + 4·(256/64) bytes dispatched,
    h·2 combined; to other domains D(8)·7/8 copies; scan of the [T·64, 256] map plus the handle
    on the forward dispatch only; staging 2·T·h·2 on the two dispatches."""
    layout = ExpertLayout(tp=1, cp=1, dp=64, ep=64, etp=1)
    rows = routed_rows(4096, 1, DEEPSEEK, layout)
    m = hybridep_messages(rows, 7168, DEEPSEEK, layout)
    copies = 4096 * expected_destinations(DEEPSEEK, 64)
    with_probs = 7168 * 2 + 4 * 4
    assert m.dispatch.send_bytes == pytest.approx(copies * with_probs)
    assert m.combine.send_bytes == pytest.approx(copies * 7168 * 2)
    assert m.dispatch.bytes_across(8) == pytest.approx(4096 * 4.0 * 7 / 8 * with_probs)
    assert all(msg.backend is FlexBackend.HYBRIDEP for msg in (m.dispatch, m.combine))
    handle = 4096 * 64 * 4 + 4096 * 256 * 5
    assert hybridep_handle_bytes(rows, DEEPSEEK, layout) == pytest.approx(handle)
    assert m.dispatch.preprocess_bytes == pytest.approx(4096 * 64 * 256 + handle)
    assert (m.combine.preprocess_bytes, m.combine_backward.preprocess_bytes) == (0.0, 0.0)
    staging = 2 * 4096 * 7168 * 2
    assert (m.dispatch.staging_bytes, m.combine_backward.staging_bytes) == (staging, staging)
    assert (m.combine.staging_bytes, m.dispatch_backward.staging_bytes) == (0.0, 0.0)
    with pytest.raises(ValueError, match="etp=2"):
        hybridep_messages(rows, 7168, DEEPSEEK, ExpertLayout(tp=2, cp=1, dp=64, ep=64, etp=2))


def _segment(backend: str):
    data = yaml.safe_load(QWEN.read_text())
    data["parallel"]["ep"] = 16
    data["training"]["moe_token_dispatcher"] = "flex"
    data["training"]["moe_flex_dispatcher_backend"] = backend
    workload = build_workload(parse_scenario(data, "s.yaml"))
    return next(seg for seg in workload.stages[0].chunks[0].segments if seg.kind.moe)


def test_the_hybridep_layer_gathers_the_map_and_saves_the_handle():
    hybrid, deepep = _segment("hybridep"), _segment("deepep")
    assert hybrid.kind.moe.flex_backend is FlexBackend.HYBRIDEP
    forward = hybrid.layer.forward
    (gather,) = [op for op in forward if op.collective is CollectiveKind.ALL_GATHER]
    kernels = [op for op in forward if op.deepep is not None]
    assert forward.index(gather) + 1 == forward.index(kernels[0])  # the map, then the dispatch
    assert not any(op.collective is CollectiveKind.ALL_GATHER for op in hybrid.layer.backward)
    assert [op.deepep.backend for op in (*kernels, *hybrid.layer.backward) if op.deepep] == [
        FlexBackend.HYBRIDEP
    ] * 4
    permute = next(op for op in forward if op.module is Module.MOE_PERMUTE and op.kind is OpKind.ELEMENTWISE)
    assert permute.pass_ is Pass.FORWARD
    spec = hybrid.kind.moe
    rows = routed_rows(4096, 1, spec.moe, spec.layout)
    assert permute.saved_bytes == pytest.approx(hybridep_handle_bytes(rows, spec.moe, spec.layout))
    # the same tokens move: the permute's HBM bytes are the DeepEP path's
    deepep_permute = next(
        op for op in deepep.layer.forward if op.module is Module.MOE_PERMUTE and op.kind is OpKind.ELEMENTWISE
    )
    assert permute.bytes_moved == deepep_permute.bytes_moved
    assert permute.saved_bytes != deepep_permute.saved_bytes
