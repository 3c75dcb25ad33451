"""Each stage's (and chunk's) time, parameters and memory follow its own layer count under
Megatron-core's uneven pipeline splits; the default split is unchanged."""

import pytest

from simcluster.config import load_hardware, parse_scenario
from simcluster.costs.chunk import price_layer_ops
from simcluster.costs.placement import tp_group
from simcluster.memory_plan import memory_report, stage_memory_estimate
from simcluster.simulation import build_plan
from simcluster.workload.model import build_workload, layer_params_per_rank

HW = load_hardware("a100-sxm4-80gb")
# the GPU's prices per stage: these small layers would otherwise wait for the host (costs.host)
HW = HW.model_copy(update={"compute": HW.compute.model_copy(update={"host_issue_us_per_op": None})})


def _scenario(num_layers: int, global_batch_size: int = 8, **parallel):
    return parse_scenario(
        {
            "hardware": "a100-sxm4-80gb",
            "model": {
                "num_layers": num_layers,
                "hidden_size": 1024,
                "num_attention_heads": 16,
                "seq_length": 512,
                "vocab_size": 32000,
            },
            "parallel": {"tp": 2, "sequence_parallel": True, **parallel},
            "training": {
                "micro_batch_size": 1,
                "global_batch_size": global_batch_size,
                "recompute": "selective",
            },
        },
        "s.yaml",
    )


def test_explicit_first_stage_sizes_every_stage():
    """L 14, p 4, F 2: stages build 2, 4, 4, 4 layers; params, forward time and stored bytes
    per microbatch follow (stage 0 also carries the embedding, stage 3 the output layer)."""
    scenario = _scenario(14, pp=4, first_pipeline_num_layers=2)
    work = build_workload(scenario)
    assert [stage.chunks[0].num_layers for stage in work.stages] == [2, 4, 4, 4]
    per_layer = layer_params_per_rank(1024, 4096, 2)
    assert work.stages[1].num_params == pytest.approx(4 * per_layer)
    assert work.stages[2].num_params == pytest.approx(4 * per_layer)
    embedding = work.stages[0].num_params - 2 * per_layer
    assert embedding == pytest.approx(32000 * 1024 / 2 + 512 * 1024)  # word (vocab already /128·t) + position
    (segment,) = work.stages[1].chunks[0].segments
    layer = segment.layer
    assert work.stages[1].chunks[0].saved_bytes == 4 * layer.saved_bytes
    assert work.stages[0].chunks[0].layer_saved_bytes == 2 * layer.saved_bytes

    plan = build_plan(scenario, HW, work)
    layer_s = price_layer_ops(layer, HW, tp_group(scenario, HW), scenario.training.dtype).forward_s
    assert plan.stages[1].forward[0].busy_s == pytest.approx(4 * layer_s)
    embedding_s = price_layer_ops(
        work.stages[0].chunks[0].embedding, HW, tp_group(scenario, HW), scenario.training.dtype
    ).forward_s
    assert plan.stages[0].forward[0].busy_s == pytest.approx(2 * layer_s + embedding_s)


def test_account_for_flags_shrink_the_end_chunks():
    """L 14, p 4, v 2, both flags: 16 slots, 2 per chunk; rank 0's first chunk builds 1 (plus
    the embedding), rank 3's last chunk 1 (plus the loss). Memory: rank 0 stores less per
    microbatch of chunk 0 than rank 1 does."""
    scenario = _scenario(
        14,
        global_batch_size=8,
        pp=4,
        vpp=2,
        account_for_embedding_in_pipeline_split=True,
        account_for_loss_in_pipeline_split=True,
    )
    work = build_workload(scenario)
    assert [[chunk.num_layers for chunk in stage.chunks] for stage in work.stages] == [
        [1, 2],
        [2, 2],
        [2, 2],
        [2, 1],
    ]
    layer = work.layer
    assert work.stages[0].chunks[0].layer_saved_bytes == layer.saved_bytes
    assert work.stages[3].chunks[1].layer_saved_bytes == layer.saved_bytes
    report = memory_report(scenario, HW)
    assert report.stage_num_layers == (3, 4, 4, 3)
    assert report.layers_per_stage == 3
    per_stage = layer_params_per_rank(1024, 4096, 2)
    assert work.stages[1].num_params == pytest.approx(4 * per_stage)


def test_engine_memory_matches_the_estimate_with_uneven_chunks():
    """The engine's tracker and the replay agree when chunks differ in size."""
    from simcluster.simulation import run_simulation

    scenario = _scenario(14, pp=4, first_pipeline_num_layers=2)
    sim = run_simulation(scenario, HW)
    estimate = stage_memory_estimate(scenario, HW)
    assert [s.peak_memory_bytes for s in sim.result.stages] == pytest.approx(
        [s.peak_memory_bytes for s in estimate]
    )
    # stage 0 keeps 4 microbatches of 2 layers (+ embedding), stage 1 three of 4 layers
    assert sim.result.stages[0].activation_bytes < sim.result.stages[1].activation_bytes


def test_default_split_chunks_are_the_even_ones():
    scenario = _scenario(16, pp=4, vpp=2)
    assert all(chunk.num_layers == 2 for stage in build_workload(scenario).stages for chunk in stage.chunks)
