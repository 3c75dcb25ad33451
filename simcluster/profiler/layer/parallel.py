"""Tensor- and sequence-parallel communication as autograd functions (Figures 4 and 5).

Korthikanti et al. name four conjugate operators. Without sequence parallelism (Figure 4):

    f   identity in forward,   all-reduce in backward   (enters a tensor-parallel region)
    f̄   all-reduce in forward, identity in backward     (leaves it)

With sequence parallelism (Figure 5) the layer-norm/dropout regions hold s/t of the sequence:

    g   all-gather along the sequence in forward,  reduce-scatter in backward
    ḡ   reduce-scatter along the sequence in forward, all-gather in backward

All of them talk through a small `Comm`: `DistributedComm` wraps a torch.distributed process
group (gloo on CPU, NCCL on GPU); `ShardStandInComm` lets one process play rank 0 with the
right shard shapes (all-reduce = identity, all-gather = t copies, reduce-scatter = first 1/t,
ring shift = a copy), which is what a single-GPU timing or memory run needs. The sequence is
dim 0 ([s, b, h]). A context-parallel layer holds a second `Comm` over its cp group, used only
for the K/V ring's `shift` (`context_parallel`).

`column_parallel_linear(..., sequence_parallel=True)` is Megatron's
LinearWithGradAccumulationAndAsyncCommunication without the overlap: it all-gathers the
sequence-sharded input in forward, saves only the shard (2sbh/t bytes) and gathers it again
in backward, which is what lets Table 2's "tensor + sequence parallel" row divide the
column-parallel inputs (QKV and fc1) by t.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

# torch >= 2.13 renames the single-tensor collectives (the old names warn).
_ALL_GATHER_SINGLE = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER_SINGLE = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Comm(Protocol):
    """Collectives over the tensor-parallel group, along dim 0 (the sequence)."""

    @property
    def world_size(self) -> int: ...

    @property
    def rank(self) -> int: ...

    def all_reduce(self, x: Tensor) -> Tensor:
        """Sum over ranks; may reuse `x`'s memory, as Megatron's in-place all-reduce does."""
        ...

    def all_gather(self, x: Tensor) -> Tensor:
        """Concatenate every rank's `x` along dim 0: [s/t, ...] -> [s, ...]."""
        ...

    def reduce_scatter(self, x: Tensor) -> Tensor:
        """Sum over ranks and keep this rank's 1/t slice of dim 0: [s, ...] -> [s/t, ...]."""
        ...

    def shift(self, x: Tensor, offset: int) -> Tensor:
        """Send `x` to rank + offset and return (a new tensor) what rank − offset sent, ranks
        modulo world_size: one step of context parallelism's K/V ring (TE
        `flash_attn_p2p_communicate`, batched isend/irecv)."""
        ...


