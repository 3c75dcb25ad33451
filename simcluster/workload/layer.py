"""The op graph of one transformer layer on one tensor-parallel rank (Korthikanti Figs. 2–5).

Forward, backward (input-grad and weight-grad GEMMs), and the extra forward work that
selective (attention core) or full (whole layer) recomputation adds to the backward. Shapes
are per rank: GEMMs split column- / row-wise by t; with sequence parallelism the layer-norm
and dropout regions hold s/t of the sequence and the conjugate collectives become
all-gather / reduce-scatter (Fig. 5). The `saved_bytes` of the forward ops add up to the six
rows of Table 2 (tested against `simcluster.workload.memory`).

The Llama-style options (docs/memory.md) change single ops, each as Megatron-core with
Transformer Engine runs it: GQA narrows the QKV GEMM to (q + 2k)/t; SwiGLU widens fc1 to
2f/t and gates in one element-wise kernel; squared ReLU is GeLU's place with its own
kernel; RMSNorm is a norm kernel of the same bytes (its fp32 rsigma, like layer norm's
mean and rstd, is not counted, as Table 2 does not); RoPE is one element-wise kernel on Q
and K each way; flash attention is one fused kernel per direction with no s² tensor.
With dropout probability 0 there is no mask and no dropout kernel. Their closed forms are
`memory.activation_bytes_per_layer` (tested against this graph).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from simcluster.config.choices import Activation, Fp8Recipe, Normalization, PositionEmbedding, Recompute
from simcluster.config.moe_choices import RecomputeModule
from simcluster.workload.fp8 import amax_pass_ops, fp8_saved_forward
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import (
    AttentionShape,
    CollectiveKind,
    GemmShape,
    GradOf,
    Module,
    Op,
    Pass,
    collective,
    elementwise,
    flash_attention,
    gemm,
)

MASK_BYTES = 1  # dropout masks are stored as one byte per element (Table 2)
LSE_BYTES = 4  # flash attention keeps the softmax log-sum-exp in fp32, one per query and head


@dataclass(frozen=True, slots=True)
class LayerOps:
    """The ops of one layer (or the embedding, or the output layer) per microbatch, and,
    for the TE linears' FP8 casts (`costs.chunk.fp8_cast_s`), the scaling recipe."""

    forward: tuple[Op, ...]
    backward: tuple[Op, ...]
    recompute: tuple[Op, ...]
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED

    @property
    def saved_bytes(self) -> float:
        return sum(op.saved_bytes for op in self.forward)


# Pure and immutable, so cached: a plan or sweep builds thousands of workloads from a few
# hundred layer configurations.
@functools.lru_cache(maxsize=1024)
def layer_ops(cfg: LayerConfig) -> LayerOps:
    """The layer's ops in execution order, with the recompute mode applied to saved bytes
    and, with FP8 or FP4, the TE linears' quantized saved inputs (`workload.fp8.fp8_saved_forward`)
    and, under current scaling and NVFP4, the quantizations' amax work (`workload.fp8.amax_pass_ops`)."""
    return quantized_layer_ops(layer_ops_16bit(cfg), cfg)


def quantized_layer_ops(ops: LayerOps, cfg: LayerConfig) -> LayerOps:
    """`ops` (a layer's 16-bit op graph) as FP8 / FP4 runs it: the TE linears' quantized
    saved inputs (`workload.fp8.fp8_saved_forward`) and, under current scaling and NVFP4,
    the amax work (`workload.fp8.amax_pass_ops`); `ops` itself without quantization. Applied
    after a layer's attention block is replaced (MLA, `workload.model.kind_ops`), so the
    replacement's TE linears are quantized by the same rules."""
    if not cfg.dtype.quantized:
        return ops
    forward = amax_pass_ops(fp8_saved_forward(ops.forward, cfg), cfg)
    backward, recompute = amax_pass_ops(ops.backward, cfg), amax_pass_ops(ops.recompute, cfg)
    return LayerOps(forward, backward, recompute, cfg.fp8_recipe)


@functools.lru_cache(maxsize=1024)
def layer_ops_16bit(cfg: LayerConfig) -> LayerOps:
    """The layer's ops before quantization (`layer_ops` without FP8 / FP4's changes)."""
    core = _attention_core_forward(cfg)
    attention, mlp = _attention_block_forward(cfg, core), _mlp_block_forward(cfg)
    backward = _mlp_block_backward(cfg) + _attention_block_backward(cfg)
    if cfg.recompute is Recompute.FULL:
        # Only the layer input (layer-norm 1's input) is kept: Table 2 row 6.
        forward = attention + mlp
        forward = (forward[0],) + tuple(_with_saved(op, 0.0) for op in forward[1:])
        return LayerOps(forward, backward, recompute=tuple(_with_saved(op, 0.0) for op in forward))
    # Selective: each `--recompute-modules` entry the dense layer reads, in the order the
    # backward re-runs them (the MLP's backward comes first). `layernorm` changes nothing
    # here: in Megatron-core's TE layer spec both norms are fused into the QKV and fc1
    # LayerNormLinears (`input_layernorm` and `pre_mlp_layernorm` are IdentityOp,
    # models/gpt/gpt_layer_specs.py), and TransformerLayer checkpoints a norm only when it
    # is not IdentityOp (transformer_layer.py `recompute_input_layernorm`); a MoE layer's
    # pre-MLP norm is a TENorm of its own (`workload.moe_layer`).
    recompute: tuple[Op, ...] = ()
    if cfg.recomputes(RecomputeModule.MLP):
        mlp, mlp_recompute = _mlp_checkpoint(mlp)
        recompute += mlp_recompute
    forward = attention + mlp
    if cfg.recomputes(RecomputeModule.CORE_ATTN):
        forward, core_recompute = _core_attn_checkpoint(cfg, forward, core)
        recompute += core_recompute
    return LayerOps(forward, backward, recompute)


