"""Context parallelism in the real layer: Megatron-core's zig-zag split and TE's K/V ring.

The sequence of s tokens is cut into 2·c chunks of s/(2c); cp rank r holds chunks r and
2c − 1 − r, in that order (Megatron-core `utils.py::get_batch_on_this_cp_rank`, TE's
"DualChunkSwap", `context_parallel.py::attn_forward_func_with_cp`), so every rank does the
same causal work. Everything but the attention core runs unchanged on those s/c tokens.

`ring_attention` is the core, after TE's `AttnFuncWithCPAndKVP2P` (`--cp-comm-type p2p`,
`attention/dot_product_attention/context_parallel.py`), as one autograd function with a
hand-written backward:

- forward, c steps: K and V, stacked into one new [2, s/c, b, g/t, d] buffer, go round the
  ring (rank r sends to r + 1). At step i rank r holds the K/V of rank j = r − i and
  computes one tile of causal attention of its queries: step 0 the "diagonal" (local Q ×
  local K/V, causal), steps i ≤ r "lower" (all local Q × the first half of the K/V, no
  mask), steps i > r "upper" (the second half of Q × all of the K/V, no mask). Partial
  outputs merge through their log-sum-exp, in fp32.
- it saves what TE saves in 16 bit: Q as given, the **last received K/V buffer** (one
  chunk of s/c tokens), O (in the input dtype, [s/c, b, a/t, d] so proj's input is the
  same storage) and the fp32 LSE [b, a/t, s/c]; no s² tensor.
- backward, c steps in the reverse order: the saved K/V goes round again, to r − 1,
  together with the dK/dV accumulated for it so far; each step adds this rank's tile
  gradient (flash attention's backward with the final LSE and D = rowsum(dO ∘ O)), and after
  the last step each rank holds the full dK/dV of its own chunk. TE lags dK/dV by one step
  to overlap it with compute (one more message); the sums are the same.

All collectives go through the cp group's `Comm.shift` (gloo isend/irecv, or the stand-in's
copy for one-process measurements).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from simcluster.profiler.layer.parallel import Comm

DIAGONAL, LOWER, UPPER = "diagonal", "lower", "upper"


def chunk_ids(cp: int, rank: int) -> tuple[int, int]:
    """The two of the 2·cp sequence chunks that cp rank `rank` holds: r and 2cp − 1 − r."""
    if not 0 <= rank < cp:
        raise ValueError(f"cp rank {rank} outside 0..{cp - 1}")
    return rank, 2 * cp - 1 - rank


def local_positions(seq_length: int, cp: int, rank: int) -> Tensor:
    """Global token positions [s/cp] of cp rank `rank`'s tokens, in its local order
    (0 .. s − 1 without CP)."""
    if cp == 1:
        return torch.arange(seq_length)
    if seq_length % (2 * cp):
        raise ValueError(f"seq_length {seq_length} not divisible by 2·cp = {2 * cp}")
    n = seq_length // (2 * cp)
    first, second = chunk_ids(cp, rank)
    return torch.cat([torch.arange(first * n, (first + 1) * n), torch.arange(second * n, (second + 1) * n)])


def local_rows(full: Tensor, cp: int, rank: int) -> Tensor:
    """cp rank `rank`'s rows (dim 0) of a whole-sequence tensor [s, ...]: a new tensor."""
    if cp == 1:
        return full
    return full.index_select(0, local_positions(full.shape[0], cp, rank).to(full.device))


def contiguous_runs(positions: Tensor) -> list[tuple[int, int]]:
    """[start, stop) runs of consecutive values in `positions` (global rows of a rank)."""
    runs: list[tuple[int, int]] = []
    for p in positions.tolist():
        if runs and runs[-1][1] == p:
            runs[-1] = (runs[-1][0], p + 1)
        else:
            runs.append((p, p + 1))
    return runs


def step_kind(step: int, rank: int) -> str:
    """Which tile forward step `step` computes on cp rank `rank` (causal mask)."""
    if step == 0:
        return DIAGONAL
    return LOWER if step <= rank else UPPER


def _heads_first(x: Tensor, groups: int) -> Tensor:
    """[s, b, n, d] -> fp32 [b, g, n/g, s, d] (query heads of one group together)."""
    s, b, n, d = x.shape
    return x.permute(1, 2, 0, 3).float().reshape(b, groups, n // groups, s, d)


def _kv_first(x: Tensor) -> Tensor:
    """[s, b, g, d] -> fp32 [b, g, 1, s, d] (broadcast over the heads of a group)."""
    return x.permute(1, 2, 0, 3).float().unsqueeze(2)


def _scores(q: Tensor, k: Tensor, scale: float, causal: bool) -> Tensor:
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [b, g, n/g, sq, sk]
    if causal:
        sq, sk = scores.shape[-2:]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=scores.device).triu_(1)
        scores = scores.masked_fill(mask, -math.inf)
    return scores


