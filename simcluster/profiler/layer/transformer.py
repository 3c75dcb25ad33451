"""One GPT transformer layer, Megatron style, on one tensor-parallel rank (Figures 2-5).

Layout [s, b, h]. With sequence parallelism the layer's input and output are this rank's
[s/t, b, h] slice of the sequence; otherwise the full [s, b, h], replicated on every rank.

    x ─ LN1 ─ g|f ─ QKV (column-parallel) ─ attention core ─ proj (row-parallel) ─ ḡ|f̄
      ─ + bias, dropout, + x ─ LN2 ─ g|f ─ fc1 (column-parallel) ─ GeLU ─ fc2 (row-parallel)
      ─ ḡ|f̄ ─ + bias, dropout, + residual

What autograd keeps (bytes, no parallelism, bf16) is exactly Table 2's per-layer sum:
LN inputs 4sbh, QKV input 2sbh, Q and K 4sbh, V 2sbh, softmax output 2as²b, attention
dropout mask as²b and output 2as²b, proj input 2sbh, two dropout masks 2sbh, fc1 input
2sbh, GeLU input 8sbh, fc2 input 8sbh, plus the layer norms' mean and rstd, which the paper
neglects (see `accounting`). Q, K and V stay views of the QKV GEMM output (one storage).

Recompute: SELECTIVE checkpoints the attention core (its saved inputs are Q, K, V); FULL
checkpoints the whole layer (only its input is kept), both with torch.utils.checkpoint
(use_reentrant=False, RNG state preserved).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from simcluster.config.choices import Recompute
from simcluster.profiler.layer.ops import LocalMasks, MaskSource, SlicedMasks, dropout, scale_mask_softmax
from simcluster.profiler.layer.parallel import (
    Comm,
    ShardStandInComm,
    column_parallel_linear,
    row_parallel_linear,
)
from simcluster.profiler.layer.spec import LayerSpec
from simcluster.profiler.layer.weights import (
    PARAM_NAMES,
    local_weights,
    param_shapes,
    serial_weights,
    shard,
)


class ParallelTransformerLayer(nn.Module):
    """The layer on rank `comm.rank` of `spec.tp`; parameters are this rank's shards."""

    ln1_weight: nn.Parameter
    ln1_bias: nn.Parameter
    qkv_weight: nn.Parameter  # [3h/t, h]
    qkv_bias: nn.Parameter  # [3h/t]
    proj_weight: nn.Parameter  # [h, h/t]
    proj_bias: nn.Parameter  # [h], added once after f̄ / ḡ
    ln2_weight: nn.Parameter
    ln2_bias: nn.Parameter
    fc1_weight: nn.Parameter  # [f/t, h]
    fc1_bias: nn.Parameter  # [f/t]
    fc2_weight: nn.Parameter  # [h, f/t]
    fc2_bias: nn.Parameter  # [h], added once after f̄ / ḡ

    def __init__(self, spec: LayerSpec, weights: dict[str, Tensor], comm: Comm,
                 masks: MaskSource) -> None:
        super().__init__()
        if comm.world_size != spec.tp:
            raise ValueError(f"comm has world_size {comm.world_size}, spec.tp is {spec.tp}")
        shapes = param_shapes(spec)
        for name in PARAM_NAMES:
            if tuple(weights[name].shape) != shapes[name]:
                raise ValueError(f"{name}: expected shape {shapes[name]}, "
                                 f"got {tuple(weights[name].shape)}")
            self.register_parameter(name, nn.Parameter(weights[name]))
        self.spec = spec
        self.comm = comm
        self.masks = masks

    def forward(self, x: Tensor) -> Tensor:
        """x: [s/t, b, h] with SP, else [s, b, h] -> same shape."""
        if self.spec.recompute is Recompute.FULL:
            return checkpoint(self._layer, x, use_reentrant=False, preserve_rng_state=True)
        return self._layer(x)

    def _layer(self, x: Tensor) -> Tensor:
        residual = x
        x = self._bias_dropout_add(self._attention(self._layer_norm(x, "ln1")),
                                   self.proj_bias, residual, "attention_output")
        residual = x
        return self._bias_dropout_add(self._mlp(self._layer_norm(x, "ln2")),
                                      self.fc2_bias, residual, "mlp_output")

    def _layer_norm(self, x: Tensor, name: str) -> Tensor:
        weight, bias = getattr(self, f"{name}_weight"), getattr(self, f"{name}_bias")
        return F.layer_norm(x, (self.spec.hidden_size,), weight, bias,
                            self.spec.layernorm_epsilon)

    def _attention(self, x: Tensor) -> Tensor:
        """Self-attention up to the row-parallel projection (bias added by the caller)."""
        spec = self.spec
        qkv = column_parallel_linear(x, self.qkv_weight, self.qkv_bias, self.comm,
                                     spec.sequence_parallel)  # [s, b, 3h/t]
        s, b = qkv.shape[:2]
        qkv = qkv.view(s, b, spec.heads_per_rank, 3 * spec.head_dim)  # heads hold [q k v]
        q, k, v = qkv.split(spec.head_dim, dim=-1)  # views, each [s, b, a/t, h/a]
        if spec.recompute is Recompute.SELECTIVE:
            context = checkpoint(self._attention_core, q, k, v, use_reentrant=False,
                                 preserve_rng_state=True)
        else:
            context = self._attention_core(q, k, v)
        return row_parallel_linear(context, self.proj_weight, self.comm, spec.sequence_parallel)

    def _attention_core(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """softmax(QKᵀ/sqrt(d), causal) → dropout → ×V; [s, b, a/t, d] → [s, b, h/t].

        Keeps Q and K (QKᵀ), the softmax output, the 1-byte dropout mask, the dropout output
        and V (×V): 5as²b/t + 6sbh/t bytes, Q/K/V being views of one QKV storage.
        """
        s, b, heads, d = q.shape
        q = q.reshape(s, b * heads, d).transpose(0, 1)  # [b·a/t, s, d], still a view
        k = k.reshape(s, b * heads, d).permute(1, 2, 0)  # [b·a/t, d, s]
        v = v.reshape(s, b * heads, d).transpose(0, 1)  # [b·a/t, s, d]
        scores = torch.bmm(q, k).view(b, heads, s, s)
        probs = scale_mask_softmax(scores, 1.0 / math.sqrt(d))
        first_head = self.comm.rank * heads
        keep = self.masks.keep_mask("attention", (b, self.spec.num_attention_heads, s, s), 1,
                                    first_head, first_head + heads, self.spec.dropout_prob,
                                    probs.device)
        probs = dropout(probs, keep, self.spec.dropout_prob)
        context = torch.bmm(probs.view(b * heads, s, s), v)  # [b·a/t, s, d]
        return context.view(b, heads, s, d).permute(2, 0, 1, 3).reshape(s, b, heads * d)

    def _mlp(self, x: Tensor) -> Tensor:
        """fc1 (column-parallel) → GeLU → fc2 (row-parallel, bias added by the caller)."""
        sp = self.spec.sequence_parallel
        hidden = column_parallel_linear(x, self.fc1_weight, self.fc1_bias, self.comm, sp)
        hidden = F.gelu(hidden, approximate="tanh")  # [s, b, 4h/t]
        return row_parallel_linear(hidden, self.fc2_weight, self.comm, sp)

    def _bias_dropout_add(self, x: Tensor, bias: Tensor, residual: Tensor, site: str) -> Tensor:
        """residual + dropout(x + bias): keeps only the sbh (sbh/t with SP) 1-byte mask."""
        spec = self.spec
        start = self.comm.rank * spec.local_seq_length if spec.sequence_parallel else 0
        keep = self.masks.keep_mask(site, (spec.seq_length, spec.micro_batch_size,
                                           spec.hidden_size), 0, start,
                                    start + spec.local_seq_length, spec.dropout_prob, x.device)
        return residual + dropout(x + bias, keep, spec.dropout_prob)


def sharded_layer(spec: LayerSpec, comm: Comm, seed: int = 0, device: str = "cpu",
                  masks: MaskSource | None = None) -> ParallelTransformerLayer:
    """Rank `comm.rank`'s layer with weights sliced from `serial_weights(spec, seed)`.

    Default masks are `SlicedMasks(seed)`: the same dropped elements as the serial layer.
    """
    weights = shard(serial_weights(spec, seed), spec, comm.rank)
    weights = {n: w.to(device=device, dtype=spec.torch_dtype) for n, w in weights.items()}
    return ParallelTransformerLayer(spec, weights, comm, masks or SlicedMasks(seed))


def serial_layer(spec: LayerSpec, seed: int = 0, device: str = "cpu",
                 masks: MaskSource | None = None) -> ParallelTransformerLayer:
    """The t = 1 layer that `sharded_layer(spec, ...)` is a slice of."""
    return sharded_layer(spec.serial(), ShardStandInComm(1), seed, device, masks)


def local_layer(spec: LayerSpec, comm: Comm, seed: int = 0, device: str = "cpu",
                masks: MaskSource | None = None) -> ParallelTransformerLayer:
    """A layer of rank shapes with weights drawn on `device` (timing and memory runs)."""
    weights = local_weights(spec, seed, torch.device(device))
    return ParallelTransformerLayer(spec, weights, comm, masks or LocalMasks())


def layer_input(spec: LayerSpec, seed: int, rank: int = 0, device: str = "cpu") -> Tensor:
    """Rank `rank`'s slice of a seeded serial input [s, b, h] (all of it without SP)."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    full = torch.randn(spec.seq_length, spec.micro_batch_size, spec.hidden_size, generator=gen)
    start = rank * spec.local_seq_length if spec.sequence_parallel else 0
    local = full.narrow(0, start, spec.local_seq_length).clone()
    return local.to(device=device, dtype=spec.torch_dtype)
