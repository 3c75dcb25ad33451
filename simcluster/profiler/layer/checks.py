"""Does the sharded layer compute what the serial layer computes? (Figures 4-5 are exact.)

`compare_with_serial(comm, specs)` runs, on this rank, the sharded layer and the serial
(t = 1, no recompute) layer built from the same seeded weights, with the same input and
upstream gradient, and reports the largest relative error of the output, the input gradient
and every parameter gradient. Dropout is exact too: `SlicedMasks` makes every rank draw the
full serial mask of each dropout site from a generator seeded by (seed, site) and keep its
own slice (its heads for the attention probabilities, its sequence rows under SP).

Run it on every rank of a process group (`launch.run_distributed`) or alone with a
`ShardStandInComm(1)`. With context parallelism, `compare_with_serial_cp` splits the world
into tp × cp (× dp replicas) groups in Megatron's tp-cp-dp order and compares each cp rank's
two sequence chunks; parameter gradients are summed over the cp group first, as Megatron's
DP × CP gradient reduction does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from simcluster.config.choices import Recompute
from simcluster.profiler.layer.context_parallel import local_rows
from simcluster.profiler.layer.parallel import (
    Comm,
    ShardStandInComm,
    copy_to_tensor_parallel,
    gather_from_sequence_parallel,
    reduce_from_tensor_parallel,
    reduce_scatter_to_sequence_parallel,
    tp_cp_comms,
)
from simcluster.profiler.layer.spec import LayerSpec
from simcluster.profiler.layer.transformer import (
    ParallelTransformerLayer,
    layer_input,
    serial_layer,
    sharded_layer,
)
from simcluster.profiler.layer.weights import REPLICATED, shard


@dataclass(frozen=True)
class Comparison:
    """Max relative error (max |sharded − serial| / max |serial|) per quantity on one rank."""

    spec: LayerSpec
    rank: int
    rel_errors: dict[str, float]

    @property
    def worst(self) -> float:
        return max(self.rel_errors.values())


def compare_with_serial(comm: Comm, specs: Sequence[LayerSpec], seed: int = 0) -> list[Comparison]:
    """One `Comparison` per spec (each spec's tp must equal comm.world_size)."""
    return [_compare(comm, spec, seed) for spec in specs]


def compare_with_serial_cp(world: Comm, specs: Sequence[LayerSpec], seed: int = 0) -> list[Comparison]:
    """`compare_with_serial` for specs with context parallelism: each spec's tp·cp must
    divide world.world_size (the rest are data-parallel replicas). Comparison.rank is the
    world rank."""
    results = []
    for spec in specs:
        comm, cp_comm = tp_cp_comms(world, spec.tp, spec.cp)
        comparison = _compare(comm, spec, seed, cp_comm)
        results.append(replace(comparison, rank=world.rank))
    return results


def _compare(comm: Comm, spec: LayerSpec, seed: int, cp_comm: Comm | None = None) -> Comparison:
    cp_comm = cp_comm or ShardStandInComm(1)
    reference = replace(spec.serial(), recompute=Recompute.NONE)
    ref_out, ref_dx, ref_grads = _forward_backward(
        serial_layer(reference, seed), layer_input(reference, seed), layer_input(reference, seed + 1)
    )
    out, dx, grads = _forward_backward(
        sharded_layer(spec, comm, seed, cp_comm=cp_comm),
        layer_input(spec, seed, comm.rank, cp_rank=cp_comm.rank),
        layer_input(spec, seed + 1, comm.rank, cp_rank=cp_comm.rank),
    )
    if spec.sequence_parallel:  # replicated params saw s/t tokens: sum their grads
        grads = {n: comm.all_reduce(g.clone()) if n in REPLICATED else g for n, g in grads.items()}
    if spec.cp > 1:  # every param saw s/c tokens: sum over the cp group
        grads = {n: cp_comm.all_reduce(g.clone()) for n, g in grads.items()}
    expected = shard(ref_grads, spec, comm.rank)
    rows = {"tp_rank": comm.rank, "cp_rank": cp_comm.rank}
    errors = {
        "output": _rel_error(out, _local_rows(ref_out, spec, **rows)),
        "input_grad": _rel_error(dx, _local_rows(ref_dx, spec, **rows)),
    }
    errors.update({f"grad/{n}": _rel_error(grads[n], expected[n]) for n in grads})
    return Comparison(spec, comm.rank, errors)


def check_operators(comm: Comm) -> dict[str, float]:
    """Max abs error of f, f̄, g, ḡ (forward and backward) against their definitions.

    Rank r feeds `_rank_tensor(r, rows)`; every rank can compute every other rank's input,
    hence the expected all-reduce / all-gather / reduce-scatter results (Figures 4-5).
    """
    t, r = comm.world_size, comm.rank
    every = [_rank_tensor(q, 2) for q in range(t)]
    total = torch.stack(every).sum(dim=0)
    every_long = [_rank_tensor(q, 2 * t) for q in range(t)]
    total_long = torch.stack(every_long).sum(dim=0)
    cases = {
        # name: (op, input, upstream grad, expected output, expected input grad)
        "f": (copy_to_tensor_parallel, every[r], every[r], every[r], total),
        "f_bar": (reduce_from_tensor_parallel, every[r], every[r], total, every[r]),
        "g": (
            gather_from_sequence_parallel,
            every[r],
            every_long[r],
            torch.cat(every),
            total_long.chunk(t)[r],
        ),
        "g_bar": (
            reduce_scatter_to_sequence_parallel,
            every_long[r],
            every[r],
            total_long.chunk(t)[r],
            torch.cat(every),
        ),
    }
    errors = {}
    for name, (op, x, grad, want_out, want_grad) in cases.items():
        leaf = x.clone().requires_grad_()
        out = op(leaf * 1.0, comm)  # a non-leaf input: collectives may work in place
        out.backward(grad.clone())
        errors[f"{name}/forward"] = float((out.detach() - want_out).abs().max())
        errors[f"{name}/backward"] = float((_grad(leaf) - want_grad).abs().max())
    return errors


def _rank_tensor(rank: int, rows: int) -> Tensor:
    """A [rows, 3] tensor that differs by rank: values rank·100 + 0, 1, 2, ..."""
    return torch.arange(rows * 3, dtype=torch.float32).view(rows, 3) + 100.0 * rank


def self_check(comm: Comm, specs: Sequence[LayerSpec]) -> tuple[dict[str, float], list[Comparison]]:
    """`check_operators` and `compare_with_serial` in one go (one process group)."""
    return check_operators(comm), compare_with_serial(comm, specs)


def _forward_backward(
    layer: ParallelTransformerLayer, x: Tensor, grad_out: Tensor
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    x.requires_grad_()
    out = layer(x)
    out.backward(grad_out)
    grads = {name: _grad(param) for name, param in layer.named_parameters()}
    return out.detach(), _grad(x), grads


def _grad(leaf: Tensor) -> Tensor:
    if leaf.grad is None:
        raise RuntimeError("backward produced no gradient for a leaf that requires one")
    return leaf.grad


def _local_rows(full: Tensor, spec: LayerSpec, tp_rank: int, cp_rank: int = 0) -> Tensor:
    """This rank's sequence rows of a serial [s, b, h] tensor: its cp chunks, then its SP
    slice of them (all of them without SP)."""
    chunks = local_rows(full, spec.cp, cp_rank)
    start = tp_rank * spec.local_seq_length if spec.sequence_parallel else 0
    return chunks.narrow(0, start, spec.local_seq_length)


def _rel_error(actual: Tensor, expected: Tensor) -> float:
    if actual.shape != expected.shape:
        raise ValueError(f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    scale = expected.abs().max().clamp_min(torch.finfo(expected.dtype).tiny)
    return float((actual - expected).abs().max() / scale)
