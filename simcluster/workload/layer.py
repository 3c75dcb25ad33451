"""The op graph of one transformer layer on one tensor-parallel rank (Korthikanti Figs. 2–5).

Forward, backward (input-grad and weight-grad GEMMs), and the extra forward work that
selective (attention core) or full (whole layer) recomputation adds to the backward. Shapes
are per rank: GEMMs split column- / row-wise by t; with sequence parallelism the layer-norm
and dropout regions hold s/t of the sequence and the conjugate collectives become
all-gather / reduce-scatter (Fig. 5). The `saved_bytes` of the forward ops add up to the six
rows of Table 2 (tested against `simcluster.workload.memory`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from simcluster.config.choices import Recompute
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import CollectiveKind, GemmShape, Op, collective, elementwise, gemm

MASK_BYTES = 1  # dropout masks are stored as one byte per element (Table 2)


@dataclass(frozen=True, slots=True)
class LayerOps:
    forward: tuple[Op, ...]
    backward: tuple[Op, ...]
    recompute: tuple[Op, ...]

    @property
    def saved_bytes(self) -> float:
        return sum(op.saved_bytes for op in self.forward)


# Pure and immutable, so cached: a plan or sweep builds thousands of workloads from a few
# hundred layer configurations.
@functools.lru_cache(maxsize=1024)
def layer_ops(cfg: LayerConfig) -> LayerOps:
    """The layer's ops in execution order, with the recompute mode applied to saved bytes."""
    core = _attention_core_forward(cfg)
    forward = _attention_block_forward(cfg, core) + _mlp_block_forward(cfg)
    backward = _mlp_block_backward(cfg) + _attention_block_backward(cfg)
    if cfg.recompute is Recompute.SELECTIVE:
        # Only the checkpoint's inputs Q, K, V stay (4sbh/t on QKᵀ, 2sbh/t on ×V): Table 2 row 4/5.
        kept = {"attn.qk": 4, "attn.av": 2}
        unit = cfg.element_bytes * cfg.tokens * cfg.hidden_size / cfg.tp / 2
        forward = tuple(
            _with_saved(op, kept[op.name] * unit if op.name in kept else 0.0) if op in core else op
            for op in forward
        )
        return LayerOps(forward, backward, recompute=tuple(_with_saved(op, 0.0) for op in core))
    if cfg.recompute is Recompute.FULL:
        # Only the layer input (layer-norm 1's input) is kept: Table 2 row 6.
        forward = (forward[0],) + tuple(_with_saved(op, 0.0) for op in forward[1:])
        return LayerOps(forward, backward, recompute=tuple(_with_saved(op, 0.0) for op in forward))
    return LayerOps(forward, backward, recompute=())


def saved_activation_bytes(cfg: LayerConfig) -> float:
    """Bytes one layer keeps for backward on one rank, as the op graph counts them."""
    return layer_ops(cfg).saved_bytes


def _with_saved(op: Op, saved_bytes: float) -> Op:
    return Op(
        name=op.name,
        kind=op.kind,
        gemm=op.gemm,
        bytes_moved=op.bytes_moved,
        collective=op.collective,
        message_bytes=op.message_bytes,
        saved_bytes=saved_bytes,
        overlaps_next=op.overlaps_next,
    )


def _tp_enter(cfg: LayerConfig, name: str) -> tuple[Op, ...]:
    """g (SP: all-gather the sequence) before a column-parallel GEMM; f is a no-op forward."""
    if cfg.sequence_parallel:
        full = cfg.element_bytes * cfg.tokens * cfg.hidden_size
        return (collective(f"{name}.allgather", CollectiveKind.ALL_GATHER, full),)
    return ()


def _tp_exit(cfg: LayerConfig, name: str) -> tuple[Op, ...]:
    """f̄ (all-reduce) or ḡ (SP: reduce-scatter) after a row-parallel GEMM."""
    if cfg.tp == 1:
        return ()
    full = cfg.element_bytes * cfg.tokens * cfg.hidden_size
    kind = CollectiveKind.REDUCE_SCATTER if cfg.sequence_parallel else CollectiveKind.ALL_REDUCE
    return (collective(f"{name}.{kind.value.replace('_', '')}", kind, full),)


