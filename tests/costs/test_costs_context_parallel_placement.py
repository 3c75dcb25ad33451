"""Context parallelism in Megatron-core's rank order (tp-cp-dp-pp, `parallel_state.py::RankGenerator`): which
groups cross nodes, the DP × CP gradient reduction, and every non-attention op on s/c."""

import pytest
import yaml

from simcluster.config import ConfigError, Scenario, load_hardware, parse_scenario
from simcluster.costs.network import GroupPlacement, collective_time_s
from simcluster.costs.placement import cp_group, dp_cp_group, dp_group, global_rank, stages_share_node
from simcluster.costs.stage_pricing import StagePricing
from simcluster.workload.model import build_workload, layer_config
from simcluster.workload.ops import CollectiveKind, OpKind

H100 = load_hardware("h100-sxm5-80gb")
GB200 = load_hardware("gb200-nvl72")

BASE = {
    "name": "cp",
    "hardware": "h100-sxm5-80gb",
    "model": {
        "num_layers": 8,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "seq_length": 4096,
        "vocab_size": 32000,
    },
    "parallel": {"tp": 8, "cp": 2, "pp": 2, "dp": 4, "sequence_parallel": True},
    "training": {"micro_batch_size": 1, "global_batch_size": 16, "recompute": "selective"},
}


def _scenario(**parallel) -> Scenario:
    """Built field by field, skipping the loader: these tests exercise the layout with the
    paper's layer, whose unfused attention the loader refuses with cp > 1."""
    data = yaml.safe_load(yaml.safe_dump(BASE))
    data["parallel"].update(parallel)
    return Scenario.model_validate(data)


def test_rank_order_is_tp_cp_dp_pp():
    """rank = tp_rank + t·(cp_rank + c·(dp_rank + d·stage)): t 8, c 2, d 4."""
    s = _scenario()
    assert global_rank(s, stage=0, cp_rank=1) == 8
    assert global_rank(s, stage=0, dp_rank=1) == 16
    assert global_rank(s, stage=1) == 64
    assert global_rank(s, stage=1, dp_rank=3, tp_rank=5, cp_rank=1) == 5 + 8 * (1 + 2 * (3 + 4 * 1))


def test_tp8_cp2_crosses_ib_on_8_gpu_nodes_but_stays_on_nvl72():
    """CP ranks are t = 8 apart: ranks 0 and 8 sit on two H100 nodes (InfiniBand), but in one
    72-GPU NVLink domain on GB200 NVL72."""
    s = _scenario()
    h100, gb200 = cp_group(s, H100), cp_group(s, GB200)
    assert (h100.num_ranks, h100.ranks_per_node, h100.crosses_nodes) == (2, 1, True)
    assert (gb200.num_ranks, gb200.ranks_per_node, gb200.crosses_nodes) == (2, 2, False)


def test_tp4_cp2_fits_one_node():
    """t 4: the CP pair is ranks 0 and 4, one node of 8."""
    group = cp_group(_scenario(tp=4), H100)
    assert (group.ranks_per_node, group.crosses_nodes) == (2, False)


def test_dp_stride_is_t_times_c_and_the_reduction_group_is_dp_times_cp():
    """DP ranks are t·c = 16 apart (one per node); the gradient group holds d·c = 8 ranks t
    apart (one per H100 node, 9 per NVL72 domain)."""
    s = _scenario()
    assert dp_group(s, H100) == GroupPlacement(num_ranks=4, ranks_per_node=1)
    assert dp_cp_group(s, H100) == GroupPlacement(num_ranks=8, ranks_per_node=1)
    assert dp_cp_group(s, GB200) == GroupPlacement(num_ranks=8, ranks_per_node=8)
    # c = 1: the reduction group is the DP group (results unchanged)
    plain = _scenario(cp=1)
    assert dp_cp_group(plain, H100) == dp_group(plain, H100)


def test_pipeline_neighbours_are_t_c_d_apart():
    s = _scenario()
    assert stages_share_node(s, GB200, 0, 1)  # rank 64 is in the first 72
    assert not stages_share_node(_scenario(dp=8), GB200, 0, 1)  # rank 128


def test_gradients_reduce_over_dp_times_cp_even_with_dp_1():
    """dp 1, cp 2: the CP pair still reduces its gradients (identical weights, different tokens)."""
    s = _scenario(dp=1)
    work = build_workload(s)
    stage = work.stages[0]
    transfer = StagePricing(H100).stage(s, work, stage).grad_reduce
    assert transfer is not None
    expected = collective_time_s(
        CollectiveKind.ALL_REDUCE,
        stage.dp_gradient_bytes,
        GroupPlacement(num_ranks=2, ranks_per_node=1),
        H100,
    )
    assert transfer.seconds == pytest.approx(expected)
    assert transfer.crosses_nodes
    alone = _scenario(dp=1, cp=1)
    assert StagePricing(H100).stage(alone, build_workload(alone), stage).grad_reduce is None


def test_distributed_optimizer_shards_over_dp_times_cp():
    """12 bytes of optimizer state per parameter over d·c = 8 ranks."""
    s = _scenario(dp=4, cp=2)
    s = s.model_copy(update={"training": s.training.model_copy(update={"use_distributed_optimizer": True})})
    stage = build_workload(s).stages[1]
    assert stage.static.optimizer_bytes == pytest.approx(12 * stage.num_params / 8)
    assert stage.static.gradient_bytes == pytest.approx(4 * stage.num_params)


def test_every_non_attention_op_runs_on_s_over_c():
    """cp 2 halves the layer's tokens, stored activations (SP + selective: 34·sbh/t, no s²
    term), SP collective messages, the embedding / output extras and the p2p message."""
    one, two = build_workload(_scenario(cp=1)), build_workload(_scenario(cp=2))
    assert layer_config(_scenario(cp=2)).tokens * 2 == layer_config(_scenario(cp=1)).tokens
    assert two.layer.saved_bytes * 2 == pytest.approx(one.layer.saved_bytes)
    assert two.layer.saved_bytes == pytest.approx(34 * (4096 / 2) * 1024 / 8)
    assert two.p2p_bytes * 2 == one.p2p_bytes
    for op_one, op_two in zip(one.layer.forward, two.layer.forward):
        if op_one.kind is OpKind.COLLECTIVE:
            assert op_two.message_bytes * 2 == op_one.message_bytes
    first_one, first_two = one.stages[0].chunks[0], two.stages[0].chunks[0]
    assert first_two.saved_bytes * 2 == pytest.approx(first_one.saved_bytes)
    # parameters do not change with cp
    assert two.stages[0].num_params == one.stages[0].num_params


def test_loader_refuses_cp_without_fused_attention():
    """Megatron-core's DotProductAttention asserts cp == 1 (TE attention only)."""
    data = yaml.safe_load(yaml.safe_dump(BASE))
    with pytest.raises(ConfigError) as caught:
        parse_scenario(data, "s.yaml")
    assert "parallel.cp: value 2: needs training.attention_backend flash" in str(caught.value)


def test_loader_refuses_a_cp_share_sequence_parallel_cannot_split():
    """s 4080 = 2·2·1020: the 2·cp chunks exist, but s/c = 2040 is not a multiple of t = 16."""
    data = yaml.safe_load(yaml.safe_dump(BASE))
    data["model"]["seq_length"] = 4080
    data["parallel"]["tp"] = 16
    with pytest.raises(ConfigError) as caught:
        parse_scenario(data, "s.yaml")
    assert "each context-parallel rank's 2040 tokens (seq_length / cp) must be divisible by tp (16)" in str(
        caught.value
    )
