"""Stage pricing (`costs.stage_pricing`): caches keyed by value, a chunk of several layer
kinds priced as the sum of its segments, and a stage's messages as the transfer functions
price them."""

from dataclasses import replace

from simcluster.config import load_hardware, parse_scenario
from simcluster.config.choices import CudaGraphImpl, Dtype
from simcluster.costs.breakdown import TimeKind
from simcluster.costs.host import chunk_kernels
from simcluster.costs.placement import dp_cp_group, tp_group
from simcluster.costs.stage_pricing import StagePricing, pricing_layout
from simcluster.costs.stage_transfers import (
    bucket_seconds,
    dp_bucket_counts,
    grad_reduce_seconds,
    p2p_seconds,
)
from simcluster.workload.context_parallel import context_parallel_layer_ops
from simcluster.workload.embedding import embedding_ops, output_ops
from simcluster.workload.layer import layer_ops, layer_ops_16bit
from simcluster.workload.model import ChunkWork, LayerKind, LayerSegment, build_workload
from simcluster.workload.ops import CollectiveKind
from tests.modern_cases import llama3_8b

H100 = load_hardware("h100-sxm5-80gb")
SMALL = llama3_8b(
    model={"num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16, "num_query_groups": 8,
           "ffn_hidden_size": 3584, "seq_length": 1024, "vocab_size": 32000},
    parallel={"tp": 2, "pp": 2, "dp": 2, "sequence_parallel": True},
    training={"global_batch_size": 16, "use_distributed_optimizer": True, "overlap_grad_reduce": True},
)  # fmt: skip


def _scenario(**parallel):
    return parse_scenario({**SMALL, "parallel": {**SMALL["parallel"], **parallel}}, "s.yaml")


def _fresh_workload(scenario):
    """The workload built from new op objects (the op builders' caches emptied first)."""
    for builder in (layer_ops, layer_ops_16bit, context_parallel_layer_ops, embedding_ops, output_ops):
        builder.cache_clear()
    return build_workload(scenario)


def test_equal_chunks_of_different_objects_share_one_price():
    """The cache is keyed by value: two workloads built from distinct (equal) op objects hit
    the same entry; another layout does not."""
    scenario = _scenario()
    first, second = _fresh_workload(scenario), _fresh_workload(scenario)
    chunk_a, chunk_b = first.stages[0].chunks[0], second.stages[0].chunks[0]
    assert chunk_a.segments[0].layer is not chunk_b.segments[0].layer
    assert chunk_a.embedding is not chunk_b.embedding
    pricing, layout = StagePricing(H100), pricing_layout(scenario, H100)
    assert pricing.chunk(chunk_a, layout) is pricing.chunk(chunk_b, layout)
    overlapped = replace(layout, tp_comm_overlap=True)
    assert pricing.chunk(chunk_a, overlapped) != pricing.chunk(chunk_a, layout)


def test_a_chunk_of_two_layer_kinds_is_the_sum_of_its_segments():
    """Two layers of one kind then one of a wider MLP: forward, backward and recompute
    seconds, saved bytes, kernels issued and the split by kind add segment by segment."""
    scenario = _scenario()
    workload = build_workload(scenario)
    (dense,) = workload.stages[1].chunks[0].segments
    wide_config = replace(dense.kind.config, ffn_hidden_size=2 * dense.kind.config.ffn_hidden_size)
    wide = LayerSegment(LayerKind(wide_config, 1), layer_ops(wide_config), 1)
    chunk = ChunkWork(1, 0, (replace(dense, num_layers=2), wide), embedding=None, output=None)
    pricing, layout = StagePricing(H100), pricing_layout(scenario, H100)
    one, other = pricing.segment(dense, layout), pricing.segment(wide, layout)
    priced = pricing.chunk(chunk, layout).cost
    for part in ("forward", "backward", "recompute"):
        a, b = getattr(one, part), getattr(other, part)
        assert getattr(priced, part).compute_s == 2 * a.compute_s + b.compute_s
        assert getattr(priced, part).comm_s == 2 * a.comm_s + b.comm_s
    assert other.forward.compute_s > one.forward.compute_s  # the wider MLP costs more
    assert chunk.num_layers == 3
    assert chunk.saved_bytes == 2 * dense.layer.saved_bytes + wide.layer.saved_bytes
    kernels = chunk_kernels(chunk, Dtype.BF16, CudaGraphImpl.NONE, amax=False)
    assert kernels[0] == 2 * len(dense.layer.forward) + len(wide.layer.forward)
    split = pricing.chunk_split(chunk, layout)
    one_split = pricing.layer_split(dense.kind, dense.layer, layout)
    other_split = pricing.layer_split(wide.kind, wide.layer, layout)
    assert split[TimeKind.GEMM] == 2 * one_split[TimeKind.GEMM] + other_split[TimeKind.GEMM]


def test_stage_messages_are_the_transfer_functions_prices():
    """Sends, the DP reduction, its buckets and the parameter gather: the values of
    `costs.stage_transfers` for the stage's bytes and groups, inside or across nodes."""
    scenario = _scenario()
    workload = build_workload(scenario)
    stage = workload.stages[0]
    priced = StagePricing(H100).stage(scenario, workload, stage)
    tp, group = tp_group(scenario, H100), dp_cp_group(scenario, H100)
    # tp 2 · dp 2 = 4 ranks per stage: stages 0 and 1 share an 8-GPU node
    assert priced.send_forward is not None and not priced.send_forward.crosses_nodes
    assert priced.send_forward.seconds == p2p_seconds(H100, True, workload.p2p_bytes, tp, gather=False)
    assert priced.grad_reduce is not None
    assert priced.grad_reduce.seconds == grad_reduce_seconds(H100, group, stage.dp_gradient_bytes, True)
    counts = dp_bucket_counts(scenario, stage)
    assert priced.grad_buckets == bucket_seconds(
        H100, CollectiveKind.REDUCE_SCATTER, stage.dp_gradient_bytes, counts, group
    )
    assert priced.param_gather is not None and not priced.param_gather.overlapped
    assert priced.tied_grad_reduce is None  # Llama's output layer is untied


def test_pipeline_sends_leave_the_node_on_the_nic():
    """tp 2 · dp 4 = 8 ranks per stage: the next stage sits on the next node."""
    scenario = _scenario(dp=4)
    workload = build_workload(scenario)
    priced = StagePricing(H100).stage(scenario, workload, workload.stages[0])
    assert priced.send_forward is not None and priced.send_forward.crosses_nodes
