"""Flex (DeepEP) message sizes: distinct destinations of a token, by hand, at the limits,
and against a seeded simulation of Megatron-core's group-limited top-k."""

import math

import numpy as np
import pytest

from simcluster.workload.moe import routed_rows
from simcluster.workload.moe_config import ExpertLayout, MoEConfig
from simcluster.workload.moe_flex import expected_destinations, flex_messages

DEEPSEEK = MoEConfig(256, 8, 2048, router_score="sigmoid", router_num_groups=8, router_group_topk=4)


def test_destinations_by_hand_and_at_the_limits():
    """E = 8, k = 2, 4 ranks: 4·(1 - C(6,2)/C(8,2)) = 4·13/28; one expert a rank: k; one rank: 1."""
    moe = MoEConfig(8, 2, 16)
    assert math.isclose(expected_destinations(moe, 4), 4 * 13 / 28, rel_tol=1e-15)
    assert math.isclose(expected_destinations(moe, 8), 2.0, rel_tol=1e-15)
    assert expected_destinations(moe, 1) == 1.0
    with pytest.raises(ValueError, match="divide evenly over 3"):
        expected_destinations(moe, 3)


def simulated_destinations(moe: MoEConfig, m: int, tokens: int = 4000) -> float:
    """moe_utils.py group_limited_topk (or plain top-k) on i.i.d. sigmoid scores, in numpy."""
    rng = np.random.default_rng(0)
    E, k = moe.num_experts, moe.router_topk
    scores = 1.0 / (1.0 + np.exp(-rng.standard_normal((tokens, E))))
    if moe.router_num_groups and moe.router_group_topk:
        G, gk = moe.router_num_groups, moe.router_group_topk
        group_scores = np.sort(scores.reshape(tokens, G, -1), axis=-1)[:, :, -(k // gk) :].sum(-1)
        picked = np.zeros((tokens, G), bool)
        np.put_along_axis(picked, np.argsort(-group_scores, axis=1)[:, :gk], True, 1)
        scores = np.where(np.repeat(picked, E // G, axis=1), scores, -np.inf)
    top = np.argsort(-scores, axis=1)[:, :k]
    dest = np.sort(top // (E // m), axis=1)
    return float(np.mean(1 + (np.diff(dest, axis=1) != 0).sum(axis=1)))


@pytest.mark.parametrize(("m", "tolerance"), [(8, 0.01), (16, 0.07), (64, 0.02), (4, 0.01)])
def test_grouped_routing_destinations_against_a_simulation(m, tolerance):
    """DeepSeek-V3's node-limited routing (4 of 8 groups): the model's error is as stated in
    workload/moe_flex.py's docstring."""
    model, simulated = expected_destinations(DEEPSEEK, m), simulated_destinations(DEEPSEEK, m)
    assert abs(model - simulated) <= tolerance * simulated, (model, simulated)


def test_plain_top_k_is_exact_against_the_simulation():
    moe = MoEConfig(256, 8, 2048)
    for m in (8, 64):
        assert abs(expected_destinations(moe, m) - simulated_destinations(moe, m)) < 0.02


def test_flex_messages_deepseek_on_8_nodes():
    """ep = 64 on 8-GPU nodes: each token crosses to D(8 nodes) = 4 nodes less its own share."""
    layout = ExpertLayout(tp=1, cp=1, dp=64, ep=64, etp=1)
    rows = routed_rows(4096, 1, DEEPSEEK, layout)
    msgs = flex_messages(rows, 7168, DEEPSEEK, layout, gpus_per_node=8)
    assert msgs.nodes_per_token == pytest.approx(4.0)
    per_token = 7168 * 2 + 8 * (8 + 4)
    assert msgs.dispatch_bytes == pytest.approx(4096 * msgs.destinations_per_token * per_token)
    assert msgs.internode_dispatch_bytes == pytest.approx(4096 * 4.0 * 7 / 8 * per_token)
    assert msgs.combine_bytes == pytest.approx(4096 * msgs.destinations_per_token * 7168 * 2)
    with pytest.raises(ValueError, match="etp=2"):
        flex_messages(rows, 7168, DEEPSEEK, ExpertLayout(tp=2, cp=1, dp=64, ep=64, etp=2), 8)