def _layer_norm(cfg: LayerConfig, name: str) -> Op:
    """Reads x, writes y (2 bytes each per element); keeps its input, 2sbh (÷t with SP)."""
    elements = cfg.region_tokens * cfg.hidden_size
    return elementwise(name, 2 * cfg.element_bytes * elements, cfg.element_bytes * elements)


def _bias_dropout_add(cfg: LayerConfig, name: str) -> Op:
    """Megatron's fused bias-dropout-add: reads branch and residual, writes out and a
    one-byte mask; keeps the mask, sbh (÷t with SP)."""
    elements = cfg.region_tokens * cfg.hidden_size
    return elementwise(name, (3 * cfg.element_bytes + MASK_BYTES) * elements, MASK_BYTES * elements)


def _attention_core_forward(cfg: LayerConfig) -> tuple[Op, ...]:
    """QKᵀ, fused scale-mask-softmax, dropout, ×V on a/t heads: 5as²b/t + 6sbh/t kept."""
    e, s, d = cfg.element_bytes, cfg.seq_length, cfg.head_dim
    batch = cfg.micro_batch_size * cfg.heads_per_rank
    qkv_slice = e * cfg.tokens * cfg.hidden_size / cfg.tp
    scores = cfg.score_elements
    return (
        gemm("attn.qk", GemmShape(m=s, n=s, k=d, batch=batch), saved_bytes=2 * qkv_slice),
        elementwise("attn.softmax", 2 * e * scores, saved_bytes=e * scores),
        elementwise("attn.dropout", (2 * e + MASK_BYTES) * scores, saved_bytes=MASK_BYTES * scores),
        gemm("attn.av", GemmShape(m=s, n=d, k=s, batch=batch), saved_bytes=e * scores + qkv_slice),
    )