def _core_attn_checkpoint(
    cfg: LayerConfig, forward: tuple[Op, ...], core: tuple[Op, ...]
) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """`--recompute-modules core_attn` (Megatron's default module and the paper's selective
    recompute): the forward with the checkpoint's saved bytes, and the core re-run in the
    backward (`attention.py::_checkpointed_attention_forward`; Megatron checkpoints the core
    whatever its kernel, with a warning that a fused one may not need it)."""
    recompute = tuple(_with_saved(op, 0.0) for op in core)
    q, k = _slice_bytes(cfg, cfg.query_width), _slice_bytes(cfg, cfg.kv_width)
    if cfg.flash:
        # the checkpoint keeps Q, K, V (the storage the kernel would save) and proj still
        # keeps O, so only the LSE is freed; the backward re-runs the flash forward
        kept = {Module.FLASH: q + 2 * k + qkv_output_held_bytes(cfg), Module.PROJ: q}
        # the kernels, not proj's TP collective (it belongs to the same module)
        kernels = {op for op in forward if op.collective is None and op.module in kept}
        forward = tuple(_with_saved(op, kept[op.module]) if op in kernels else op for op in forward)
        return forward, recompute
    # Only the checkpoint's inputs Q, K, V stay (4sbh/t on QKᵀ, 2sbh/t on ×V): Table 2 row 4/5.
    # With GQA they are K and V before the per-head repeat (k wide each).
    kept = {Module.QK: q + k + qkv_output_held_bytes(cfg), Module.AV: k}
    forward = tuple(_with_saved(op, kept.get(op.module, 0.0)) if op in core else op for op in forward)
    return forward, recompute


def _mlp_checkpoint(mlp: tuple[Op, ...]) -> tuple[tuple[Op, ...], tuple[Op, ...]]:
    """`--recompute-modules mlp` on a dense layer (transformer_layer.py `recompute_mlp`,
    `tensor_parallel.checkpoint(self.mlp, False, pre_mlp_layernorm_output)`): the MLP (in
    the TE spec the fc1 LayerNormLinear with norm 2 fused, fc1, the activation, fc2 and
    their TP collectives) keeps only its input, norm 2's input, which the checkpoint saves
    in place of the norm; fc1's ln_out, the activation's input and fc2's input are dropped
    and the backward re-runs the MLP's forward. The bias-dropout-add after it is outside
    the checkpoint and keeps its mask. Returns the block's forward and its re-run."""
    checkpointed, after = mlp[:-1], mlp[-1:]
    recompute = tuple(_with_saved(op, 0.0) for op in checkpointed)
    return (checkpointed[0],) + recompute[1:] + after, recompute


def qkv_output_held_bytes(cfg: LayerConfig) -> float:
    """Bytes the selective-recompute checkpoint keeps beyond Q, K and V themselves: the rest
    of the QKV GEMM output, held alive by V's view (docs/memory.md, "Does V keep the QKV output alive?").

    Megatron-core `SelfAttention.get_query_key_value_tensors` views the QKV output as
    [s, b, g/t, (a/g + 2)·d] and splits it (torch.split or TE's SplitAlongDim: views), then
    `query.reshape`s to [s, b, a/t, d], a view only when a rank holds one group or groups of
    one head; RoPE (`apply_rotary_pos_emb`, fused or not) returns new Q and K. With
    `--recompute-granularity selective` `Attention._checkpointed_attention_forward` hands
    these Q, K, V to `tensor_parallel.checkpoint`, whose `CheckpointFunction.forward` keeps
    them with `ctx.save_for_backward(*args)`; V is still the view, so the whole output
    eS(q + 2k)/t stays, beside a copied or RoPE'd Q (eSq/t more) and a RoPE'd K (eSk/t).
    (MLM @00c2c0a attention.py; random.py.) Without the checkpoint nothing holds the
    output: TE's DotProductAttention makes Q, K, V contiguous whenever their layout is not
    one it accepts (TE `get_qkv_layout`), which is exactly these cases, and saves the
    copies (see the real layer's `ops.te_qkv_layout`). 0 otherwise, and at the paper's
    layer (MHA, learned positions: Q, K, V stay views of the one output)."""
    if not cfg.recomputes(RecomputeModule.CORE_ATTN):
        return 0.0
    rope = cfg.position_embedding is PositionEmbedding.ROPE
    groups, per_group = cfg.kv_heads_per_rank, cfg.num_attention_heads // cfg.query_groups
    query_copied = rope or (groups > 1 and per_group > 1)
    width = (cfg.query_width if query_copied else 0) + (cfg.kv_width if rope else 0)
    return _slice_bytes(cfg, width)


def saved_activation_bytes(cfg: LayerConfig) -> float:
    """Bytes one layer keeps for backward on one rank, as the op graph counts them."""
    return layer_ops(cfg).saved_bytes


def _with_saved(op: Op, saved_bytes: float) -> Op:
    return replace(op, saved_bytes=saved_bytes)


