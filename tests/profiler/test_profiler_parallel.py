"""The sharded layer equals the serial layer (Figures 4-5), on real gloo process groups.

One process group per world size; every (recompute, SP) configuration runs inside it.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from simcluster.config.choices import (
    Activation,
    AttentionBackend,
    Dtype,
    Normalization,
    PositionEmbedding,
    Recompute,
)
from simcluster.profiler.bench.launch import run_distributed
from simcluster.profiler.layer.checks import compare_with_serial, self_check
from simcluster.profiler.layer.ops import LocalMasks
from simcluster.profiler.layer.parallel import ShardStandInComm, column_parallel_linear
from simcluster.profiler.layer.spec import LayerSpec
from simcluster.profiler.layer.transformer import layer_input, serial_layer, sharded_layer
from simcluster.profiler.layer.weights import serial_weights, shard

RTOL = 1e-5  # fp32, max |sharded - serial| / max |serial|


# The modern options one at a time, and all together (g = 4: one or two groups of three
# heads per rank at t = 4 or 2, so GQA's query reshape is both a view and a copy).
MODERN = {
    "gqa": {"num_query_groups": 4},
    "swiglu": {"activation": Activation.SWIGLU},
    "squared_relu": {"activation": Activation.SQUARED_RELU},
    "rmsnorm": {"normalization": Normalization.RMSNORM},
    "rope": {"position_embedding": PositionEmbedding.ROPE},
    "flash": {"attention_backend": AttentionBackend.FLASH},
}
LLAMA = {k: v for options in MODERN.values() for k, v in options.items() if k != "activation"} | {
    "activation": Activation.SWIGLU
}


def _specs(tp: int) -> list[LayerSpec]:
    """Every recompute mode x SP on/off, fp32, dropout on; odd s and b, a divisible by t.
    Then each modern option alone (no recompute, SP when t > 1) and the Llama-style mix in
    every recompute mode x SP."""
    sps = (False,) if tp == 1 else (False, True)

    def spec(recompute: Recompute, sp: bool, **options: object) -> LayerSpec:
        return LayerSpec(
            hidden_size=96,
            num_attention_heads=12,
            seq_length=40,
            micro_batch_size=3,
            tp=tp,
            sequence_parallel=sp,
            recompute=recompute,
            dtype=Dtype.FP32,
            dropout_prob=0.1,
            **options,
        )

    return (
        [spec(recompute, sp) for recompute, sp in itertools.product(Recompute, sps)]
        + [spec(Recompute.NONE, sps[-1], **options) for options in MODERN.values()]
        + [spec(recompute, sp, **LLAMA) for recompute, sp in itertools.product(Recompute, sps)]
    )


@pytest.fixture(scope="module", params=[2, 4], ids=lambda t: f"t={t}")
def group(request: pytest.FixtureRequest) -> tuple[int, list]:
    """(t, per-rank (operator errors, layer comparisons)) from one gloo group of size t."""
    return request.param, run_distributed(self_check, request.param, _specs(request.param))


def test_conjugate_operators_match_their_definitions(group: tuple[int, list]) -> None:
    """f, f̄, g, ḡ forward and backward equal all-reduce / all-gather / reduce-scatter."""
    _, results = group
    for operator_errors, _ in results:
        assert max(operator_errors.values()) == 0.0, operator_errors


def test_sharded_layer_matches_serial(group: tuple[int, list]) -> None:
    """Output, input grad and every parameter grad match, every rank and configuration."""
    t, results = group
    comparisons = [c for _, per_rank in results for c in per_rank]
    assert len(comparisons) == t * len(_specs(t))
    bad = [
        (c.rank, c.spec.recompute.value, c.spec.sequence_parallel, c.worst)
        for c in comparisons
        if c.worst > RTOL
    ]
    assert not bad


def test_serial_layer_with_recompute_matches_without() -> None:
    """t = 1: selective and full recompute change memory, not results."""
    comparisons = compare_with_serial(ShardStandInComm(1), _specs(1))
    assert [c.spec.recompute for c in comparisons[:3]] == list(Recompute)
    assert max(c.worst for c in comparisons) <= RTOL


def test_comparison_detects_a_wrong_swiglu_shard() -> None:
    """The check is sensitive to SwiGLU's stride-2 sharding: slicing fc1 in plain contiguous
    blocks (rank 0 all gate, rank 1 all up) gives wrong outputs."""
    spec = LayerSpec(96, 12, 40, 3, tp=2, dtype=Dtype.FP32, dropout_prob=0.0, activation=Activation.SWIGLU)
    weights = serial_weights(spec.serial(), 0)
    stride2 = shard(weights, spec, 0)
    plain = weights["fc1_weight"].chunk(2, dim=0)[0]
    assert stride2["fc1_weight"].shape == plain.shape
    assert not torch.equal(stride2["fc1_weight"], plain)
    gate, up = weights["fc1_weight"].chunk(2, dim=0)
    assert torch.equal(stride2["fc1_weight"], torch.cat([gate[:192], up[:192]]))


def test_flash_matches_unfused_attention() -> None:
    """scaled_dot_product_attention (causal, GQA native) computes what the paper's unfused
    core computes (no dropout), RoPE and GQA included."""
    options = {"num_query_groups": 4, "position_embedding": PositionEmbedding.ROPE}
    unfused = LayerSpec(96, 12, 40, 3, dtype=Dtype.FP32, dropout_prob=0.0, **options)
    flash = replace(unfused, attention_backend=AttentionBackend.FLASH)
    x = layer_input(unfused, seed=0)
    expected = serial_layer(unfused, seed=0)(x)
    assert (serial_layer(flash, seed=0)(x) - expected).abs().max() <= RTOL * expected.abs().max()


def test_comparison_detects_different_dropout_masks() -> None:
    """The check is sensitive: other masks than the serial layer's give a large error."""
    spec = _specs(1)[0]
    x = layer_input(spec, seed=0)
    exact = serial_layer(spec, seed=0)(x)
    other = sharded_layer(spec, ShardStandInComm(1), seed=0, masks=LocalMasks())(x)
    assert (exact - other).abs().max() > 1e-2 * exact.abs().max()
    assert torch.equal(exact, serial_layer(spec, seed=0)(x))


def test_stand_in_comm_has_shard_shapes() -> None:
    """Stand-in collectives: identity all-reduce, t-fold gather, first-slice scatter (a copy)."""
    comm = ShardStandInComm(4)
    x = torch.arange(24.0).view(8, 3)
    assert comm.all_reduce(x) is x
    assert torch.equal(comm.all_gather(x[:2]), x[:2].repeat(4, 1))
    scattered = comm.reduce_scatter(x)
    assert torch.equal(scattered, x[:2])
    assert scattered.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_sequence_parallel_linear_saves_only_the_shard() -> None:
    """Column-parallel GEMM with SP keeps the [s/t, b, h] input, not the gathered one."""
    comm = ShardStandInComm(4)
    x = torch.randn(2, 3, 8, requires_grad=True)  # s/t = 2 of s = 8
    weight = torch.nn.Parameter(torch.randn(6, 8))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = column_parallel_linear(x * 1.0, weight, None, comm, sequence_parallel=True)
    assert out.shape == (8, 3, 6)
    assert sorted(tuple(t.shape) for t in saved) == [(2, 3, 8), (6, 8)]


def test_layer_rejects_mismatched_comm() -> None:
    """A layer for t = 2 refuses a one-rank comm."""
    spec = replace(_specs(1)[0], tp=2)
    with pytest.raises(ValueError, match="world_size"):
        sharded_layer(spec, ShardStandInComm(1))
