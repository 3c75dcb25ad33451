"""The router's load-balancing loss and z-loss (`workload.moe_aux_loss`, `model.moe.aux_loss_coeff`
/ `load_balancing_type` / `z_loss_coeff`): bytes by hand on T = 10 tokens, E = 4 experts, top-2,
bf16 logits, and where the ops sit in the host tests' layer (T = 4096, E = 16, top-2, ep 8, tp 1,
dp 32)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simcluster.config.moe_choices import LoadBalancingType, RouterScore
from simcluster.config.scenario import parse_scenario
from simcluster.workload.moe_aux_loss import (
    fused_aux_loss_bytes,
    loss_ops,
    unfused_aux_loss_bytes,
    z_loss_bytes,
)
from simcluster.workload.moe_config import ExpertLayout, MoEConfig
from simcluster.workload.ops import CollectiveKind, CommGroup, Module, OpKind
from tests.costs.test_costs_moe_host import _segment
from tests.costs.test_costs_moe_host_fusion import _scenario as _fusion_scenario

MOE = MoEConfig(num_experts=4, router_topk=2, ffn_hidden_size=8, aux_loss_coeff=1e-3)
LOSSES = {Module.ROUTER_AUX_LOSS, Module.ROUTER_Z_LOSS}


def _scenario(router=False, training=None, **moe):
    """The host tests' layer with the loss keys `moe` (and `training` keys), validated."""
    data = _fusion_scenario(router=router).model_dump(mode="json")
    data["model"]["moe"].update(moe)
    data["training"].update(training or {})
    return parse_scenario(data, "s.yaml")


def test_unfused_softmax_bytes_by_hand():
    """scores: softmax 40·(2 + 4); topk 40·4 + 20·12; map 40·(2 + 2 + 4 + 4 + 1) + 20·12;
    count 40 + 4·8. loss: 40·4 and the [E] tail 4·24 + 16. backward: 40·(4 + 8 + 2) + 3·40·2
    + the tail. Saved: the fp32 scores, the int64 counts, the loss (moe_memory's share)."""
    moved = unfused_aux_loss_bytes(10, MOE, 2)
    assert moved.scores == 240 + 400 + 760 + 72
    assert moved.loss == 160 + 96 + 16
    assert moved.backward == 560 + 240 + 112
    assert moved.saved == 160 + 32 + 4


def test_unfused_sigmoid_reads_more_than_softmax():
    """sigmoid: cast, sigmoid, row sum and divide are four more [T, E] passes than softmax's one."""
    sigmoid = replace(MOE, router_score=RouterScore.SIGMOID)
    moved, plain = unfused_aux_loss_bytes(10, sigmoid, 2), unfused_aux_loss_bytes(10, MOE, 2)
    assert moved.scores - plain.scores == 40 * (2 + 4 + 8 + 4 + 8) - 240 + 10 * 12
    assert moved.saved - plain.saved == 10 * 4  # the normalising denominator [T, 1]


def test_fused_bytes_by_hand():
    """TE: scores kernel 40·(2 + 4 + 1 + 4), count 40 + 32; loss kernel 40·4 + 32 + 8;
    backward 40·(4 + 8 + 2) + 3·40·2; saved: the fp32 intermediate 160, Const_buf, counts, loss."""
    moved = fused_aux_loss_bytes(10, MOE, 2)
    assert (moved.scores, moved.loss, moved.backward, moved.saved) == (512, 200, 800, 200)


def test_z_loss_bytes_by_hand():
    """6 passes of e over [T, E] forward, 9 backward, plus [T] tails; keeps the logits."""
    assert z_loss_bytes(10, 4, 2) == (560, 800, 80 + 40 + 4)


def test_defaults_add_no_ops():
    """Megatron's defaults (coeff 0, no z-loss) and a coefficient under type none: nothing."""
    layout = ExpertLayout(tp=2, cp=1, dp=4, ep=2)
    plain = replace(MOE, aux_loss_coeff=0.0)
    assert loss_ops(10, 1, plain, layout, 2, fused=False) == loss_ops(10, 1, plain, layout, 2, fused=True)
    assert loss_ops(10, 1, plain, layout, 2, False).aux_forward == ()
    none = replace(MOE, load_balancing_type=LoadBalancingType.NONE)
    assert loss_ops(10, 1, none, layout, 2, False).aux_forward == ()
    assert loss_ops(10, 1, replace(plain, z_loss_coeff=0.0), layout, 2, False).z_forward != ()