def _slice_bytes(cfg: LayerConfig, width: int) -> float:
    """Bytes of a [s, b, width/t] activation on a rank (the tensor-parallel region)."""
    return cfg.element_bytes * cfg.tokens * width / cfg.tp


def _tp_enter(cfg: LayerConfig, name: str, module: Module) -> tuple[Op, ...]:
    """g (SP: all-gather the sequence) before a column-parallel GEMM; f is a no-op forward."""
    if cfg.sequence_parallel:
        full = cfg.element_bytes * cfg.tokens * cfg.hidden_size
        return (
            collective(
                f"{name}.allgather", CollectiveKind.ALL_GATHER, full, module=module, pass_=Pass.FORWARD
            ),
        )
    return ()


def _tp_exit(cfg: LayerConfig, name: str, module: Module) -> tuple[Op, ...]:
    """f̄ (all-reduce) or ḡ (SP: reduce-scatter) after a row-parallel GEMM."""
    if cfg.tp == 1:
        return ()
    full = cfg.element_bytes * cfg.tokens * cfg.hidden_size
    kind = CollectiveKind.REDUCE_SCATTER if cfg.sequence_parallel else CollectiveKind.ALL_REDUCE
    return (
        collective(f"{name}.{kind.value.replace('_', '')}", kind, full, module=module, pass_=Pass.FORWARD),
    )


def _layer_norm(cfg: LayerConfig, name: str) -> Op:
    """LayerNorm or RMSNorm: reads x, writes y (2 bytes each per element); keeps its input,
    2sbh (÷t with SP). Its fp32 statistics (mean and rstd, or RMSNorm's rsigma: 4-8 bytes
    per token against 2h) are not counted, as in Table 2."""
    elements = cfg.region_tokens * cfg.hidden_size
    return elementwise(
        name, 2 * cfg.element_bytes * elements, cfg.element_bytes * elements, module=Module.LAYERNORM,
        pass_=Pass.FORWARD, kernel=norm_kernel(cfg),
    )  # fmt: skip


def norm_kernel(cfg: LayerConfig) -> str | None:
    """The kernel "rmsnorm" for an RMSNorm layer (`Op.kernel`: priced by the profile's RMSNorm curve where
    it has one, else as a layer norm, `costs.compute.elementwise_kind`); None for LayerNorm."""
    return "rmsnorm" if cfg.normalization is Normalization.RMSNORM else None


BIAS_ADD_KERNEL = "bias_add"
"""The bias-dropout-add's kernel at hidden dropout 0 (`Op.kernel`): no random mask is drawn,
so what runs is residual + (x + bias), one pointwise add of three tensors, not the kernel a
profile's "bias_dropout_add" rate was measured on (docs/calibration/h100_apportioning.md,
"Bias-dropout-add at dropout 0")."""


RESIDUAL_ADD_KERNEL = Module.RESIDUAL_GRAD_ADD.value
"""The bias-dropout-add's kernel at hidden dropout 0 without a linear bias (`Op.kernel`):
`residual + x`, one pointwise add of two activations into a third, the kernel of the
residual-grad add (`_norm_and_residual_backward`) and the same traffic, so priced by its rate."""


def bias_dropout_add_kernel(cfg: LayerConfig) -> str | None:
    """None (the module's own kind, "bias_dropout_add") where the layer drops; at hidden
    dropout 0, where Megatron-core's `_bias_dropout_add_func`
    (megatron/core/fusions/fused_bias_dropout.py) calls `F.dropout(x, p=0)`, which returns its
    input (ATen `Dropout.cpp`: p == 0 is the identity), and its `jit_fuser` compiles what is left
    into one add: the bias add (`BIAS_ADD_KERNEL`), or, without a linear bias (`bias is None`:
    `out = residual + dropout(x)`, Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553), the
    residual add (`RESIDUAL_ADD_KERNEL`)."""
    if cfg.hidden_dropout > 0:
        return None
    return BIAS_ADD_KERNEL if cfg.add_bias_linear else RESIDUAL_ADD_KERNEL


def _bias_dropout_add(cfg: LayerConfig, name: str) -> Op:
    """Megatron's fused bias-dropout-add: reads branch and residual, writes out and a
    one-byte mask; keeps the mask, sbh (÷t with SP). With hidden dropout 0 the dropout
    returns its input: no mask is written or kept (ATen `Dropout.cpp`: p == 0 is the identity),
    and the kernel is a bias add (`bias_dropout_add_kernel`). Without a linear bias the same
    activations move (the bias is h elements) and the kernel is `residual + dropout(x)`."""
    elements = cfg.region_tokens * cfg.hidden_size
    mask = MASK_BYTES if cfg.hidden_dropout > 0 else 0
    return elementwise(
        name, (3 * cfg.element_bytes + mask) * elements, mask * elements, module=Module.BIAS_DROPOUT_ADD,
        pass_=Pass.FORWARD, kernel=bias_dropout_add_kernel(cfg),
    )  # fmt: skip


def _rope(cfg: LayerConfig, name: str, pass_: Pass) -> tuple[Op, ...]:
    """Rotary embedding on Q and K (TE's fused kernel, `FusedRoPEFunc`): reads and writes
    (q + k)/t per token each way; keeps only its frequency table (≈0). None with learned
    absolute positions (added in the embedding)."""
    if cfg.position_embedding is not PositionEmbedding.ROPE:
        return ()
    return (
        elementwise(
            name, 2 * _slice_bytes(cfg, cfg.query_width + cfg.kv_width), module=Module.ROPE, pass_=pass_
        ),
    )