def _attention_block_forward(cfg: LayerConfig, core: tuple[Op, ...]) -> tuple[Op, ...]:
    e, tokens, h, t = cfg.element_bytes, cfg.tokens, cfg.hidden_size, cfg.tp
    region_in = e * cfg.region_tokens * h
    return (
        _layer_norm(cfg, "ln1"),
        *_tp_enter(cfg, "attn"),
        gemm("attn.qkv", GemmShape(m=tokens, n=3 * h // t, k=h), saved_bytes=region_in),
        *core,
        elementwise("attn.context_copy", 2 * e * tokens * h / t),
        gemm("attn.proj", GemmShape(m=tokens, n=h, k=h // t), saved_bytes=e * tokens * h / t),
        *_tp_exit(cfg, "attn"),
        _bias_dropout_add(cfg, "attn.bias_dropout_add"),
    )


def _mlp_block_forward(cfg: LayerConfig) -> tuple[Op, ...]:
    e, tokens, h, t, f = cfg.element_bytes, cfg.tokens, cfg.hidden_size, cfg.tp, cfg.ffn_hidden_size
    region_in = e * cfg.region_tokens * h
    return (
        _layer_norm(cfg, "ln2"),
        *_tp_enter(cfg, "mlp"),
        gemm("mlp.fc1", GemmShape(m=tokens, n=f // t, k=h), saved_bytes=region_in),
        elementwise("mlp.bias_gelu", 2 * e * tokens * f / t, saved_bytes=e * tokens * f / t),
        gemm("mlp.fc2", GemmShape(m=tokens, n=h, k=f // t), saved_bytes=e * tokens * f / t),
        *_tp_exit(cfg, "mlp"),
        _bias_dropout_add(cfg, "mlp.bias_dropout_add"),
    )


def _row_parallel_backward(cfg: LayerConfig, name: str, n_in: int, n_out: int) -> tuple[Op, ...]:
    """Backward of bias-dropout-add, the ḡ/f̄ conjugate, and the row-parallel GEMM
    Y[tokens, n_out] = X[tokens, n_in] · W."""
    e, tokens = cfg.element_bytes, cfg.tokens
    region = cfg.region_tokens * cfg.hidden_size
    ops: list[Op] = [
        # mask + grad in, grad out, plus the bias-grad reduction re-reading the grad
        elementwise(f"{name}.bias_dropout_add.bwd", (3 * e + MASK_BYTES) * region),
    ]
    if cfg.sequence_parallel:
        full = e * tokens * cfg.hidden_size
        ops.append(collective(f"{name}.allgather.bwd", CollectiveKind.ALL_GATHER, full))
    ops += [
        gemm(f"{name}.dgrad", GemmShape(m=tokens, n=n_in, k=n_out)),
        gemm(f"{name}.wgrad", GemmShape(m=n_in, n=n_out, k=tokens, accumulate_fp32=True)),
    ]
    return tuple(ops)


def _column_parallel_backward(cfg: LayerConfig, name: str, n_out: int) -> tuple[Op, ...]:
    """Backward of the column-parallel GEMM Y[tokens, n_out] = X[tokens, h] · W and the f/g
    conjugate. Megatron overlaps the input-grad all-reduce (SP: reduce-scatter) with the
    weight-grad GEMM, and with SP re-gathers the sharded input while the dgrad runs."""
    e, tokens, h = cfg.element_bytes, cfg.tokens, cfg.hidden_size
    full = e * tokens * h
    ops: list[Op] = []
    if cfg.sequence_parallel:
        ops.append(collective(f"{name}.input_allgather.bwd", CollectiveKind.ALL_GATHER, full, True))
    ops.append(gemm(f"{name}.dgrad", GemmShape(m=tokens, n=h, k=n_out)))
    if cfg.tp > 1:
        kind = CollectiveKind.REDUCE_SCATTER if cfg.sequence_parallel else CollectiveKind.ALL_REDUCE
        ops.append(collective(f"{name}.{kind.value.replace('_', '')}.bwd", kind, full, True))
    ops.append(gemm(f"{name}.wgrad", GemmShape(m=h, n=n_out, k=tokens, accumulate_fp32=True)))
    return tuple(ops)


def _norm_and_residual_backward(cfg: LayerConfig, name: str) -> tuple[Op, ...]:
    """Layer-norm backward (reads x and dy, writes dx) and the residual-grad add."""
    elements = cfg.region_tokens * cfg.hidden_size
    e = cfg.element_bytes
    return (
        elementwise(f"{name}.bwd", 3 * e * elements),
        elementwise(f"{name}.residual_grad_add", 3 * e * elements),
    )


def _mlp_block_backward(cfg: LayerConfig) -> tuple[Op, ...]:
    e, tokens, t, f = cfg.element_bytes, cfg.tokens, cfg.tp, cfg.ffn_hidden_size
    return (
        *_row_parallel_backward(cfg, "mlp.fc2", n_in=f // t, n_out=cfg.hidden_size),
        # reads x and dy, writes dx; the bias-grad reduction re-reads dx
        elementwise("mlp.bias_gelu.bwd", 4 * e * tokens * f / t),
        *_column_parallel_backward(cfg, "mlp.fc1", n_out=f // t),
        *_norm_and_residual_backward(cfg, "ln2"),
    )


def _attention_block_backward(cfg: LayerConfig) -> tuple[Op, ...]:
    e, tokens, h, t = cfg.element_bytes, cfg.tokens, cfg.hidden_size, cfg.tp
    s, d = cfg.seq_length, cfg.head_dim
    batch = cfg.micro_batch_size * cfg.heads_per_rank
    scores = cfg.score_elements
    return (
        *_row_parallel_backward(cfg, "attn.proj", n_in=h // t, n_out=h),
        elementwise("attn.context_copy.bwd", 2 * e * tokens * h / t),
        gemm("attn.av.dgrad_probs", GemmShape(m=s, n=s, k=d, batch=batch)),
        gemm("attn.av.dgrad_v", GemmShape(m=s, n=d, k=s, batch=batch)),
        elementwise("attn.dropout.bwd", (2 * e + MASK_BYTES) * scores),
        elementwise("attn.softmax.bwd", 3 * e * scores),
        gemm("attn.qk.dgrad_q", GemmShape(m=s, n=d, k=s, batch=batch)),
        gemm("attn.qk.dgrad_k", GemmShape(m=s, n=d, k=s, batch=batch)),
        *_column_parallel_backward(cfg, "attn.qkv", n_out=3 * h // t),
        *_norm_and_residual_backward(cfg, "ln1"),
    )