@pytest.mark.parametrize(
    ("kind", "mbs", "group", "message"),
    [
        (LoadBalancingType.AUX_LOSS, 2, CommGroup.TP_CP, 4 * 8),
        (LoadBalancingType.SEQ_AUX_LOSS, 2, CommGroup.TP_CP, 2 * 4 * 8),
        (LoadBalancingType.GLOBAL_AUX_LOSS, 2, CommGroup.TP_DP_CP, 4 * 8),
    ],
)
def test_counts_all_reduce_group_and_bytes(kind, mbs, group, message):
    """int64 counts per expert ([b·E] per sequence for seq_aux_loss) all-reduced between the
    loss's two ops, over tp·cp or tp·cp·dp; none when that group is one rank."""
    moe = replace(MOE, load_balancing_type=kind)
    ops = loss_ops(10, mbs, moe, ExpertLayout(tp=2, cp=1, dp=4, ep=2), 2, False).aux_forward
    assert [op.kind for op in ops] == [OpKind.ELEMENTWISE, OpKind.COLLECTIVE, OpKind.ELEMENTWISE]
    reduce = ops[1]
    assert (reduce.collective, reduce.group, reduce.message_bytes) == (
        CollectiveKind.ALL_REDUCE,
        group,
        message,
    )
    alone = loss_ops(10, mbs, moe, ExpertLayout(tp=1, cp=1, dp=1, ep=1), 2, False).aux_forward
    assert [op.kind for op in alone] == [OpKind.ELEMENTWISE, OpKind.ELEMENTWISE]


def test_layer_places_the_losses_around_the_top_k():
    """z-loss between the router GEMM and the top-k; the aux loss right after the top-k (forward),
    its backward before the top-k's and the z-loss's after; saved bytes grow by exactly theirs."""
    plain = _segment(_scenario()).layer
    layer = _segment(_scenario(aux_loss_coeff=1e-3, z_loss_coeff=1e-3)).layer
    modules = [op.module for op in layer.forward if op.module in LOSSES | {Module.ROUTER, Module.ROUTER_TOPK}]
    assert modules == [
        Module.ROUTER,
        Module.ROUTER_Z_LOSS,
        Module.ROUTER_TOPK,
        Module.ROUTER_AUX_LOSS,
        Module.ROUTER_AUX_LOSS,
    ]  # tp·cp = 1: no all-reduce
    backward = [op.module for op in layer.backward if op.module in LOSSES | {Module.ROUTER_TOPK}]
    assert backward == [Module.ROUTER_AUX_LOSS, Module.ROUTER_TOPK, Module.ROUTER_Z_LOSS]
    added = sum(op.saved_bytes for op in layer.forward) - sum(op.saved_bytes for op in plain.forward)
    T, E = 4096, 16
    assert added == unfused_aux_loss_bytes(T, replace(MOE, num_experts=E), 2).saved + z_loss_bytes(T, E, 2)[2]


def test_router_fusion_switches_to_te_bytes():
    """Under --moe-router-fusion the scores op moves and keeps the fused kernel's bytes."""
    layer = _segment(_scenario(router=True, aux_loss_coeff=1e-3)).layer
    scores = next(op for op in layer.forward if op.module is Module.ROUTER_AUX_LOSS)
    fused = fused_aux_loss_bytes(4096, replace(MOE, num_experts=16), 2)
    assert (scores.bytes_moved, scores.saved_bytes) == (fused.scores, fused.saved)


def test_global_aux_loss_all_reduces_over_the_stage():
    """global_aux_loss on the host tests' layer (tp 1, dp 32): one all-reduce of E·8 bytes over tp·cp·dp."""
    layer = _segment(_scenario(aux_loss_coeff=1e-3, load_balancing_type="global_aux_loss")).layer
    (reduce,) = [
        op for op in layer.forward if op.module is Module.ROUTER_AUX_LOSS and op.kind is OpKind.COLLECTIVE
    ]
    assert (reduce.group, reduce.message_bytes) == (CommGroup.TP_DP_CP, 16 * 8)
    assert not [
        op for op in layer.backward if op.module is Module.ROUTER_AUX_LOSS and op.kind is OpKind.COLLECTIVE
    ]


@pytest.mark.parametrize(
    "recompute", [{"recompute": "full"}, {"recompute": "selective", "recompute_modules": ["moe"]}]
)
def test_checkpointed_forward_skips_the_losses(recompute):
    """A checkpoint's first run is under no_grad (router.py: `torch.is_grad_enabled()`): the
    losses leave the forward and run in the recompute."""
    layer = _segment(_scenario(training=recompute, aux_loss_coeff=1e-3, z_loss_coeff=1e-3)).layer
    assert not [op for op in layer.forward if op.module in LOSSES]
    assert {op.module for op in layer.recompute} >= LOSSES