def _qk_norm(cfg: LayerConfig, pass_: Pass) -> tuple[Op, ...]:
    """`--qk-layernorm` (Qwen3): Megatron-core's `SelfAttention.get_query_key_value_tensors`
    (megatron/core/transformer/attention.py, Megatron-LM @d7288711ba278d160d2a5a22c099915c9fe1395c,
    the commit Megatron-Bridge v0.4.0 pins) applies `q_layernorm` to the query heads
    [s, b, a/t, d] and `k_layernorm` to the key heads [s, b, g/t, d] after the QKV split,
    before RoPE; in the TE spec both are `TENorm` (`te.pytorch.RMSNorm` or `LayerNorm`, the
    model's kind; gpt_layer_specs.py `backend.layer_norm(for_qk=True)`). TE's norm op
    (transformer_engine/pytorch/ops/basic/rmsnorm.py `op_forward`, TransformerEngine
    @71bbefbf153418f943640df0f7373625dc93fa46) runs on `input_.contiguous()` and saves it:
    the key is a strided view of the QKV output, so it is copied first (read and write
    k/t); the query's copy (its `reshape` to heads where a rank holds several groups of
    several heads, else the norm's `.contiguous()` of the view: the same bytes) is
    `_query_copy`, before these.
    Forward: the key copy, then each norm reads x and writes y (2 bytes each per element)
    and keeps its input, e·s·b·(q + k)/t in all. Backward (`op_backward`): each norm reads x
    and dy and writes dx (3 per element), as `_norm_and_residual_backward`'s norm; the
    h/a-sized weight gradients' reduction inside the kernel is not counted (as ln1 / ln2's).
    The fp32 rsigma per row is not counted either (docs/memory.md: the norms' statistics)."""
    if not cfg.qk_layernorm:
        return ()
    q, k = _slice_bytes(cfg, cfg.query_width), _slice_bytes(cfg, cfg.kv_width)
    kernel, norm = norm_kernel(cfg), Module.QK_NORM
    if pass_ is Pass.FORWARD:
        # the copy is priced by the generic memory-bound curve (no profile kind of its own)
        return (
            elementwise("attn.key_copy", 2 * k, module=Module.KEY_COPY, pass_=pass_),
            elementwise("attn.q.ln", 2 * q, q, module=norm, pass_=pass_, kernel=kernel),
            elementwise("attn.k.ln", 2 * k, k, module=norm, pass_=pass_, kernel=kernel),
        )
    return (
        elementwise("attn.q.ln.bwd", 3 * q, module=norm, pass_=pass_, kernel=kernel),
        elementwise("attn.k.ln.bwd", 3 * k, module=norm, pass_=pass_, kernel=kernel),
    )


def query_copied(cfg: LayerConfig) -> bool:
    """Whether the query heads are copied out of the QKV GEMM output before the norms,
    RoPE and the core. `SelfAttention.get_query_key_value_tensors`
    (megatron/core/transformer/attention.py:1474, Megatron-LM
    @d7288711ba278d160d2a5a22c099915c9fe1395c) splits the output viewed as
    [s, b, g/t, (a/g + 2)·d] and runs `query.reshape(s, b, -1, d)` on the strided
    [s, b, g/t, (a/g)·d] query part: a view when a rank holds one group (g/t = 1) or groups
    of one head (a/g = 1), else a copy. Where it is a view, `--qk-layernorm` still copies
    it: TE's norm op runs on `input_.contiguous()` (TransformerEngine
    @71bbefbf153418f943640df0f7373625dc93fa46 transformer_engine/pytorch/ops/basic/rmsnorm.py
    `op_forward`) and the view is not contiguous (rows of (a/g + 2)·d). With RoPE the view
    goes to RoPE, which writes a new Q (`_rope`); without RoPE TE's layout check may copy it
    (`layout_copies`). MLA layers replace this block (`workload.mla_layer`)."""
    groups, per_group = cfg.kv_heads_per_rank, cfg.num_attention_heads // cfg.query_groups
    return (groups > 1 and per_group > 1) or cfg.qk_layernorm


def _query_copy(cfg: LayerConfig) -> tuple[Op, ...]:
    """The query copy (`query_copied`): reads and writes e·s·b·q/t. Its backward is a view
    (`reshape` of a contiguous gradient). Keeps nothing of its own: the copy is what the norm,
    RoPE or the core reads and saves, counted there."""
    if not query_copied(cfg):
        return ()
    q = _slice_bytes(cfg, cfg.query_width)
    return (elementwise("attn.query_copy", 2 * q, module=Module.QUERY_COPY, pass_=Pass.FORWARD),)