def _tile(kind: str, half: int) -> tuple[slice, slice]:
    """(query rows, key columns) of the local sequence a tile of `kind` covers."""
    if kind == LOWER:
        return slice(None), slice(0, half)
    if kind == UPPER:
        return slice(half, None), slice(None)
    return slice(None), slice(None)


class _RingAttention(torch.autograd.Function):
    """Causal attention of local Q [s/c, b, a/t, d] over the whole sequence, the K/V
    [s/c, b, g/t, d] going round the cp ring (module docstring)."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, comm: Comm) -> Tensor:
        s, b, heads, d = q.shape
        groups, half = k.shape[2], s // 2
        scale = 1.0 / math.sqrt(d)
        qf = _heads_first(q, groups)
        kv = torch.stack([k, v])  # TE's first p2p buffer: cat of K and V, a new tensor
        out = lse = None
        for step in range(comm.world_size):
            following = comm.shift(kv, 1) if step < comm.world_size - 1 else None
            rows, cols = _tile(step_kind(step, comm.rank), half)
            scores = _scores(qf[..., rows, :], _kv_first(kv[0])[..., cols, :], scale, causal=step == 0)
            tile_lse = torch.logsumexp(scores, dim=-1)  # [b, g, n/g, rows]
            tile_out = torch.matmul(
                torch.exp(scores - tile_lse.unsqueeze(-1)), _kv_first(kv[1])[..., cols, :]
            )
            if out is None or lse is None:  # step 0 covers every row
                out, lse = tile_out, tile_lse
            else:  # merge through the softmax statistics (TE's out / lse correction)
                merged = torch.logaddexp(lse[..., rows], tile_lse)
                out[..., rows, :] = out[..., rows, :] * torch.exp(lse[..., rows] - merged).unsqueeze(
                    -1
                ) + tile_out * torch.exp(tile_lse - merged).unsqueeze(-1)
                lse[..., rows] = merged
            if following is not None:
                kv = following
        assert out is not None and lse is not None
        # O in the input dtype, laid out [s, b, a/t, d] so proj's [s, b, q/t] input is a view.
        result = torch.empty(s, b, heads, d, dtype=q.dtype, device=q.device)
        result.copy_(out.reshape(b, heads, s, d).permute(2, 0, 1, 3))
        ctx.comm = comm
        ctx.save_for_backward(q, kv, result, lse.reshape(b, heads, s))  # TE's save list
        return result

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        q, kv, out, lse = ctx.saved_tensors
        comm: Comm = ctx.comm
        s, b, heads, d = q.shape
        groups, half = kv.shape[3], s // 2
        scale = 1.0 / math.sqrt(d)
        qf, dout = _heads_first(q, groups), _heads_first(grad, groups)
        lse = lse.view(b, groups, heads // groups, s)
        delta = (dout * _heads_first(out, groups)).sum(dim=-1)  # D = rowsum(dO ∘ O)
        dq = torch.zeros_like(qf)
        dkv = torch.zeros_like(kv)  # dK/dV of the K/V in hand, in its dtype (TE's buffer)
        c = comm.world_size
        for i in range(c):
            # Forward's steps in reverse: the saved K/V is the last one forward received.
            rows, cols = _tile(step_kind(c - 1 - i, comm.rank), half)
            kf, vf = _kv_first(kv[0])[..., cols, :], _kv_first(kv[1])[..., cols, :]
            q_rows, dout_rows = qf[..., rows, :], dout[..., rows, :]
            probs = torch.exp(_scores(q_rows, kf, scale, causal=i == c - 1) - lse[..., rows].unsqueeze(-1))
            dprobs = torch.matmul(dout_rows, vf.transpose(-1, -2))
            dscores = probs * (dprobs - delta[..., rows].unsqueeze(-1)) * scale
            dq[..., rows, :] += torch.matmul(dscores, kf)
            dk = torch.matmul(dscores.transpose(-1, -2), q_rows).sum(dim=2)  # [b, g, sk, d]
            dv = torch.matmul(probs.transpose(-1, -2), dout_rows).sum(dim=2)
            dkv[:, cols] += torch.stack([dk, dv]).permute(0, 3, 1, 2, 4).to(dkv.dtype)
            if i < c - 1:  # K/V and its partial dK/dV to rank − 1, in one message
                kv, dkv = comm.shift(torch.stack([kv, dkv]), -1).unbind(0)
        dq_out = dq.reshape(b, heads, s, d).permute(2, 0, 1, 3).to(q.dtype)
        return dq_out, dkv[0], dkv[1], None


def ring_attention(q: Tensor, k: Tensor, v: Tensor, comm: Comm) -> Tensor:
    """Causal attention with context parallelism over `comm` (the cp group), TE's p2p ring:
    q [s/c, b, a/t, d], k and v [s/c, b, g/t, d] (GQA native) -> O [s/c, b, a/t, d]."""
    return _RingAttention.apply(q, k, v, comm)
