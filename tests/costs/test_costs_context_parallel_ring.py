"""Context parallelism's K/V ring (Megatron-core `--cp-comm-type p2p`, TE
AttnFuncWithCPAndKVP2P): c attention steps of ½(s/c)² each, c − 1 transfers
each hidden behind a step, the backward's K/V + dK/dV messages and final dK/dV, priced on the
context-parallel group's links."""

import pytest
import yaml

from simcluster.config import ConfigError, load_hardware, parse_scenario
from simcluster.costs.chunk import price_ops
from simcluster.costs.compute import attention_time_s, elementwise_time_s
from simcluster.costs.context_parallel import (
    ring_attention_cost_s,
    ring_merge_time_s,
    ring_step_times_s,
    ring_transfer_times_s,
)
from simcluster.costs.network import GroupPlacement, p2p_time_s
from simcluster.costs.placement import cp_group, tp_group
from simcluster.simulation import run_simulation
from simcluster.workload.model import build_workload, layer_config
from simcluster.workload.ops import AttentionShape

H100 = load_hardware("h100-sxm5-80gb")
GB200 = load_hardware("gb200-nvl72")

BASE = {
    "hardware": "h100-sxm5-80gb",
    "model": {
        "num_layers": 4,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_query_groups": 4,
        "seq_length": 8192,
        "vocab_size": 32000,
    },
    "parallel": {"tp": 8, "cp": 4, "pp": 2, "sequence_parallel": True},
    "training": {"micro_batch_size": 1, "global_batch_size": 4, "attention_backend": "flash"},
}


def _scenario(cp: int = 4, seq_length: int = 8192, **parallel):
    data = yaml.safe_load(yaml.safe_dump(BASE))
    data["parallel"].update(cp=cp, **parallel)
    data["model"]["seq_length"] = seq_length
    return parse_scenario(data, "s.yaml")


def _rings(scenario):
    layer = build_workload(scenario).layer
    forward = [op.ring for op in layer.forward if op.ring is not None]
    backward = [op.ring for op in layer.backward if op.ring is not None]
    assert len(forward) == len(backward) == 1
    return forward[0], backward[0]


def test_ring_shapes_and_messages_by_hand():
    """s 8192, c 4, t 4: each rank holds 2048 tokens (2 chunks of 1024). Diagonal: 2048 ×
    2048 causal; lower: 2048 × 1024; upper: 1024 × 2048. K/V travel on g/t = 1 KV head."""
    forward, backward = _rings(_scenario(tp=4))
    assert forward.cp_size == 4
    assert (forward.diagonal.seq_q, forward.diagonal.seq_k, forward.diagonal.causal) == (2048, 2048, True)
    assert (forward.lower.seq_q, forward.lower.seq_k, forward.lower.causal) == (2048, 1024, False)
    assert (forward.upper.seq_q, forward.upper.seq_k, forward.upper.causal) == (1024, 2048, False)
    # K and V of 2048 tokens on g/t = 1 KV head of d 64, bf16: 2 · 2048 · 64 · 2 bytes
    kv = 2 * 2048 * 64 * 2
    assert (forward.first_message_bytes, forward.message_bytes, forward.final_message_bytes) == (kv, kv, 0.0)
    assert (backward.first_message_bytes, backward.message_bytes, backward.final_message_bytes) == (
        kv,
        2 * kv,
        kv,
    )


def test_each_rank_does_one_cth_of_causal_attention():
    """½(s/c)² per step × c steps = s²/(2c): 1/c of the whole sequence's causal attention."""
    forward, backward = _rings(_scenario(tp=4))
    whole = AttentionShape(batch=1, heads=4, kv_heads=1, seq_q=8192, seq_k=8192, head_dim=64, causal=True)
    assert forward.flops == pytest.approx(whole.flops / 4)
    assert forward.diagonal.flops == pytest.approx(forward.lower.flops) == pytest.approx(forward.upper.flops)
    assert backward.flops == pytest.approx(2.5 * whole.flops / 4)


def test_step_count_and_overlap_by_hand():
    """Forward: Σ_{i<c−1} max(attn_i, send) + attn_{c−1}; backward adds the final dK/dV."""
    scenario = _scenario(tp=4)
    forward, backward = _rings(scenario)
    group = GroupPlacement(num_ranks=4, ranks_per_node=2)  # t 4: ranks 0, 4 | 8, 12 on two nodes
    assert cp_group(scenario, H100) == group
    steps = ring_step_times_s(forward, H100)
    assert len(steps) == 4 and len(ring_transfer_times_s(forward, H100, group)) == 3
    assert steps[0] == attention_time_s(forward.diagonal, H100)
    later = max(attention_time_s(forward.lower, H100), attention_time_s(forward.upper, H100))
    assert steps[1:] == (later,) * 3
    send = p2p_time_s(forward.message_bytes, False, H100)
    compute, exposed = ring_attention_cost_s(forward, H100, group)
    merges = ring_merge_time_s(forward, H100)
    assert compute == pytest.approx(sum(steps) + merges)
    assert compute + exposed == pytest.approx(max(steps[0], send) + 2 * max(later, send) + later + merges)

    bsteps = ring_step_times_s(backward, H100)
    first, rest = (
        p2p_time_s(backward.first_message_bytes, False, H100),
        p2p_time_s(backward.message_bytes, False, H100),
    )
    bcompute, bexposed = ring_attention_cost_s(backward, H100, group)
    assert bcompute + bexposed == pytest.approx(
        max(bsteps[0], first)
        + max(bsteps[1], rest)
        + max(bsteps[2], rest)
        + bsteps[3]
        + first
        + ring_merge_time_s(backward, H100)
    )