def layout_copies(cfg: LayerConfig) -> tuple[bool, bool, bool]:
    """Which of Q, K, V Transformer Engine's `DotProductAttention.forward` copies before its
    core (fused, flash or unfused alike: it settles the layout first) with `get_qkv_layout`
    (TransformerEngine @71bbefbf153418f943640df0f7373625dc93fa46
    transformer_engine/pytorch/attention/dot_product_attention/utils.py:2055): a layout it
    does not recognise makes q, k and v `.contiguous()`, a copy for each that is a view.
    V is always the strided [s, b, g/t, d] view of the QKV output.
    - RoPE or QK-norm: Q and K are new contiguous tensors, V's strides do not match K's
      (no sbhd_sbhd_sbhd), so V alone is copied: the layers the scenarios run.
    - neither, MHA (a/g = 1): the three views are TE's sbh3d layout, kept: nothing.
    - neither, GQA: K and V views at a non-zero offset match no layout: K and V are copied,
      and Q where it is still a view (not `query_copied`)."""
    if cfg.position_embedding is PositionEmbedding.ROPE or cfg.qk_layernorm:
        return False, False, True
    if cfg.query_groups == cfg.num_attention_heads:
        return False, False, False
    return not query_copied(cfg), True, True


def _value_copy(cfg: LayerConfig) -> tuple[Op, ...]:
    """TE's layout copy (`layout_copies`; the V copy in the RoPE layers): reads and writes
    each copied tensor, e·s·b·k/t for K or V, e·s·b·q/t for Q. Part of the core (it runs in
    `DotProductAttention.forward`, so the selective `core_attn` checkpoint re-runs it). Its
    backward is the identity (no kernel). Keeps nothing of its own: the copies are the Q,
    K, V the core saves, counted there."""
    q, k, v = layout_copies(cfg)
    moved = 2 * _slice_bytes(cfg, q * cfg.query_width + (k + v) * cfg.kv_width)
    if not moved:
        return ()
    return (elementwise("attn.value_copy", moved, module=Module.VALUE_COPY, pass_=Pass.FORWARD),)


def qkv_grad_concatenated(cfg: LayerConfig) -> bool:
    """Whether the QKV split's backward concatenates dq, dk and dv as an op of its own. TE's
    `SplitAlongDim` (the split of `get_query_key_value_tensors`, attention.py:1469;
    transformer_engine/pytorch/utils.py:362 `_SplitAlongDim.backward`) returns the
    gradients' storage as is only when they are views of one buffer laid out as the split's
    output, and else runs `torch.cat` (torch.split's backward, without TE, is the same cat).
    TE's fused attention on the sbh3d layout writes them so
    (transformer_engine/pytorch/csrc/extensions/attention.cpp: `NVTE_H3D`, dQ, dK, dV slices
    of one dQKV): flash, MHA, no RoPE, no QK-norm, no concat. Every other flash layer
    concatenates (dq and dk come from RoPE's / the norms' backward, or TE made the layout
    contiguous). The unfused core concatenates too, but that cat is already part of the
    context copy's backward site the profiler times and fits (`profiler.bench.sites`,
    `context_layout`: "the concatenation of the Q, K, V gradients into the QKV layout"), so
    it is not added again here."""
    sbh3d = (
        cfg.query_groups == cfg.num_attention_heads
        and cfg.position_embedding is not PositionEmbedding.ROPE
        and not cfg.qk_layernorm
    )
    return cfg.flash and not sbh3d


def _qkv_grad_concat(cfg: LayerConfig) -> tuple[Op, ...]:
    """The concat (`qkv_grad_concatenated`): reads dq, dk, dv and writes dQKV,
    2·e·s·b·(q + 2k)/t, before the QKV linear's backward."""
    if not qkv_grad_concatenated(cfg):
        return ()
    moved = 2 * _slice_bytes(cfg, cfg.qkv_width)
    return (
        elementwise("attn.qkv_grad_concat.bwd", moved, module=Module.QKV_GRAD_CONCAT, pass_=Pass.INPUT_GRAD),
    )


def _kv_repeat(cfg: LayerConfig, name: str, pass_: Pass) -> tuple[Op, ...]:
    """Megatron-core's unfused core with GQA repeats each of the g/t K and V heads to the
    a/t query heads (`repeat_interleave` in `DotProductAttention.forward`): reads 2k/t,
    writes 2q/t per token; its backward sums each group's gradients back. None without GQA."""
    if cfg.query_groups == cfg.num_attention_heads:
        return ()
    moved = 2 * (_slice_bytes(cfg, cfg.kv_width) + _slice_bytes(cfg, cfg.query_width))
    return (elementwise(name, moved, module=Module.KV_REPEAT, pass_=pass_),)


def flash_attention_shape(cfg: LayerConfig, backward: bool = False) -> AttentionShape:
    """The layer's causal self-attention on a rank: b sequences, a/t query and g/t key/value
    heads, s queries against s keys, within the layer's sliding window if it has one.
    (Context parallelism narrows seq_q / seq_k; it is refused with a window.)"""
    return AttentionShape(
        batch=cfg.micro_batch_size,
        heads=cfg.heads_per_rank,
        kv_heads=cfg.kv_heads_per_rank,
        seq_q=cfg.seq_length,
        seq_k=cfg.seq_length,
        head_dim=cfg.head_dim,
        causal=True,
        backward=backward,
        kernel=cfg.attention_kernel,
        window_size=cfg.window_size,
        softmax_type=cfg.softmax_type,
    )


