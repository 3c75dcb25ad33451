"""Host and pricing side of the router's losses (`costs.moe_host` AUX_* / Z_LOSS counts,
`costs.chunk` for the counts' all-reduce, `costs.graph_capture`), on the host tests' layer
(16 experts, top-2, ep 8, tp 1, dp 32 on 8-GPU H100 nodes)."""

from __future__ import annotations

import pytest

from simcluster.config.graph_scope import CudaGraphScope
from simcluster.config.hardware import load_hardware
from simcluster.costs.chunk import fp8_amax_reduction_s, is_expert_collective, op_time_s, price_ops
from simcluster.costs.graph_capture import captured_ops
from simcluster.costs.host import op_kernels
from simcluster.costs.placement import expert_groups, tp_group
from simcluster.workload.ops import Module, OpKind
from tests.costs.test_costs_moe_host import _segment
from tests.workload.test_moe_aux_loss import _scenario


def _aux_kernels(scenario, module=Module.ROUTER_AUX_LOSS):
    """Launches of each op of `module`, forward then backward, with its kind."""
    segment = _segment(scenario)
    out = []
    for ops in (segment.layer.forward, segment.layer.backward):
        counts = op_kernels(ops, scenario.training.dtype, segment.kind.moe)
        out.append([(op.kind.value, n) for op, n in zip(ops, counts) if op.module is module])
    return tuple(out)


E = "elementwise"


@pytest.mark.parametrize(
    ("router", "moe", "forward", "backward"),
    [
        # softmax 1 + topk 1 + map 4 + count 1; switch loss 4 + tracker 2; scaler 2 + loss 2 + softmax 3
        (False, {}, [(E, 7), (E, 6)], [(E, 7)]),
        # fused scores + count; fused loss + tracker; scaler 2 + two TE kernels + the add
        (True, {}, [(E, 2), (E, 3)], [(E, 5)]),
        # sigmoid: 5 score kernels; backward divide 3, sigmoid, cast, add
        (False, {"router_score": "sigmoid"}, [(E, 11), (E, 6)], [(E, 10)]),
        # seq_aux_loss: the loss / bsz and its gradient
        (False, {"load_balancing_type": "seq_aux_loss"}, [(E, 7), (E, 7)], [(E, 8)]),
        # global_aux_loss: the all-reduce (one launch) and the running average's 3 kernels
        (False, {"load_balancing_type": "global_aux_loss"}, [(E, 7), ("collective", 1), (E, 9)], [(E, 7)]),
    ],
    ids=["softmax", "fused", "sigmoid", "seq", "global"],
)
def test_aux_loss_launches(router, moe, forward, backward):
    scenario = _scenario(router=router, aux_loss_coeff=1e-3, **moe)
    assert _aux_kernels(scenario) == (forward, backward)


def test_z_loss_launches():
    """logsumexp 9, square, mean, × coeff, tracker 2 = 14; backward scaler 2 + 8 = 10."""
    assert _aux_kernels(_scenario(z_loss_coeff=1e-3), Module.ROUTER_Z_LOSS) == ([(E, 14)], [(E, 10)])


def test_defaults_launch_nothing_more():
    """coeff 0 (Megatron's default): the layer's launches are those without the keys."""
    segment, plain = _segment(_scenario(load_balancing_type="seq_aux_loss")), _segment(_scenario())
    assert segment.layer == plain.layer


def test_counts_all_reduce_is_blocking_comm_at_tree_latency():
    """global_aux_loss over tp·cp·dp = 32 ranks on 8-GPU nodes (crosses nodes): a few bytes,
    priced as the latency-only small all-reduce, in TP comm (not the dispatcher's ep_comm)."""
    scenario = _scenario(aux_loss_coeff=1e-3, load_balancing_type="global_aux_loss")
    hw = load_hardware(scenario.hardware)
    experts = expert_groups(scenario, hw)
    assert experts.tp_dp_cp.num_ranks == 32 and experts.tp_dp_cp.crosses_nodes
    segment = _segment(scenario)
    (reduce,) = [
        op
        for op in segment.layer.forward
        if op.kind is OpKind.COLLECTIVE and op.module is Module.ROUTER_AUX_LOSS
    ]
    assert not is_expert_collective(reduce)
    tp = tp_group(scenario, hw)
    seconds = op_time_s(reduce, hw, tp, scenario.training.dtype, experts=experts)
    assert seconds == fp8_amax_reduction_s(experts.tp_dp_cp, hw) > 0
    alone = price_ops((reduce,), hw, tp, scenario.training.dtype, experts=experts)
    assert (alone.comm_s, alone.ep_comm_s) == (seconds, 0.0)


def test_router_graph_captures_the_losses():
    """The router's CUDA graph (moe_router scope) holds `routing`, losses included."""
    segment = _segment(_scenario(aux_loss_coeff=1e-3, z_loss_coeff=1e-3))
    scope = frozenset({CudaGraphScope.MOE_ROUTER})
    for ops in (segment.layer.forward, segment.layer.backward):
        captured = captured_ops(ops, scope, segment.kind.moe)
        losses = [
            c for op, c in zip(ops, captured) if op.module in (Module.ROUTER_AUX_LOSS, Module.ROUTER_Z_LOSS)
        ]
        assert losses and all(losses)