def test_merges_follow_te_out_correction_and_grad_accumulation():
    """s 8192, c 4, t 4: |O| = 2048 tokens × q/t = 256 × 2 bytes, |KV| = 2 · 2048 · 64 · 2.
    Forward: init correction 2|O|, then 3|O| per later step (`flash_attn_fwd_out_correction`);
    backward: 2|O| + 4|KV| on step 0 (dq.copy_, combine dK/dV, dkv.copy_), then 3|O| + 5|KV|
    (dq.add_, combine, dkv.add_); each step its own kernel, after the ring's attention."""
    forward, backward = _rings(_scenario(tp=4))
    o, kv = 2048 * 256 * 2, 2 * 2048 * 64 * 2
    assert (forward.first_merge_bytes, forward.merge_bytes) == (2 * o, 3 * o)
    assert (backward.first_merge_bytes, backward.merge_bytes) == (2 * o + 4 * kv, 3 * o + 5 * kv)
    assert ring_merge_time_s(forward, H100) == pytest.approx(
        elementwise_time_s(2 * o, H100) + 3 * elementwise_time_s(3 * o, H100)
    )


def test_short_sequences_expose_the_transfers():
    """s 512 over c 4 on InfiniBand: each step's attention is shorter than its transfer, so
    the ring costs the transfers, and comm shows up in the layer's exposed time."""
    scenario = _scenario(tp=4, seq_length=512)
    forward, _ = _rings(scenario)
    group = cp_group(scenario, H100)
    steps, sends = ring_step_times_s(forward, H100), ring_transfer_times_s(forward, H100, group)
    assert all(send > step for step, send in zip(steps, sends))
    compute, exposed = ring_attention_cost_s(forward, H100, group)
    assert exposed == pytest.approx(sum(send - step for step, send in zip(steps, sends)))
    layer = build_workload(scenario).layer
    cost = price_ops(layer.forward, H100, tp_group(scenario, H100), scenario.training.dtype, group)
    no_ring = price_ops(
        layer.forward, H100, tp_group(scenario, H100), scenario.training.dtype, GroupPlacement(4, 4)
    )
    assert cost.comm_s > no_ring.comm_s  # NVLink transfers are cheaper than InfiniBand ones


def test_the_ring_uses_nvlink_inside_an_nvl72_domain_and_ib_across_h100_nodes():
    """t 8 (g 8), c 4: the ring's ranks are 8 apart; on H100 each sits on its own node."""
    data = yaml.safe_load(yaml.safe_dump(BASE))
    data["model"]["num_query_groups"] = 8
    data["parallel"]["cp"] = 4
    scenario = parse_scenario(data, "s.yaml")
    h100, gb200 = cp_group(scenario, H100), cp_group(scenario, GB200)
    assert h100.crosses_nodes and not gb200.crosses_nodes
    forward, _ = _rings(scenario)
    assert ring_transfer_times_s(forward, H100, h100)[0] == p2p_time_s(forward.message_bytes, False, H100)
    assert ring_transfer_times_s(forward, GB200, gb200)[0] == p2p_time_s(forward.message_bytes, True, GB200)


def test_flash_activations_divide_by_c():
    """Q, K, V, O and the LSE of s/c tokens: the layer keeps 1/c of its c = 1 bytes."""
    one, four = build_workload(_scenario(cp=1, tp=4)), build_workload(_scenario(cp=4, tp=4))
    assert four.layer.saved_bytes * 4 == pytest.approx(one.layer.saved_bytes)
    assert layer_config(_scenario(cp=4, tp=4)).seq_length == 2048


def test_cp_scenario_runs_end_to_end_and_c_1_has_no_ring():
    result = run_simulation(_scenario(tp=4), H100).result
    assert result.iteration_time_s > 0 and result.num_gpus == 4 * 4 * 2
    forward, _ = _rings(_scenario(tp=4))
    assert forward is not None
    layer = build_workload(_scenario(cp=1, tp=4)).layer
    assert all(op.ring is None for op in layer.forward + layer.backward + layer.recompute)


def test_cp_with_the_unfused_core_is_refused():
    data = yaml.safe_load(yaml.safe_dump(BASE))
    data["training"]["attention_backend"] = "unfused"
    with pytest.raises(ConfigError) as caught:
        parse_scenario(data, "s.yaml")
    assert "parallel.cp: value 4: needs training.attention_backend flash" in str(caught.value)


def test_ring_buffers_are_transient_memory():
    """Two K/V chunks of s/c tokens in flight (TE `p2p_comm_buffers`), on top of the recompute
    workspace; none without cp."""
    from simcluster.workload.model import recompute_workspace_bytes, ring_buffer_bytes, transient_bytes

    work = build_workload(_scenario(tp=4))
    assert ring_buffer_bytes(work) == 2 * (2 * 2048 * 64 * 2)
    assert transient_bytes(work) == recompute_workspace_bytes(work) + ring_buffer_bytes(work)
    assert ring_buffer_bytes(build_workload(_scenario(cp=1, tp=4))) == 0.0


def test_cp_ranks_split_the_layers_flops_exactly():
    """Per rank, GEMMs run on s/c tokens and attention is 1/c of the causal total, so c ranks
    do exactly the FLOPs of one rank without cp, forward, backward and recompute alike."""
    one, four = build_workload(_scenario(cp=1, tp=4)).layer, build_workload(_scenario(cp=4, tp=4)).layer
    for phase in ("forward", "backward"):
        flops_one = sum(op.flops for op in getattr(one, phase))
        flops_four = sum(op.flops for op in getattr(four, phase))
        assert 4 * flops_four == pytest.approx(flops_one)
