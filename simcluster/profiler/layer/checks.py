"""Does the sharded layer compute what the serial layer computes? (Figures 4-5 are exact.)

`compare_with_serial(comm, specs)` runs, on this rank, the sharded layer and the serial
(t = 1, no recompute) layer built from the same seeded weights, with the same input and
upstream gradient, and reports the largest relative error of the output, the input gradient
and every parameter gradient. Dropout is exact too: `SlicedMasks` makes every rank draw the
full serial mask of each dropout site from a generator seeded by (seed, site) and keep its
own slice (its heads for the attention probabilities, its sequence rows under SP).

Run it on every rank of a process group (`launch.run_distributed`) or alone with a
`ShardStandInComm(1)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from simcluster.config.choices import Recompute
from simcluster.profiler.layer.parallel import (
    Comm,
    copy_to_tensor_parallel,
    gather_from_sequence_parallel,
    reduce_from_tensor_parallel,
    reduce_scatter_to_sequence_parallel,
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


def compare_with_serial(comm: Comm, specs: Sequence[LayerSpec], seed: int = 0
                        ) -> list[Comparison]:
    """One `Comparison` per spec (each spec's tp must equal comm.world_size)."""
    return [_compare(comm, spec, seed) for spec in specs]


def _compare(comm: Comm, spec: LayerSpec, seed: int) -> Comparison:
    reference = replace(spec.serial(), recompute=Recompute.NONE)
    ref_out, ref_dx, ref_grads = _forward_backward(
        serial_layer(reference, seed), layer_input(reference, seed),
        layer_input(reference, seed + 1))
    out, dx, grads = _forward_backward(
        sharded_layer(spec, comm, seed), layer_input(spec, seed, comm.rank),
        layer_input(spec, seed + 1, comm.rank))
    if spec.sequence_parallel:  # replicated params saw s/t tokens: sum their grads
        grads = {n: comm.all_reduce(g.clone()) if n in REPLICATED else g
                 for n, g in grads.items()}
    expected = shard(ref_grads, spec, comm.rank)
    errors = {"output": _rel_error(out, _local_rows(ref_out, spec, comm.rank)),
              "input_grad": _rel_error(dx, _local_rows(ref_dx, spec, comm.rank))}
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
        "g": (gather_from_sequence_parallel, every[r], every_long[r], torch.cat(every),
              total_long.chunk(t)[r]),
        "g_bar": (reduce_scatter_to_sequence_parallel, every_long[r], every[r],
                  total_long.chunk(t)[r], torch.cat(every)),
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


def self_check(comm: Comm, specs: Sequence[LayerSpec]
               ) -> tuple[dict[str, float], list[Comparison]]:
    """`check_operators` and `compare_with_serial` in one go (one process group)."""
    return check_operators(comm), compare_with_serial(comm, specs)


def _forward_backward(layer: ParallelTransformerLayer, x: Tensor, grad_out: Tensor
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


def _local_rows(full: Tensor, spec: LayerSpec, rank: int) -> Tensor:
    """This rank's sequence rows of a serial [s, b, h] tensor (all of them without SP)."""
    start = rank * spec.local_seq_length if spec.sequence_parallel else 0
    return full.narrow(0, start, spec.local_seq_length)


def _rel_error(actual: Tensor, expected: Tensor) -> float:
    if actual.shape != expected.shape:
        raise ValueError(f"shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    scale = expected.abs().max().clamp_min(torch.finfo(expected.dtype).tiny)
    return float((actual - expected).abs().max() / scale)