def _attention_core_forward(cfg: LayerConfig) -> tuple[Op, ...]:
    """The attention core on a rank. Unfused: QKᵀ, fused scale-mask-softmax, dropout, ×V on
    a/t heads, 5as²b/t + 6sbh/t kept (K and V repeated to q wide under GQA, so the same).
    Flash: one kernel keeping Q, K, V, O and the fp32 LSE, 2sb(2q + 2k)/t + 4sba/t
    (docs/memory.md); proj's input O is the same storage (TE `linear.py`)."""
    if cfg.flash:
        q, k = _slice_bytes(cfg, cfg.query_width), _slice_bytes(cfg, cfg.kv_width)
        lse = LSE_BYTES * cfg.micro_batch_size * cfg.heads_per_rank * cfg.seq_length
        shape = flash_attention_shape(cfg)
        flash = flash_attention("attn.flash", shape, saved_bytes=2 * q + 2 * k + lse, pass_=Pass.FORWARD)
        return (*_value_copy(cfg), flash)
    e, s, d = cfg.element_bytes, cfg.seq_length, cfg.head_dim
    batch = cfg.micro_batch_size * cfg.heads_per_rank
    q_slice = _slice_bytes(cfg, cfg.query_width)
    kv_slice = q_slice  # K and V reach the GEMMs repeated to the a/t query heads: q wide
    scores = cfg.score_elements
    dropout: tuple[Op, ...] = ()
    probs_saved = 0.0  # without dropout ×V keeps the softmax output, which the softmax keeps
    if cfg.attention_dropout > 0:
        dropout = (
            elementwise(
                "attn.dropout",
                (2 * e + MASK_BYTES) * scores,
                saved_bytes=MASK_BYTES * scores,
                module=Module.ATTENTION_DROPOUT,
                pass_=Pass.FORWARD,
            ),  # fmt: skip
        )
        probs_saved = e * scores  # ×V keeps the dropout output
    return (
        *_value_copy(cfg),
        *_kv_repeat(cfg, "attn.kv_repeat", Pass.FORWARD),
        gemm(
            "attn.qk",
            GemmShape(m=s, n=s, k=d, batch=batch),
            saved_bytes=q_slice + kv_slice,
            module=Module.QK,
            pass_=Pass.FORWARD,
        ),  # fmt: skip
        elementwise(
            "attn.softmax", 2 * e * scores, saved_bytes=e * scores, module=Module.SOFTMAX, pass_=Pass.FORWARD
        ),
        *dropout,
        gemm(
            "attn.av",
            GemmShape(m=s, n=d, k=s, batch=batch),
            saved_bytes=probs_saved + kv_slice,
            module=Module.AV,
            pass_=Pass.FORWARD,
        ),  # fmt: skip
    )


