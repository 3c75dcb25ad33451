"""The op graph of a multi-latent-attention (MLA) layer on one rank: the dense layer's ops
with its attention block (QKV, RoPE, core, projection and their TP collectives) replaced by
Megatron-core's `MLASelfAttention`, as `workload.moe_layer` replaces the MLP.

Megatron-core `MLASelfAttention.get_query_key_value_tensors` and `forward`
(megatron/core/transformer/multi_latent_attention.py, Megatron-LM
@d98e8a64ddf34856e74b24714e3bedb2f5a39553), forward, per rank and microbatch, T = s·b/cp
tokens, r = 1/tp with sequence parallelism (SP):

    q_down    [T·r, h] x [h, q_lora]             TELinear "duplicated": every tp rank holds
    kv_down   [T·r, h] x [h, kv_lora + rope]       the weight, runs its own T·r tokens
    k_pos_emb gather (SP: all-gather of the rope part of kv_combined, [T, rope])
    q norm + [SP all-gather T·q_lora] + q_up   [T, q_lora] x [q_lora, n/tp·(qk + rope)]
    kv norm + [SP all-gather T·kv_lora] + kv_up [T, kv_lora] x [kv_lora, n/tp·(qk + v)]
        (TELayerNormColumnParallelLinear: the latent norm runs on the local shard, the
        all-gather carries its output)
    RoPE on q's and k's rope parts, Q and K assembled (qk + rope wide, k_pos_emb shared by
        every head: DeepSeek-V2's decoupled RoPE)
    core attention (flash)   Q·Kᵀ over qk + rope, P·V over v, n/tp heads
    proj      [T, n/tp·v] x [n/tp·v, h]          row-parallel, then all-reduce / SP reduce-scatter

Every GEMM shape comes from `mla.mla_rank_gemms` and the saved bytes add up to
`mla.mla_saved_bytes` (tests/workload/test_mla_layer.py). The backward is the mirror: each
GEMM's input-gradient and weight-gradient GEMMs, each all-gather's reduce-scatter (the
column-parallel input gradients) and the re-gather of the SP-sharded latent for the
weight gradient, as the dense layer's column-parallel backward does.

Not priced: the TP all-reduce of the duplicated down projections' weight gradients
(Megatron marks them `sequence_parallel` and `finalize_model_grads` all-reduces them over
tp once per step with the norms' gradients, h·(q_lora + kv_lora + rope) elements a layer;
the dense layer's norm gradients are not priced either); the RoPE / Q-K assembly kernel is
an estimate (read and write Q and K once each way).

Recompute (`training.recompute_modules`, Megatron-core `--recompute-modules`): `core_attn`
keeps Q, K, V (and O, proj's input) and re-runs the flash forward, freeing the LSE;
`mla_up_proj` (`CheckpointWithoutOutput` around the up projections and RoPE) keeps the
checkpoint's inputs (the latents and the gathered k_pos_emb), discards Q, K, V and the
norms' outputs after the core, and re-runs the latent norms, their gathers, the up
projections and RoPE before the core's backward. Full recompute keeps the layer input only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from simcluster.config.choices import Recompute
from simcluster.workload.layer import LayerOps, norm_kernel
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.mla import FLASH_LSE_BYTES, MLAShape, mla_rank_gemms
from simcluster.workload.moe_config import MLAConfig
from simcluster.workload.ops import (
    AttentionShape,
    CollectiveKind,
    GemmShape,
    Module,
    Op,
    Pass,
    collective,
    elementwise,
    flash_attention,
    gemm,
)

DENSE_ATTENTION_MODULES = frozenset(
    {
        Module.QKV,
        Module.QUERY_COPY,
        Module.ROPE,
        Module.VALUE_COPY,
        Module.KV_REPEAT,
        Module.FLASH,
        Module.QK,
        Module.SOFTMAX,
        Module.ATTENTION_DROPOUT,
        Module.AV,
        Module.CONTEXT_COPY,
        Module.PROJ,
        Module.QKV_GRAD_CONCAT,
    }
)
"""The dense layer's attention block between ln1 and the bias-dropout-add (linears, their
TP collectives, RoPE, the core and the QKV split's copies): the run of ops an MLA layer replaces."""


