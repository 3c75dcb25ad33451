"""Context parallelism's attention: the K/V ring of Megatron-core's default
`--cp-comm-type p2p` (TE `attention/dot_product_attention/context_parallel.py::
AttnFuncWithCPAndKVP2P`).

The rest of the layer needs nothing here: `workload.model.layer_config` describes every
rank's layer on its s/c tokens, so its GEMMs, element-wise kernels, SP collectives and saved
activations already scale by 1/c. The flash-attention kernel of that layer sees only the
local s/c keys; with c > 1 it becomes a ring of c steps over all s keys
(`ops.RingAttention`), priced in `costs.chunk` on the context-parallel group's links.

What the ring keeps for backward is what the local kernel keeps: Q, one K/V chunk of s/c
tokens (the last received; K/V circulate again in backward), O and the LSE, so the flash
op's saved bytes carry over unchanged (docs/memory.md, "Context parallelism").
"""

from __future__ import annotations

import functools
from dataclasses import replace

from simcluster.config.choices import PositionEmbedding, Recompute
from simcluster.config.moe_choices import RecomputeModule
from simcluster.workload.layer import LayerOps, flash_attention_shape
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import Module, Op, OpKind, Pass, RingAttention


def kv_chunk_bytes(cfg: LayerConfig) -> float:
    """K and V of the rank's s/c tokens on its g/t key/value heads: 2·(s/c)·b·k/t elements
    (GQA shrinks what travels: only the g KV heads; Megatron-core CP doc)."""
    return 2.0 * cfg.element_bytes * cfg.tokens * cfg.kv_width / cfg.tp


def output_bytes(cfg: LayerConfig) -> float:
    """The rank's attention output O (or its gradient dQ): s/c · b tokens × q/t, 16-bit."""
    return cfg.element_bytes * cfg.tokens * cfg.query_width / cfg.tp


def merge_bytes(cfg: LayerConfig, backward: bool) -> tuple[float, float]:
    """HBM bytes of the element-wise work that merges each step's partial result (step 0,
    then each later step), as TE's `AttnFuncWithCPAndKVP2P` does it in 16 bits:
    * forward, after the ring: `flash_attn_fwd_out_correction_init` scales step 0's O into
      the output (read O_0, write O: 2·|O|); `flash_attn_fwd_out_correction` adds each later
      step's rescaled O_i (read O_i, read and write O: 3·|O|);
    * backward, after each step: `dq.copy_` / `dq.add_` of the step's dQ (2·|O| then
      3·|O|); `combine_tensors([dk_, dv_])` packs the step's dK, dV (2·|KV|), then
      `dkv.copy_` / `dkv.add_` folds them into the travelling dK/dV buffer (2·|KV| then
      3·|KV|).
    Counted for the full-size tile (a rank's lower tile; the upper tile touches half of O);
    the softmax-LSE corrections (fp32, one per query and head) and the `.contiguous()`
    copies of half tensors are left out, so these are lower bounds."""
    o, kv = output_bytes(cfg), kv_chunk_bytes(cfg)
    if backward:
        return 2 * o + 4 * kv, 3 * o + 5 * kv
    return 2 * o, 3 * o


def ring_attention(cfg: LayerConfig, cp: int, backward: bool = False) -> RingAttention:
    """One direction of the ring on a rank whose layer is `cfg` (seq_length = s/c).

    Forward: c steps, c − 1 transfers of the K/V chunk. Backward: K/V go round again with
    the partial dK/dV (each step sends both to rank − 1, the first has no dK/dV yet), and the
    accumulated dK/dV returns to its owner after the last step."""
    local = cfg.seq_length  # s/c: two of the 2·c load-balancing chunks
    half = local // 2
    diagonal = flash_attention_shape(cfg, backward=backward)
    lower = replace(diagonal, seq_q=local, seq_k=half, causal=False)
    upper = replace(diagonal, seq_q=half, seq_k=local, causal=False)
    kv = kv_chunk_bytes(cfg)
    first_merge, later_merge = merge_bytes(cfg, backward)
    return RingAttention(
        cp_size=cp,
        diagonal=diagonal,
        lower=lower,
        upper=upper,
        message_bytes=2 * kv if backward else kv,
        first_message_bytes=kv,
        final_message_bytes=kv if backward else 0.0,
        first_merge_bytes=first_merge,
        merge_bytes=later_merge,
    )


def _ring_op(op: Op, cfg: LayerConfig, cp: int) -> Op:
    ring = ring_attention(cfg, cp, backward=op.pass_ is Pass.INPUT_GRAD)
    return replace(op, ring=ring, attention=ring.diagonal)


@functools.lru_cache(maxsize=1024)
def context_parallel_layer_ops(ops: LayerOps, cfg: LayerConfig, cp: int) -> LayerOps:
    """`ops` (the layer on s/c tokens) with its flash-attention kernels, forward, backward
    and the selective-recompute forward, turned into the K/V ring over c ranks; unchanged
    for c = 1. Saved bytes stay those of the local kernel (TE `AttnFuncWithCPAndKVP2P.forward`
    saves Q as given, the last received K/V chunk, O and the LSE), plus `ring_held_bytes`."""
    if cp == 1:
        return ops
    held = ring_held_bytes(cfg)

    def convert(seq: tuple[Op, ...]) -> tuple[Op, ...]:
        return tuple(
            _ring_op(op, cfg, cp) if op.kind is OpKind.ATTENTION and op.module is Module.FLASH else op
            for op in seq
        )

    forward = convert(ops.forward)
    if held:
        forward = tuple(
            replace(op, saved_bytes=op.saved_bytes + held) if op.module is Module.FLASH else op
            for op in forward
        )
    return LayerOps(forward, convert(ops.backward), convert(ops.recompute), ops.fp8_recipe)


def ring_held_bytes(cfg: LayerConfig) -> float:
    """The QKV output's K/V part, e·S·2k/t, kept alive under CP without recompute when the Q the
    ring saves is still a view of the QKV GEMM output: TE's `DotProductAttention` keeps the
    views when their layout is one it accepts (`get_qkv_layout`: MHA-style split, no RoPE;
    see `layer.qkv_output_held_bytes` for when Megatron-core's Q is a view), the ring then
    saves that Q and its own K/V buffer (a `torch.cat` copy), so the layer's K and V storage
    stays beside it. Only MHA without RoPE keeps the views (sbh3d): a RoPE'd Q/K, or any GQA
    split (K, V of another shape than Q), is made contiguous by TE; selective recompute's
    checkpoint is counted by `qkv_output_held_bytes`."""
    checkpointed = cfg.recompute is Recompute.FULL or cfg.recomputes(RecomputeModule.CORE_ATTN)
    if checkpointed or cfg.position_embedding is PositionEmbedding.ROPE:
        return 0.0
    if cfg.query_groups != cfg.num_attention_heads:
        return 0.0
    return cfg.element_bytes * cfg.tokens * 2 * cfg.kv_width / cfg.tp
