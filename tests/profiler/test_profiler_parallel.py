"""The sharded layer equals the serial layer (Figures 4-5), on real gloo process groups.

One process group per world size; every (recompute, SP) configuration runs inside it.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from simcluster.config.choices import Dtype, Recompute
from simcluster.profiler.bench.launch import run_distributed
from simcluster.profiler.layer.checks import compare_with_serial, self_check
from simcluster.profiler.layer.ops import LocalMasks
from simcluster.profiler.layer.parallel import ShardStandInComm, column_parallel_linear
from simcluster.profiler.layer.spec import LayerSpec
from simcluster.profiler.layer.transformer import layer_input, serial_layer, sharded_layer

RTOL = 1e-5  # fp32, max |sharded - serial| / max |serial|


def _specs(tp: int) -> list[LayerSpec]:
    """Every recompute mode x SP on/off, fp32, dropout on; odd s and b, a divisible by t."""
    sps = (False,) if tp == 1 else (False, True)
    return [LayerSpec(hidden_size=96, num_attention_heads=12, seq_length=40,
                      micro_batch_size=3, tp=tp, sequence_parallel=sp, recompute=recompute,
                      dtype=Dtype.FP32, dropout_prob=0.1)
            for recompute, sp in itertools.product(Recompute, sps)]


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
    bad = [(c.rank, c.spec.recompute.value, c.spec.sequence_parallel, c.worst)
           for c in comparisons if c.worst > RTOL]
    assert not bad


def test_serial_layer_with_recompute_matches_without() -> None:
    """t = 1: selective and full recompute change memory, not results."""
    comparisons = compare_with_serial(ShardStandInComm(1), _specs(1))
    assert [c.spec.recompute for c in comparisons] == list(Recompute)
    assert max(c.worst for c in comparisons) <= RTOL


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