@dataclass(frozen=True, slots=True)
class MLALayerSpec:
    """What makes an MLA layer's attention differ from the dense layer's: the latent shape,
    and which of Megatron-core's recompute modules act on it (read from the scenario's
    `training.recompute_modules`: `core_attn` is the default of selective recompute)."""

    mla: MLAConfig
    recompute_core_attn: bool = False
    recompute_up_proj: bool = False


def _shape(cfg: LayerConfig, spec: MLALayerSpec) -> MLAShape:
    return MLAShape(cfg.hidden_size, cfg.num_attention_heads, spec.mla)


def mla_attention_shape(cfg: LayerConfig, spec: MLALayerSpec, backward: bool = False) -> AttentionShape:
    """The core on a rank: n/tp heads, Q·Kᵀ over qk + rope, P·V over v (one K/V head per
    query head after the up projection: MLA has no GQA groups)."""
    heads = cfg.num_attention_heads // cfg.tp
    return AttentionShape(
        batch=cfg.micro_batch_size,
        heads=heads,
        kv_heads=heads,
        seq_q=cfg.seq_length,
        seq_k=cfg.seq_length,
        head_dim=spec.mla.q_head_dim,
        causal=True,
        backward=backward,
        kernel=cfg.attention_kernel,
        v_head_dim=spec.mla.v_head_dim,
    )