def _attention_block_forward(cfg: LayerConfig, core: tuple[Op, ...]) -> tuple[Op, ...]:
    e, tokens, h, t = cfg.element_bytes, cfg.tokens, cfg.hidden_size, cfg.tp
    q = cfg.query_width
    region_in = e * cfg.region_tokens * h
    # the unfused core's context [b, a/t, s, d] is permuted to [s, b, q/t]; flash writes it so
    context_copy = (
        ()
        if cfg.flash
        else (
            elementwise(
                "attn.context_copy", 2 * e * tokens * q / t, module=Module.CONTEXT_COPY, pass_=Pass.FORWARD
            ),
        )
    )
    return (
        _layer_norm(cfg, "ln1"),
        *_tp_enter(cfg, "attn", Module.QKV),
        gemm(
            "attn.qkv",
            GemmShape(m=tokens, n=cfg.qkv_width // t, k=h),
            saved_bytes=region_in,
            module=Module.QKV,
            pass_=Pass.FORWARD,
        ),  # fmt: skip
        *_query_copy(cfg),
        *_qk_norm(cfg, Pass.FORWARD),
        *_rope(cfg, "attn.rope", Pass.FORWARD),
        *core,
        *context_copy,
        gemm(
            "attn.proj",
            GemmShape(m=tokens, n=h, k=q // t),
            saved_bytes=0.0 if cfg.flash else e * tokens * q / t,
            module=Module.PROJ,
            pass_=Pass.FORWARD,
        ),
        *_tp_exit(cfg, "attn", Module.PROJ),
        _bias_dropout_add(cfg, "attn.bias_dropout_add"),
    )


def _activation_forward(cfg: LayerConfig) -> Op:
    """The MLP's element-wise kernel on [s, b, fc1 width/t]. GeLU (Megatron's fused
    bias-GeLU): reads x, writes y, keeps x. SwiGLU (`bias_swiglu_impl`): reads gate and up
    (2f), writes f, keeps its 2f-wide input (`fusions/fused_bias_swiglu.py`). Squared ReLU: reads x,
    writes relu(x)², keeps x."""
    e, tokens, t, f = cfg.element_bytes, cfg.tokens, cfg.tp, cfg.ffn_hidden_size
    forward = Pass.FORWARD
    if cfg.activation is Activation.SWIGLU:
        saved = 2 * e * tokens * f / t
        return elementwise("mlp.swiglu", 3 * e * tokens * f / t, saved, module=Module.SWIGLU, pass_=forward)
    if cfg.activation is Activation.SQUARED_RELU:
        saved = e * tokens * f / t
        return elementwise(
            "mlp.squared_relu", 2 * e * tokens * f / t, saved, module=Module.SQUARED_RELU, pass_=forward
        )
    return elementwise(
        "mlp.bias_gelu", 2 * e * tokens * f / t, e * tokens * f / t, module=Module.BIAS_GELU, pass_=forward
    )


def _activation_backward(cfg: LayerConfig) -> Op:
    """GeLU: reads x and dy, writes dx, the bias-grad reduction re-reads dx (4); without a
    linear bias (3): Megatron turns the bias-GeLU fusion off (megatron/training/arguments.py
    `if not args.add_bias_linear: args.bias_gelu_fusion = False`; TransformerConfig refuses
    the fusion for GeLU without a bias) and mlp.py `MLP.forward` runs `F.gelu` alone, whose
    backward has no bias gradient (Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553);
    priced at the bias-GeLU kernel's rate, one element-wise kernel of the same traffic.
    SwiGLU: reads x (2f) and dy (f), writes dx (2f) (5f); `bias_swiglu_impl` with bias None
    runs `SwiGLUFunction` (fusions/fused_bias_swiglu.py), the same bytes. Squared ReLU:
    reads x and dy, writes dx (3)."""
    e, tokens, t, f = cfg.element_bytes, cfg.tokens, cfg.tp, cfg.ffn_hidden_size
    backward = Pass.INPUT_GRAD
    if cfg.activation is Activation.SWIGLU:
        return elementwise("mlp.swiglu.bwd", 5 * e * tokens * f / t, module=Module.SWIGLU, pass_=backward)
    if cfg.activation is Activation.SQUARED_RELU:
        return elementwise(
            "mlp.squared_relu.bwd", 3 * e * tokens * f / t, module=Module.SQUARED_RELU, pass_=backward
        )
    moved = (4 if cfg.add_bias_linear else 3) * e * tokens * f / t
    return elementwise("mlp.bias_gelu.bwd", moved, module=Module.BIAS_GELU, pass_=backward)


def _mlp_block_forward(cfg: LayerConfig) -> tuple[Op, ...]:
    e, tokens, h, t, f = cfg.element_bytes, cfg.tokens, cfg.hidden_size, cfg.tp, cfg.ffn_hidden_size
    region_in = e * cfg.region_tokens * h
    return (
        _layer_norm(cfg, "ln2"),
        *_tp_enter(cfg, "mlp", Module.FC1),
        gemm(
            "mlp.fc1",
            GemmShape(m=tokens, n=cfg.fc1_width // t, k=h),
            saved_bytes=region_in,
            module=Module.FC1,
            pass_=Pass.FORWARD,
        ),  # fmt: skip
        _activation_forward(cfg),
        gemm(
            "mlp.fc2",
            GemmShape(m=tokens, n=h, k=f // t),
            saved_bytes=e * tokens * f / t,
            module=Module.FC2,
            pass_=Pass.FORWARD,
        ),  # fmt: skip
        *_tp_exit(cfg, "mlp", Module.FC2),
        _bias_dropout_add(cfg, "mlp.bias_dropout_add"),
    )


def _row_parallel_backward(
    cfg: LayerConfig, name: str, module: Module, n_in: int, n_out: int
) -> tuple[Op, ...]:
    """Backward of bias-dropout-add, the ḡ/f̄ conjugate, and the row-parallel GEMM
    Y[tokens, n_out] = X[tokens, n_in] · W."""
    e, tokens = cfg.element_bytes, cfg.tokens
    ops: list[Op] = list(_bias_dropout_add_backward(cfg, name))
    if cfg.sequence_parallel:
        full = e * tokens * cfg.hidden_size
        ops.append(
            collective(
                f"{name}.allgather.bwd", CollectiveKind.ALL_GATHER, full, module=module, pass_=Pass.INPUT_GRAD
            )
        )
    ops += [
        gemm(f"{name}.dgrad", GemmShape(m=tokens, n=n_in, k=n_out), module=module, pass_=Pass.INPUT_GRAD),
        gemm(
            f"{name}.wgrad",
            GemmShape(m=n_in, n=n_out, k=tokens, accumulate_fp32=True),
            module=module,
            pass_=Pass.WEIGHT_GRAD,
        ),  # fmt: skip
    ]
    return tuple(ops)


def _bias_dropout_add_backward(cfg: LayerConfig, name: str) -> tuple[Op, ...]:
    """The bias-dropout-add's backward: mask and grad in, grad out, plus the bias-grad
    reduction re-reading the grad (3e + mask per element). At dropout 0 the adds pass the
    gradient through (no kernel) and only the bias-grad reduction reads it (e). Without a
    linear bias (`_bias_dropout_add_func` with bias None: `residual + dropout(x)`) there is
    no reduction: the dropout's backward alone (2e + mask), and at dropout 0 no kernel."""
    e, region = cfg.element_bytes, cfg.region_tokens * cfg.hidden_size
    reduction = e if cfg.add_bias_linear else 0
    grad_bytes = (2 * e + MASK_BYTES + reduction) if cfg.hidden_dropout > 0 else reduction
    if grad_bytes == 0:
        return ()
    return (
        elementwise(
            f"{name}.bias_dropout_add.bwd",
            grad_bytes * region,
            module=Module.BIAS_DROPOUT_ADD,
            pass_=Pass.INPUT_GRAD,
            kernel=bias_dropout_add_kernel(cfg),
        ),  # fmt: skip
    )


def _column_parallel_backward(cfg: LayerConfig, name: str, module: Module, n_out: int) -> tuple[Op, ...]:
    """Backward of the column-parallel GEMM Y[tokens, n_out] = X[tokens, h] · W and the f/g
    conjugate. Megatron overlaps the input-grad all-reduce (SP: reduce-scatter) with the
    weight-grad GEMM, and with SP re-gathers the sharded input while the dgrad runs (for the
    weight-grad GEMM, so in its pass)."""
    e, tokens, h = cfg.element_bytes, cfg.tokens, cfg.hidden_size
    full = e * tokens * h
    ops: list[Op] = []
    if cfg.sequence_parallel:
        gather = f"{name}.input_allgather.bwd"
        ops.append(
            collective(gather, CollectiveKind.ALL_GATHER, full, True, module=module, pass_=Pass.WEIGHT_GRAD)
        )
    ops.append(gemm(f"{name}.dgrad", GemmShape(m=tokens, n=h, k=n_out), module=module, pass_=Pass.INPUT_GRAD))
    if cfg.tp > 1:
        kind = CollectiveKind.REDUCE_SCATTER if cfg.sequence_parallel else CollectiveKind.ALL_REDUCE
        reduce = f"{name}.{kind.value.replace('_', '')}.bwd"
        ops.append(collective(reduce, kind, full, True, module=module, pass_=Pass.INPUT_GRAD))
    wgrad = GemmShape(m=h, n=n_out, k=tokens, accumulate_fp32=True)
    ops.append(gemm(f"{name}.wgrad", wgrad, module=module, pass_=Pass.WEIGHT_GRAD))
    return tuple(ops)


def _norm_and_residual_backward(cfg: LayerConfig, name: str) -> tuple[Op, ...]:
    """Layer-norm backward (reads x and dy, writes dx) and the residual-grad add."""
    elements = cfg.region_tokens * cfg.hidden_size
    e = cfg.element_bytes
    return (
        elementwise(
            f"{name}.bwd",
            3 * e * elements,
            module=Module.LAYERNORM,
            pass_=Pass.INPUT_GRAD,
            kernel=norm_kernel(cfg),
        ),
        elementwise(
            f"{name}.residual_grad_add",
            3 * e * elements,
            module=Module.RESIDUAL_GRAD_ADD,
            pass_=Pass.INPUT_GRAD,
        ),
    )


def _mlp_block_backward(cfg: LayerConfig) -> tuple[Op, ...]:
    t, f = cfg.tp, cfg.ffn_hidden_size
    return (
        *_row_parallel_backward(cfg, "mlp.fc2", Module.FC2, n_in=f // t, n_out=cfg.hidden_size),
        _activation_backward(cfg),
        *_column_parallel_backward(cfg, "mlp.fc1", Module.FC1, n_out=cfg.fc1_width // t),
        *_norm_and_residual_backward(cfg, "ln2"),
    )


def _attention_core_backward(cfg: LayerConfig) -> tuple[Op, ...]:
    """Flash: one backward kernel (2.5 × the forward's FLOPs, docs/cost_model.md). Unfused: the
    four batched GEMMs and the dropout and softmax backwards, then the GQA group sum."""
    if cfg.flash:
        return (
            flash_attention(
                "attn.flash.bwd", flash_attention_shape(cfg, backward=True), pass_=Pass.INPUT_GRAD
            ),
        )
    e, tokens, q, t = cfg.element_bytes, cfg.tokens, cfg.query_width, cfg.tp
    s, d = cfg.seq_length, cfg.head_dim
    batch = cfg.micro_batch_size * cfg.heads_per_rank
    scores = cfg.score_elements
    b = Pass.INPUT_GRAD
    dropout = (
        (
            elementwise(
                "attn.dropout.bwd", (2 * e + MASK_BYTES) * scores, module=Module.ATTENTION_DROPOUT, pass_=b
            ),
        )
        if cfg.attention_dropout > 0
        else ()
    )
    return (
        elementwise("attn.context_copy.bwd", 2 * e * tokens * q / t, module=Module.CONTEXT_COPY, pass_=b),
        gemm(
            "attn.av.dgrad_probs",
            GemmShape(m=s, n=s, k=d, batch=batch),
            module=Module.AV,
            pass_=b,
            grad_of=GradOf.PROBS,
        ),
        gemm(
            "attn.av.dgrad_v",
            GemmShape(m=s, n=d, k=s, batch=batch),
            module=Module.AV,
            pass_=b,
            grad_of=GradOf.V,
        ),
        *dropout,
        elementwise("attn.softmax.bwd", 3 * e * scores, module=Module.SOFTMAX, pass_=b),
        gemm(
            "attn.qk.dgrad_q",
            GemmShape(m=s, n=d, k=s, batch=batch),
            module=Module.QK,
            pass_=b,
            grad_of=GradOf.Q,
        ),
        gemm(
            "attn.qk.dgrad_k",
            GemmShape(m=s, n=d, k=s, batch=batch),
            module=Module.QK,
            pass_=b,
            grad_of=GradOf.K,
        ),
        *_kv_repeat(cfg, "attn.kv_repeat.bwd", b),
    )


def _attention_block_backward(cfg: LayerConfig) -> tuple[Op, ...]:
    h, t = cfg.hidden_size, cfg.tp
    return (
        *_row_parallel_backward(cfg, "attn.proj", Module.PROJ, n_in=cfg.query_width // t, n_out=h),
        *_attention_core_backward(cfg),
        *_rope(cfg, "attn.rope.bwd", Pass.INPUT_GRAD),
        *_qk_norm(cfg, Pass.INPUT_GRAD),
        *_qkv_grad_concat(cfg),
        *_column_parallel_backward(cfg, "attn.qkv", Module.QKV, n_out=cfg.qkv_width // t),
        *_norm_and_residual_backward(cfg, "ln1"),
    )
