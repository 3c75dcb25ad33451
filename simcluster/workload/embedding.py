"""Ops outside the transformer layers: the input embedding (first virtual stage) and the
output layer with vocab-parallel cross-entropy (last virtual stage).

Korthikanti §4.3: the embedding keeps its dropout mask (sbh/t with SP); the output keeps the
final layer norm's input (2sbh/t), the output layer's input (2sbh/t) and fp32 logits (4sbv/t).
With RoPE there is no position embedding to add; with hidden dropout 0 no mask is kept. An
untied output weight (`untie_embeddings_and_output_weights`) runs the same logits GEMM.
"""

from __future__ import annotations

import functools

from simcluster.config.choices import PositionEmbedding
from simcluster.workload.layer import MASK_BYTES, LayerOps, norm_kernel
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import CollectiveKind, GemmShape, Module, Op, Pass, collective, elementwise, gemm

F, B, W = Pass.FORWARD, Pass.INPUT_GRAD, Pass.WEIGHT_GRAD

FP32_BYTES = 4
# Vocab-parallel cross-entropy in fp32 over the rank's logits: cast (read 2, write 4), max
# (read 4), exp in place (read 4, write 4), sum (read 4), normalise in place (read 4, write 4).
CROSS_ENTROPY_FORWARD_BYTES_PER_LOGIT = 30
# Backward: softmax − one-hot in place (read 4, write 4), cast to 16 bit (read 4, write 2).
CROSS_ENTROPY_BACKWARD_BYTES_PER_LOGIT = 14
MAKE_VOCAB_DIVISIBLE_BY = 128  # Megatron's --make-vocab-size-divisible-by default


def padded_vocab_size(vocab_size: int, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of 128·t."""
    multiple = MAKE_VOCAB_DIVISIBLE_BY * tp
    return -(-vocab_size // multiple) * multiple


@functools.lru_cache(maxsize=1024)  # pure and immutable: shared by a plan's layouts
def embedding_ops(cfg: LayerConfig, vocab_size: int) -> LayerOps:
    """Vocab-parallel word embedding (+ learned position embedding), conjugate collective,
    dropout (when hidden dropout > 0)."""
    e, tokens, h = cfg.element_bytes, cfg.tokens, cfg.hidden_size
    region = cfg.region_tokens * h
    full = e * tokens * h
    emb = Module.EMBEDDING
    conj = (
        collective("embedding.reducescatter", CollectiveKind.REDUCE_SCATTER, full, module=emb, pass_=F)
        if cfg.sequence_parallel
        else collective("embedding.allreduce", CollectiveKind.ALL_REDUCE, full, module=emb, pass_=F)
    )
    # gather rows (read + write), add learned positions (read 2, write 1); RoPE adds none here
    lookup_bytes_per_element = 5 if cfg.position_embedding is PositionEmbedding.LEARNED else 2
    forward: list[Op] = [
        elementwise("embedding.lookup", lookup_bytes_per_element * e * tokens * h, module=emb, pass_=F)
    ]
    if cfg.tp > 1:
        forward.append(conj)
    backward: list[Op] = []
    if cfg.hidden_dropout > 0:
        drop, moved = Module.EMBEDDING_DROPOUT, (2 * e + MASK_BYTES) * region
        forward.append(elementwise("embedding.dropout", moved, MASK_BYTES * region, module=drop, pass_=F))
        backward.append(elementwise("embedding.dropout.bwd", moved, module=drop, pass_=B))
    if cfg.sequence_parallel:
        backward.append(
            collective("embedding.allgather.bwd", CollectiveKind.ALL_GATHER, full, module=emb, pass_=B)
        )
    # scatter-add of the grad rows into fp32 main grads (read dy, read+write fp32 rows)
    backward.append(elementwise("embedding.wgrad", (e + 2 * FP32_BYTES) * tokens * h, module=emb, pass_=W))
    return LayerOps(tuple(forward), tuple(backward), recompute=())


@functools.lru_cache(maxsize=1024)
def output_ops(cfg: LayerConfig, vocab_size: int) -> LayerOps:
    """Final norm, logits GEMM against the tied embedding (or the untied output weight:
    the same GEMM), vocab-parallel CE loss."""
    e, tokens, h, t = cfg.element_bytes, cfg.tokens, cfg.hidden_size, cfg.tp
    vocab_rank = padded_vocab_size(vocab_size, t) // t
    logits = float(tokens * vocab_rank)
    region = cfg.region_tokens * h
    full = e * tokens * h
    loss_reduce = FP32_BYTES * tokens
    norm, head, ce = Module.LAYERNORM, Module.LOGITS, Module.CROSS_ENTROPY
    # the final norm is the model's `--normalization` (gpt_model.py `final_layernorm`: TENorm)
    kernel = norm_kernel(cfg)
    forward: list[Op] = [
        elementwise("output.ln", 2 * e * region, e * region, module=norm, pass_=F, kernel=kernel)
    ]
    if cfg.sequence_parallel:
        forward.append(collective("output.allgather", CollectiveKind.ALL_GATHER, full, module=head, pass_=F))
    forward.append(
        gemm("output.logits", GemmShape(m=tokens, n=vocab_rank, k=h), e * region, module=head, pass_=F)
    )
    ce_bytes = CROSS_ENTROPY_FORWARD_BYTES_PER_LOGIT * logits
    forward.append(elementwise("output.cross_entropy", ce_bytes, FP32_BYTES * logits, module=ce, pass_=F))
    if t > 1:
        # max and sum-exp across the vocab shards: two small fp32 all-reduces
        reduce = CollectiveKind.ALL_REDUCE
        forward.append(collective("output.ce.allreduce_max", reduce, loss_reduce, module=ce, pass_=F))
        forward.append(collective("output.ce.allreduce_sum", reduce, loss_reduce, module=ce, pass_=F))
    backward: list[Op] = [
        elementwise(
            "output.cross_entropy.bwd", CROSS_ENTROPY_BACKWARD_BYTES_PER_LOGIT * logits, module=ce, pass_=B
        ),
    ]
    if cfg.sequence_parallel:
        # the final norm's output, gathered again for the weight-grad GEMM
        gather = CollectiveKind.ALL_GATHER
        backward.append(collective("output.input_allgather.bwd", gather, full, True, module=head, pass_=W))
    backward.append(gemm("output.logits.dgrad", GemmShape(m=tokens, n=h, k=vocab_rank), module=head, pass_=B))
    if t > 1:
        kind = CollectiveKind.REDUCE_SCATTER if cfg.sequence_parallel else CollectiveKind.ALL_REDUCE
        backward.append(collective("output.conj.bwd", kind, full, True, module=head, pass_=B))
    wgrad = GemmShape(m=vocab_rank, n=h, k=tokens, accumulate_fp32=True)
    backward.append(gemm("output.logits.wgrad", wgrad, module=head, pass_=W))
    backward.append(elementwise("output.ln.bwd", 3 * e * region, module=norm, pass_=B, kernel=kernel))
    return LayerOps(tuple(forward), tuple(backward), recompute=())