@dataclass(frozen=True, slots=True)
class _Sizes:
    """Per-rank sizes: T tokens, local T·r, heads n/tp, element bytes."""

    tokens: int
    local: float
    heads: int
    e: int

    @classmethod
    def of(cls, cfg: LayerConfig) -> _Sizes:
        return cls(cfg.tokens, cfg.region_tokens, cfg.num_attention_heads // cfg.tp, cfg.element_bytes)


def _gather(cfg: LayerConfig, name: str, width: int, module: Module, pass_: Pass) -> tuple[Op, ...]:
    """SP all-gather of a [T·r, width] shard to [T, width] (none without SP)."""
    if not cfg.sequence_parallel:
        return ()
    full = cfg.element_bytes * cfg.tokens * width
    return (collective(name, CollectiveKind.ALL_GATHER, full, module=module, pass_=pass_),)


def _latent_norm(cfg: LayerConfig, name: str, elements: float, saved: float) -> Op:
    """A latent norm on the rank's shard: reads x, writes y. Megatron-core builds q_layernorm /
    kv_layernorm with the model's `--normalization` (DeepSeek-V3: RMSNorm), so it runs the
    model's norm kernel (`layer.norm_kernel`)."""
    e = cfg.element_bytes
    return elementwise(
        name, 2 * e * elements, saved, module=Module.LAYERNORM, pass_=Pass.FORWARD, kernel=norm_kernel(cfg)
    )


def _up_proj_forward(cfg: LayerConfig, spec: MLALayerSpec, keep: bool) -> tuple[Op, ...]:
    """Latent norms, their SP gathers, the up projections and RoPE: what `mla_up_proj`
    re-runs. `keep`: the norms' outputs and the latents saved (else only the latents)."""
    m, s = spec.mla, _Sizes.of(cfg)
    gemms = mla_rank_gemms(_shape(cfg, spec), s.tokens, cfg.tp, cfg.sequence_parallel)
    q_lora = m.q_lora_rank or 0
    kv_combined = s.local * (m.kv_lora_rank + m.qk_pos_emb_head_dim) * s.e
    ops: list[Op] = []
    if m.q_lora_rank:
        ops += [
            _latent_norm(cfg, "attn.q_up.ln", s.local * q_lora, s.local * q_lora * s.e),
            *_gather(cfg, "attn.q_up.allgather", q_lora, Module.MLA_UP, Pass.FORWARD),
            gemm(
                "attn.q_up",
                gemms["attn.q_up"],
                s.local * q_lora * s.e if keep else 0.0,
                module=Module.MLA_UP,
                pass_=Pass.FORWARD,
            ),
        ]
    else:
        ops += [
            *_gather(cfg, "attn.q_proj.allgather", cfg.hidden_size, Module.MLA_Q_PROJ, Pass.FORWARD),
            gemm("attn.q_proj", gemms["attn.q_proj"], module=Module.MLA_Q_PROJ, pass_=Pass.FORWARD),
        ]
    ops += [
        _latent_norm(cfg, "attn.kv_up.ln", s.local * m.kv_lora_rank, kv_combined),
        *_gather(cfg, "attn.kv_up.allgather", m.kv_lora_rank, Module.MLA_UP, Pass.FORWARD),
        gemm(
            "attn.kv_up",
            gemms["attn.kv_up"],
            s.local * m.kv_lora_rank * s.e if keep else 0.0,
            module=Module.MLA_UP,
            pass_=Pass.FORWARD,
        ),
        elementwise("attn.rope", _rope_bytes(cfg, spec), module=Module.ROPE, pass_=Pass.FORWARD),
    ]
    return tuple(ops)


def _rope_bytes(cfg: LayerConfig, spec: MLALayerSpec) -> float:
    """RoPE on the rope parts and Q, K assembled qk + rope wide: read and write Q and K
    (an estimate of the fused kernels' traffic, not measured)."""
    s = _Sizes.of(cfg)
    return 2.0 * s.e * s.tokens * s.heads * 2 * spec.mla.q_head_dim


def _saved_core(cfg: LayerConfig, spec: MLALayerSpec) -> float:
    """What the flash op keeps: Q, K, V, O and the LSE (O and the LSE under `mla_up_proj`,
    whose discarded Q, K, V are re-made; no LSE under `core_attn`)."""
    m, s = spec.mla, _Sizes.of(cfg)
    lse = s.tokens * s.heads * FLASH_LSE_BYTES
    out = s.tokens * s.heads * m.v_head_dim * s.e
    qkv = s.tokens * s.heads * s.e * (2 * m.q_head_dim + m.v_head_dim)
    kept = out + (0.0 if spec.recompute_core_attn else lse)
    return kept if spec.recompute_up_proj else kept + qkv


def _attention_forward(cfg: LayerConfig, spec: MLALayerSpec) -> tuple[Op, ...]:
    """The MLA block's forward between ln1 and the bias-dropout-add."""
    m, s = spec.mla, _Sizes.of(cfg)
    h = cfg.hidden_size
    gemms = mla_rank_gemms(_shape(cfg, spec), s.tokens, cfg.tp, cfg.sequence_parallel)
    down: list[Op] = []
    saved_input = s.local * h * s.e  # the down projections' input: ln1's output
    if m.q_lora_rank:
        down.append(
            gemm("attn.q_down", gemms["attn.q_down"], saved_input, module=Module.MLA_DOWN, pass_=Pass.FORWARD)
        )
        saved_input = 0.0
    down.append(
        gemm("attn.kv_down", gemms["attn.kv_down"], saved_input, module=Module.MLA_DOWN, pass_=Pass.FORWARD)
    )
    k_pos_saved = s.tokens * m.qk_pos_emb_head_dim * s.e if spec.recompute_up_proj else 0.0
    k_pos: tuple[Op, ...] = ()
    if cfg.sequence_parallel:
        full = s.e * s.tokens * m.qk_pos_emb_head_dim
        k_pos = (
            collective(
                "attn.k_pos_emb.allgather",
                CollectiveKind.ALL_GATHER,
                full,
                module=Module.MLA_DOWN,
                pass_=Pass.FORWARD,
            ),
        )
    up = _up_proj_forward(cfg, spec, keep=not spec.recompute_up_proj)
    if k_pos_saved:
        # the checkpoint keeps the gathered k_pos_emb (on the RoPE op: the gather may be absent)
        up = tuple(replace(op, saved_bytes=k_pos_saved) if op.module is Module.ROPE else op for op in up)
    reduce = CollectiveKind.REDUCE_SCATTER if cfg.sequence_parallel else CollectiveKind.ALL_REDUCE
    exit_: tuple[Op, ...] = ()
    if cfg.tp > 1:
        full = s.e * s.tokens * h
        exit_ = (
            collective(
                f"attn.{reduce.value.replace('_', '')}", reduce, full, module=Module.PROJ, pass_=Pass.FORWARD
            ),
        )
    return (
        *down,
        *k_pos,
        *up,
        flash_attention(
            "attn.flash", mla_attention_shape(cfg, spec), _saved_core(cfg, spec), pass_=Pass.FORWARD
        ),
        gemm("attn.proj", gemms["attn.proj"], module=Module.PROJ, pass_=Pass.FORWARD),
        *exit_,
    )


def _column_backward(
    cfg: LayerConfig, name: str, shape: GemmShape, width_in: int, module: Module
) -> tuple[Op, ...]:
    """Backward of a column-parallel GEMM [T, width_in] -> [T, n]: the SP re-gather of its
    input for the weight gradient, dgrad, the input-gradient reduce-scatter (all-reduce
    without SP) overlapping the wgrad, wgrad."""
    e, tokens = cfg.element_bytes, cfg.tokens
    full = e * tokens * width_in
    ops: list[Op] = []
    if cfg.sequence_parallel:
        ops.append(
            collective(
                f"{name}.input_allgather.bwd",
                CollectiveKind.ALL_GATHER,
                full,
                True,
                module=module,
                pass_=Pass.WEIGHT_GRAD,
            )
        )
    ops.append(
        gemm(
            f"{name}.dgrad", GemmShape(m=tokens, n=width_in, k=shape.n), module=module, pass_=Pass.INPUT_GRAD
        )
    )
    if cfg.tp > 1:
        kind = CollectiveKind.REDUCE_SCATTER if cfg.sequence_parallel else CollectiveKind.ALL_REDUCE
        ops.append(
            collective(
                f"{name}.{kind.value.replace('_', '')}.bwd",
                kind,
                full,
                True,
                module=module,
                pass_=Pass.INPUT_GRAD,
            )
        )
    wgrad = GemmShape(m=width_in, n=shape.n, k=tokens, accumulate_fp32=True)
    ops.append(gemm(f"{name}.wgrad", wgrad, module=module, pass_=Pass.WEIGHT_GRAD))
    return tuple(ops)


def _down_backward(name: str, shape: GemmShape) -> tuple[Op, ...]:
    """Backward of a duplicated down projection on the rank's own rows: no collective."""
    rows, n, h = shape.m, shape.n, shape.k
    return (
        gemm(f"{name}.dgrad", GemmShape(m=rows, n=h, k=n), module=Module.MLA_DOWN, pass_=Pass.INPUT_GRAD),
        gemm(
            f"{name}.wgrad",
            GemmShape(m=h, n=n, k=rows, accumulate_fp32=True),
            module=Module.MLA_DOWN,
            pass_=Pass.WEIGHT_GRAD,
        ),
    )


def _attention_backward(cfg: LayerConfig, spec: MLALayerSpec) -> tuple[Op, ...]:
    """The mirror of `_attention_forward`, from proj's gradient to the down projections'."""
    m, s = spec.mla, _Sizes.of(cfg)
    h = cfg.hidden_size
    gemms = mla_rank_gemms(_shape(cfg, spec), s.tokens, cfg.tp, cfg.sequence_parallel)
    B, W = Pass.INPUT_GRAD, Pass.WEIGHT_GRAD
    proj: list[Op] = []
    if cfg.sequence_parallel:
        proj.append(
            collective(
                "attn.proj.allgather.bwd",
                CollectiveKind.ALL_GATHER,
                s.e * s.tokens * h,
                module=Module.PROJ,
                pass_=B,
            )
        )
    n_in = s.heads * m.v_head_dim
    proj += [
        gemm("attn.proj.dgrad", GemmShape(m=s.tokens, n=n_in, k=h), module=Module.PROJ, pass_=B),
        gemm(
            "attn.proj.wgrad",
            GemmShape(m=n_in, n=h, k=s.tokens, accumulate_fp32=True),
            module=Module.PROJ,
            pass_=W,
        ),
    ]
    ops: list[Op] = [
        *proj,
        flash_attention("attn.flash.bwd", mla_attention_shape(cfg, spec, backward=True), pass_=B),
        elementwise("attn.rope.bwd", _rope_bytes(cfg, spec), module=Module.ROPE, pass_=B),
        *_column_backward(cfg, "attn.kv_up", gemms["attn.kv_up"], m.kv_lora_rank, Module.MLA_UP),
        elementwise(
            "attn.kv_up.ln.bwd",
            3 * s.e * s.local * m.kv_lora_rank,
            module=Module.LAYERNORM,
            pass_=B,
            kernel=norm_kernel(cfg),
        ),
    ]
    if cfg.sequence_parallel:
        full = s.e * s.tokens * m.qk_pos_emb_head_dim
        ops.append(
            collective(
                "attn.k_pos_emb.reducescatter.bwd",
                CollectiveKind.REDUCE_SCATTER,
                full,
                module=Module.MLA_DOWN,
                pass_=B,
            )
        )
    ops += _down_backward("attn.kv_down", gemms["attn.kv_down"])
    if m.q_lora_rank:
        ops += [
            *_column_backward(cfg, "attn.q_up", gemms["attn.q_up"], m.q_lora_rank, Module.MLA_UP),
            elementwise(
                "attn.q_up.ln.bwd",
                3 * s.e * s.local * m.q_lora_rank,
                module=Module.LAYERNORM,
                pass_=B,
                kernel=norm_kernel(cfg),
            ),
            *_down_backward("attn.q_down", gemms["attn.q_down"]),
        ]
    else:
        ops += _column_backward(cfg, "attn.q_proj", gemms["attn.q_proj"], h, Module.MLA_Q_PROJ)
    return tuple(ops)


def _recompute(cfg: LayerConfig, spec: MLALayerSpec, forward: tuple[Op, ...]) -> tuple[Op, ...]:
    """The forward ops the backward re-runs (saved bytes 0): the up projections under
    `mla_up_proj`, the flash forward under `core_attn`."""
    ops: list[Op] = []
    if spec.recompute_up_proj:
        ops += _up_proj_forward(cfg, spec, keep=False)
    if spec.recompute_core_attn:
        ops += [op for op in forward if op.module is Module.FLASH]
    return tuple(replace(op, saved_bytes=0.0) for op in ops)


def _splice(ops: tuple[Op, ...], replacement: tuple[Op, ...]) -> tuple[Op, ...]:
    """`ops` with its run of dense attention ops replaced (contiguous in every pass)."""
    where = [i for i, op in enumerate(ops) if op.module in DENSE_ATTENTION_MODULES]
    if not where:
        return ops
    first, last = where[0], where[-1]
    if last - first + 1 != len(where):
        raise ValueError("the dense attention's ops are not one contiguous run; cannot place MLA")
    return ops[:first] + replacement + ops[last + 1 :]


@functools.lru_cache(maxsize=256)
def mla_attention_ops(
    cfg: LayerConfig, spec: MLALayerSpec
) -> tuple[tuple[Op, ...], tuple[Op, ...], tuple[Op, ...]]:
    """(forward, backward, recompute) of the MLA block on one rank (module docstring)."""
    forward = _attention_forward(cfg, spec)
    return forward, _attention_backward(cfg, spec), _recompute(cfg, spec, forward)


@functools.lru_cache(maxsize=256)
def mla_layer_ops(dense: LayerOps, cfg: LayerConfig, spec: MLALayerSpec) -> LayerOps:
    """The dense layer's ops (`dense`, recompute applied) with its attention block replaced
    by MLA. Full recompute keeps only the layer input and re-runs the whole forward;
    selective recompute re-runs what `spec`'s modules say (the dense layer's attention
    re-runs dropped) beside the dense layer's other recomputed ops."""
    forward, backward, recompute = mla_attention_ops(cfg, spec)
    if cfg.recompute is Recompute.FULL:
        zeroed = tuple(replace(op, saved_bytes=0.0) for op in forward)
        return LayerOps(
            _splice(dense.forward, zeroed),
            _splice(dense.backward, backward),
            _splice(dense.recompute, zeroed),
            dense.fp8_recipe,
        )
    others = tuple(op for op in dense.recompute if op.module not in DENSE_ATTENTION_MODULES)
    return LayerOps(
        _splice(dense.forward, forward),
        _splice(dense.backward, backward),
        recompute + others,
        dense.fp8_recipe,
    )


def without_recompute(spec: MLALayerSpec) -> MLALayerSpec:
    """`spec` with no recompute module (for the recompute workspace: what it would keep)."""
    return replace(spec, recompute_core_attn=False, recompute_up_proj=False)