class DistributedComm:
    """`Comm` over a torch.distributed process group (default: the world)."""

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    def all_reduce(self, x: Tensor) -> Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: Tensor) -> Tensor:
        x = x.contiguous()
        out = x.new_empty((x.shape[0] * self.world_size, *x.shape[1:]))
        _ALL_GATHER_SINGLE(out, x, group=self.group)
        return out

    def reduce_scatter(self, x: Tensor) -> Tensor:
        t = self.world_size
        if x.shape[0] % t:
            raise ValueError(f"reduce_scatter: dim 0 of size {x.shape[0]} not divisible by {t}")
        if dist.get_backend(self.group) == "nccl":
            x = x.contiguous()
            out = x.new_empty((x.shape[0] // t, *x.shape[1:]))
            _REDUCE_SCATTER_SINGLE(out, x, group=self.group)
            return out
        # gloo has no reduce-scatter: all-reduce a copy, then keep this rank's slice (a copy).
        summed = torch.clone(x, memory_format=torch.contiguous_format)
        dist.all_reduce(summed, group=self.group)
        return summed.chunk(t, dim=0)[self.rank].clone()

    def shift(self, x: Tensor, offset: int) -> Tensor:
        n, r = self.world_size, self.rank
        x = x.contiguous()
        out = torch.empty_like(x)
        if n == 1:
            return out.copy_(x)
        # P2POp takes global ranks; the group's ranks are mapped through the group.
        dst, src = ((r + offset) % n, (r - offset) % n)
        if self.group is not None:
            dst, src = dist.get_global_rank(self.group, dst), dist.get_global_rank(self.group, src)
        ops = [dist.P2POp(dist.isend, x, dst, self.group), dist.P2POp(dist.irecv, out, src, self.group)]
        for request in dist.batch_isend_irecv(ops if r % 2 == 0 else ops[::-1]):
            request.wait()
        return out


class ShardStandInComm:
    """One process standing in for `rank` of a `world_size` group: shapes right, values not.

    all-reduce returns its input (this rank's partial sum), all-gather concatenates t copies
    of the local shard, reduce-scatter keeps a copy of the first 1/t slice, shift returns a
    copy. Good for timing kernels and measuring memory at per-rank shard shapes on one device
    (paper, Table 4).
    """

    def __init__(self, world_size: int, rank: int = 0) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"need world_size >= 1 and 0 <= rank < world_size, got world_size={world_size}, rank={rank}"
            )
        self._world_size = world_size
        self._rank = rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def rank(self) -> int:
        return self._rank

    def all_reduce(self, x: Tensor) -> Tensor:
        return x

    def all_gather(self, x: Tensor) -> Tensor:
        if self._world_size == 1:
            return x
        return torch.cat([x] * self._world_size, dim=0)

    def reduce_scatter(self, x: Tensor) -> Tensor:
        t = self._world_size
        if x.shape[0] % t:
            raise ValueError(f"reduce_scatter: dim 0 of size {x.shape[0]} not divisible by {t}")
        if t == 1:
            return x
        return x[: x.shape[0] // t].clone()

    def shift(self, x: Tensor, offset: int) -> Tensor:
        """A copy of `x`: what arrives is a new buffer of the sender's shape, as on a ring."""
        return x.clone(memory_format=torch.contiguous_format)


_GROUPS: dict[tuple[int, int], tuple[Comm, Comm]] = {}


def tp_cp_comms(world: Comm, tp: int, cp: int) -> tuple[Comm, Comm]:
    """(tensor-parallel, context-parallel) comms of this process in a torch.distributed
    world of tp·cp·dp ranks, Megatron's tp-cp-dp order: global rank = tp_rank + tp·(cp_rank
    + cp·dp_rank), so TP groups are contiguous and CP groups have stride tp
    (`parallel_state.py::RankGenerator`).
    Every rank must call it with the same (tp, cp) in the same order (new_group is
    collective); groups are made once per process. A group of one is a `ShardStandInComm(1)`.
    """
    size = world.world_size
    if size % (tp * cp):
        raise ValueError(f"world of {size} ranks is not a multiple of tp·cp = {tp}·{cp}")
    if (tp, cp) not in _GROUPS:
        tp_comm: Comm = ShardStandInComm(1)
        cp_comm: Comm = ShardStandInComm(1)
        blocks = [
            [tp * (c + cp * d) + i for c in range(cp) for i in range(tp)] for d in range(size // (tp * cp))
        ]
        for block in blocks:  # the same new_group calls, in the same order, on every rank
            for members in [block[c * tp : (c + 1) * tp] for c in range(cp)] if tp > 1 else []:
                group = dist.new_group(members)
                if world.rank in members:
                    tp_comm = DistributedComm(group)
            for members in [block[i::tp] for i in range(tp)] if cp > 1 else []:
                group = dist.new_group(members)
                if world.rank in members:
                    cp_comm = DistributedComm(group)
        _GROUPS[(tp, cp)] = (tp_comm, cp_comm)
    return _GROUPS[(tp, cp)]


class _CopyToTensorParallel(torch.autograd.Function):
    """f: identity forward, all-reduce backward (Figure 4)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: Comm) -> Tensor:
        ctx.comm = comm
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return ctx.comm.all_reduce(grad), None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """f̄: all-reduce forward, identity backward (Figure 4)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: Comm) -> Tensor:
        out = comm.all_reduce(x)
        if out is x:  # reduced in place (Megatron does the same): tell autograd
            ctx.mark_dirty(x)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class _GatherFromSequenceParallel(torch.autograd.Function):
    """g: all-gather along the sequence forward, reduce-scatter backward (Figure 5)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: Comm) -> Tensor:
        ctx.comm = comm
        return comm.all_gather(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return ctx.comm.reduce_scatter(grad), None


class _ReduceScatterToSequenceParallel(torch.autograd.Function):
    """ḡ: reduce-scatter along the sequence forward, all-gather backward (Figure 5)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: Comm) -> Tensor:
        ctx.comm = comm
        return comm.reduce_scatter(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return ctx.comm.all_gather(grad), None


def copy_to_tensor_parallel(x: Tensor, comm: Comm) -> Tensor:
    """f (Figure 4)."""
    return _CopyToTensorParallel.apply(x, comm)


def reduce_from_tensor_parallel(x: Tensor, comm: Comm) -> Tensor:
    """f̄ (Figure 4)."""
    return _ReduceFromTensorParallel.apply(x, comm)


def gather_from_sequence_parallel(x: Tensor, comm: Comm) -> Tensor:
    """g (Figure 5)."""
    return _GatherFromSequenceParallel.apply(x, comm)


def reduce_scatter_to_sequence_parallel(x: Tensor, comm: Comm) -> Tensor:
    """ḡ (Figure 5)."""
    return _ReduceScatterToSequenceParallel.apply(x, comm)


class _Linear(torch.autograd.Function):
    """y = x Wᵀ (+ b) over the last dim; saves x (or only its sequence shard) and W.

    With `comm` given, x is this rank's sequence shard: forward all-gathers it (g) before the
    GEMM, backward all-gathers it again for the weight gradient and reduce-scatters the input
    gradient (ḡ's role), as in Megatron's sequence-parallel column linear.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, comm: Comm | None) -> Tensor:
        ctx.comm = comm
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight)
        total = x if comm is None else comm.all_gather(x)
        if bias is None:  # not a view, so f̄ may all-reduce it in place
            return torch.matmul(total, weight.t())
        out = torch.addmm(bias, total.reshape(-1, total.shape[-1]), weight.t())
        return out.view(*total.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor | None, None]:
        x, weight = ctx.saved_tensors
        total = x if ctx.comm is None else ctx.comm.all_gather(x)
        grad2d = grad.reshape(-1, grad.shape[-1])
        grad_input = (grad2d @ weight).view(*total.shape)
        if ctx.comm is not None:
            grad_input = ctx.comm.reduce_scatter(grad_input)
        grad_weight = grad2d.t() @ total.reshape(-1, total.shape[-1])
        grad_bias = grad2d.sum(dim=0) if ctx.has_bias else None
        return grad_input, grad_weight, grad_bias, None


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """A local GEMM that saves exactly its input and weight."""
    return _Linear.apply(x, weight, bias, None)


def column_parallel_linear(
    x: Tensor, weight: Tensor, bias: Tensor | None, comm: Comm, sequence_parallel: bool
) -> Tensor:
    """Column-parallel linear: weight holds this rank's output rows (W split by columns of Wᵀ).

    Without SP: f then the GEMM; the full input (2sbh bytes) is saved on every rank. With SP:
    g fused into the GEMM; only the [s/t, b, h] shard (2sbh/t bytes) is saved (Table 2).
    """
    if sequence_parallel:
        return _Linear.apply(x, weight, bias, comm)
    return linear(copy_to_tensor_parallel(x, comm), weight, bias)


def row_parallel_linear(x: Tensor, weight: Tensor, comm: Comm, sequence_parallel: bool) -> Tensor:
    """Row-parallel linear without bias: GEMM on the local slice of the input features, then
    f̄ (all-reduce) or, with SP, ḡ (reduce-scatter to [s/t, b, h]). The caller adds the bias
    once, after the reduction (Megatron's bias-dropout-add)."""
    partial = linear(x, weight)
    if sequence_parallel:
        return reduce_scatter_to_sequence_parallel(partial, comm)
    return reduce_from_tensor_parallel(partial, comm)
