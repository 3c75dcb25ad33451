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

Modern options (Megatron-core `models/gpt/gpt_layer_specs.py`): GQA (QKV (q + 2k)/t wide,
per-group layout), RMSNorm,
RoPE on Q and K after the split, flash attention (scaled_dot_product_attention) in place of
the unfused core, SwiGLU or squared ReLU in place of GeLU. Either core first passes Q, K, V
through `ops.te_qkv_layout`, as TE's DotProductAttention (the TE spec's core for every
backend) does: views in a layout TE accepts stay views, others become contiguous copies, so
the QKV output is freed unless the selective checkpoint, which keeps its inputs as given,
holds V's view. What they keep is in `accounting` (op graph + norm statistics).

Recompute: SELECTIVE checkpoints the attention core (its saved inputs are Q, K, V); FULL
checkpoints the whole layer (only its input is kept), both with torch.utils.checkpoint
(use_reentrant=False, RNG state preserved).

Context parallelism (spec.cp > 1, a second `Comm` over the cp group): the layer holds the
s/c tokens of chunks r and 2c − 1 − r (`context_parallel`); RoPE uses those tokens' global
positions, dropout masks their rows, and the flash core becomes TE's K/V ring
(`context_parallel.ring_attention`). Parameters are the same on every cp rank; their
gradients are partial sums over the cp group (Megatron reduces them over DP × CP).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from simcluster.config.choices import (
    Activation,
    AttentionBackend,
    LayerMode,
    Normalization,
    PositionEmbedding,
    Recompute,
)
from simcluster.config.moe_choices import RecomputeModule
from simcluster.profiler.layer.context_parallel import (
    contiguous_runs,
    local_positions,
    local_rows,
    ring_attention,
)
from simcluster.profiler.layer.ops import (
    LocalMasks,
    MaskSource,
    SlicedMasks,
    apply_rope,
    bias_dropout_add,
    dropout,
    rms_norm,
    rope_tables,
    scale_mask_softmax,
    squared_relu,
    swiglu,
    te_qkv_layout,
)
from simcluster.profiler.layer.parallel import (
    Comm,
    ShardStandInComm,
    column_parallel_linear,
    row_parallel_linear,
)
from simcluster.profiler.layer.regions import region_math
from simcluster.profiler.layer.spec import LayerSpec
from simcluster.profiler.layer.weights import (
    LINEAR_BIASES,
    local_weights,
    param_names,
    param_shapes,
    serial_weights,
    shard,
)


class ParallelTransformerLayer(nn.Module):
    """The layer on rank `comm.rank` of `spec.tp` (and `cp_comm.rank` of `spec.cp`);
    parameters are this tensor-parallel rank's shards.

    q = a·d and k = g·d (k = q = h without GQA); fc1 is 2f wide under SwiGLU.
    `mode` picks how the memory-bound regions run (`regions`: eager torch ops, or one
    torch.compile'd kernel per region and direction); the saved tensors are the same.
    """

    ln1_weight: nn.Parameter
    ln1_bias: nn.Parameter  # LayerNorm only
    qkv_weight: nn.Parameter  # [(q + 2k)/t, h]
    qkv_bias: nn.Parameter | None  # [(q + 2k)/t]; None without add_bias_linear, as the others
    proj_weight: nn.Parameter  # [h, q/t]
    proj_bias: nn.Parameter | None  # [h], added once after f̄ / ḡ
    ln2_weight: nn.Parameter
    ln2_bias: nn.Parameter  # LayerNorm only
    fc1_weight: nn.Parameter  # [f/t, h], [2f/t, h] under SwiGLU
    fc1_bias: nn.Parameter | None  # [f/t], [2f/t] under SwiGLU
    fc2_weight: nn.Parameter  # [h, f/t]
    fc2_bias: nn.Parameter | None  # [h], added once after f̄ / ḡ
    rope_cos: Tensor  # [s/c, 1, 1, d], RoPE only: constant buffers, not activations
    rope_sin: Tensor

    def __init__(
        self,
        spec: LayerSpec,
        weights: dict[str, Tensor],
        comm: Comm,
        masks: MaskSource,
        cp_comm: Comm | None = None,
        mode: LayerMode = LayerMode.EAGER,
    ) -> None:
        super().__init__()
        if comm.world_size != spec.tp:
            raise ValueError(f"comm has world_size {comm.world_size}, spec.tp is {spec.tp}")
        cp_comm = cp_comm or ShardStandInComm(1)
        if cp_comm.world_size != spec.cp:
            raise ValueError(f"cp_comm has world_size {cp_comm.world_size}, spec.cp is {spec.cp}")
        shapes = param_shapes(spec)
        for name in param_names(spec):
            if tuple(weights[name].shape) != shapes[name]:
                raise ValueError(f"{name}: expected shape {shapes[name]}, got {tuple(weights[name].shape)}")
            self.register_parameter(name, nn.Parameter(weights[name]))
        for name in LINEAR_BIASES:  # None where the spec has no linear biases (add_bias_linear)
            if name not in shapes:
                self.register_parameter(name, None)
        if spec.position_embedding is PositionEmbedding.ROPE:
            # Megatron computes the rotary tables once per model forward and hands them to
            # every layer, so they belong to no layer's activations (TE `FusedRoPEFunc` saves only them).
            # With CP, the rank's two chunks' global positions (Megatron-core
            # `get_pos_emb_on_this_cp_rank`).
            weight = weights["qkv_weight"]
            positions = local_positions(spec.full_seq_length, spec.cp, cp_comm.rank)
            cos, sin = rope_tables(positions, spec.head_dim, spec.rotary_base, spec.torch_dtype)
            self.register_buffer("rope_cos", cos.to(weight.device), persistent=False)
            self.register_buffer("rope_sin", sin.to(weight.device), persistent=False)
        self.spec = spec
        self.comm = comm
        self.cp_comm = cp_comm
        self.masks = masks
        self.mode = LayerMode(mode)
        self.regions = region_math(self.mode)
        # the [start, stop) row runs of the dropout masks outside the TP regions: one run
        # without CP, up to two with it. Fixed by the ranks, so found once: a Python loop over
        # the rows in every call cost the measured eager host ~0.1-1 ms per bias-dropout-add
        # at s 2048 (more with SP off, which holds all s rows), host time Megatron does not spend
        self._dropout_runs = contiguous_runs(_region_positions(spec, comm.rank, cp_comm.rank))

    def forward(self, x: Tensor) -> Tensor:
        """x: [s/t, b, h] with SP, else [s, b, h] -> same shape."""
        if self.spec.recompute is Recompute.FULL:
            return checkpoint(self._layer, x, use_reentrant=False, preserve_rng_state=True)
        return self._layer(x)

    def _layer(self, x: Tensor) -> Tensor:
        residual = x
        x = self._bias_dropout_add(
            self._attention(self._norm(x, "ln1")), self.proj_bias, residual, "attention_output"
        )
        residual = x
        if self.spec.recomputes(RecomputeModule.MLP):
            # Megatron-core `--recompute-modules mlp`: the MLP (TE's fc1 LayerNormLinear with
            # norm 2 inside) checkpointed on its input, which is all it keeps
            mlp = checkpoint(self._norm_mlp, x, use_reentrant=False, preserve_rng_state=True)
        else:
            mlp = self._norm_mlp(x)
        return self._bias_dropout_add(mlp, self.fc2_bias, residual, "mlp_output")

    def _norm_mlp(self, x: Tensor) -> Tensor:
        return self._mlp(self._norm(x, "ln2"))

    def _norm(self, x: Tensor, name: str) -> Tensor:
        weight = getattr(self, f"{name}_weight")
        if self.spec.normalization is Normalization.RMSNORM:
            return rms_norm(x, weight, self.spec.layernorm_epsilon, self.regions)
        return F.layer_norm(
            x, (self.spec.hidden_size,), weight, getattr(self, f"{name}_bias"), self.spec.layernorm_epsilon
        )

    def _attention(self, x: Tensor) -> Tensor:
        """Self-attention up to the row-parallel projection (bias added by the caller)."""
        spec = self.spec
        qkv = column_parallel_linear(
            x, self.qkv_weight, self.qkv_bias, self.comm, spec.sequence_parallel
        )  # [s, b, (q + 2k)/t]
        s, b = qkv.shape[:2]
        d, groups, per_group = spec.head_dim, spec.kv_heads_per_rank, spec.heads_per_group
        # Megatron-core's split: each query group holds [its a/g query heads, k, v].
        qkv = qkv.view(s, b, groups, (per_group + 2) * d)
        q, k, v = qkv.split([per_group * d, d, d], dim=-1)  # views of the QKV output
        # [s, b, a/t, d]: a view when one group or one head per group, else a copy (as in
        # Megatron's query.reshape); k, v stay [s, b, g/t, d] views.
        q = q.reshape(s, b, groups * per_group, d)
        if spec.position_embedding is PositionEmbedding.ROPE:  # new tensors, after the split
            q = apply_rope(q, self.rope_cos, self.rope_sin, self.regions)
            k = apply_rope(k, self.rope_cos, self.rope_sin, self.regions)
        core = (self._flash_core if spec.attention_backend is AttentionBackend.FLASH
                else self._attention_core)
        if spec.recomputes(RecomputeModule.CORE_ATTN):
            context = checkpoint(core, q, k, v, use_reentrant=False, preserve_rng_state=True)
        else:
            context = core(q, k, v)
        return row_parallel_linear(context, self.proj_weight, self.comm, spec.sequence_parallel)

    def _flash_core(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Causal flash attention via scaled_dot_product_attention; [s, b, n, d] -> [s, b, q/t].

        Q, K, V first take TE's layout rule (`te_qkv_layout`, inside the selective
        checkpoint as in Megatron). GQA runs natively (enable_gqa: K/V are not repeated).
        torch's CPU flash kernel
        saves q, k, v as given, its output and the fp32 logsumexp [b, a/t, s], as flash
        attention does (docs/memory.md); no s² tensor. Its output is laid out
        [s, b, a/t, d] in memory, so the reshape below is a view and the projection saves
        the same storage (row 6).
        """
        # TE's DotProductAttention settles the layout (`get_qkv_layout`) before it dispatches
        # to the CP ring or a local kernel, so both see the same (copied or viewed) Q, K, V.
        q, k, v = te_qkv_layout(q, k, v)
        if self.spec.cp > 1:
            context = ring_attention(q, k, v, self.cp_comm)  # [s/c, b, a/t, d], a new tensor
            return context.reshape(*context.shape[:2], -1)
        s, b, heads, d = q.shape
        out = F.scaled_dot_product_attention(
            q.permute(1, 2, 0, 3),
            k.permute(1, 2, 0, 3),
            v.permute(1, 2, 0, 3),
            is_causal=True,
            enable_gqa=k.shape[2] != heads,
        )  # (b, a/t, s, d)
        return out.permute(2, 0, 1, 3).reshape(s, b, heads * d)

    def _attention_core(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """softmax(QKᵀ/sqrt(d), causal) → dropout → ×V; [s, b, a/t, d] → [s, b, q/t].

        Keeps Q and K (QKᵀ), the softmax output, the 1-byte dropout mask, the dropout output
        and V (×V): 5as²b/t + 6sbh/t bytes without GQA, Q/K/V being views of one QKV
        storage (TE's sbh3d layout, kept as is by `te_qkv_layout`, as TE's unfused backend
        gets them). With GQA, K and V are first repeated to a/t heads (repeat_interleave,
        as Megatron's and TE's unfused cores do), and the bmms keep those copies.
        """
        q, k, v = te_qkv_layout(q, k, v)
        s, b, heads, d = q.shape
        if k.shape[2] != heads:
            k = k.repeat_interleave(heads // k.shape[2], dim=2)  # (s, b, a/t, d)
            v = v.repeat_interleave(heads // v.shape[2], dim=2)
        q = q.reshape(s, b * heads, d).transpose(0, 1)  # [b·a/t, s, d], still a view
        k = k.reshape(s, b * heads, d).permute(1, 2, 0)  # [b·a/t, d, s]
        v = v.reshape(s, b * heads, d).transpose(0, 1)  # [b·a/t, s, d]
        scores = torch.bmm(q, k).view(b, heads, s, s)
        probs = scale_mask_softmax(scores, 1.0 / math.sqrt(d), self.regions)
        first_head = self.comm.rank * heads
        p = self.spec.attention_dropout
        keep = self.masks.keep_mask(
            "attention",
            (b, self.spec.num_attention_heads, s, s),
            1,
            first_head,
            first_head + heads,
            p,
            probs.device,
        )
        probs = dropout(probs, keep, p, self.regions)
        context = torch.bmm(probs.view(b * heads, s, s), v)  # [b·a/t, s, d]
        return context.view(b, heads, s, d).permute(2, 0, 1, 3).reshape(s, b, heads * d)

    def _mlp(self, x: Tensor) -> Tensor:
        """fc1 (column-parallel) → activation → fc2 (row-parallel, bias added by the caller)."""
        sp = self.spec.sequence_parallel
        hidden = column_parallel_linear(x, self.fc1_weight, self.fc1_bias, self.comm, sp)
        if self.spec.activation is Activation.SWIGLU:
            hidden = swiglu(hidden, self.regions)  # [s, b, 2f/t] -> [s, b, f/t]
        elif self.spec.activation is Activation.SQUARED_RELU:
            hidden = squared_relu(hidden, self.regions)  # [s, b, f/t]
        else:
            hidden = F.gelu(hidden, approximate="tanh")  # [s, b, f/t]
        return row_parallel_linear(hidden, self.fc2_weight, self.comm, sp)

    def _bias_dropout_add(self, x: Tensor, bias: Tensor | None, residual: Tensor, site: str) -> Tensor:
        """residual + dropout(x + bias) (residual + dropout(x) without a bias): keeps only the
        sbh (sbh/t with SP) 1-byte mask."""
        spec = self.spec
        p = spec.hidden_dropout
        full = (spec.full_seq_length, spec.micro_batch_size, spec.hidden_size)
        masks = [
            self.masks.keep_mask(site, full, 0, start, stop, p, x.device)
            for start, stop in self._dropout_runs
        ]
        keep = masks[0] if len(masks) == 1 or masks[0] is None else torch.cat(masks)  # type: ignore[arg-type]
        return bias_dropout_add(x, bias, residual, keep, p, self.regions)


def _region_positions(spec: LayerSpec, tp_rank: int, cp_rank: int) -> Tensor:
    """Global sequence positions of the rows this rank holds outside the tensor-parallel
    regions: its cp chunks, then its 1/t slice of them under SP."""
    positions = local_positions(spec.full_seq_length, spec.cp, cp_rank)
    start = tp_rank * spec.local_seq_length if spec.sequence_parallel else 0
    return positions.narrow(0, start, spec.local_seq_length)


def sharded_layer(
    spec: LayerSpec,
    comm: Comm,
    seed: int = 0,
    device: str = "cpu",
    masks: MaskSource | None = None,
    cp_comm: Comm | None = None,
    mode: LayerMode = LayerMode.EAGER,
) -> ParallelTransformerLayer:
    """Rank `comm.rank`'s layer with weights sliced from `serial_weights(spec, seed)`
    (the same on every cp rank of `cp_comm`, default: no CP).

    Default masks are `SlicedMasks(seed)`: the same dropped elements as the serial layer.
    """
    weights = shard(serial_weights(spec, seed), spec, comm.rank)
    weights = {n: w.to(device=device, dtype=spec.torch_dtype) for n, w in weights.items()}
    return ParallelTransformerLayer(spec, weights, comm, masks or SlicedMasks(seed), cp_comm, mode)


def serial_layer(
    spec: LayerSpec,
    seed: int = 0,
    device: str = "cpu",
    masks: MaskSource | None = None,
    mode: LayerMode = LayerMode.EAGER,
) -> ParallelTransformerLayer:
    """The t = 1 layer that `sharded_layer(spec, ...)` is a slice of."""
    return sharded_layer(spec.serial(), ShardStandInComm(1), seed, device, masks, mode=mode)


def local_layer(
    spec: LayerSpec,
    comm: Comm,
    seed: int = 0,
    device: str = "cpu",
    masks: MaskSource | None = None,
    cp_comm: Comm | None = None,
    mode: LayerMode = LayerMode.EAGER,
) -> ParallelTransformerLayer:
    """A layer of rank shapes with weights drawn on `device` (timing and memory runs)."""
    weights = local_weights(spec, seed, torch.device(device))
    return ParallelTransformerLayer(spec, weights, comm, masks or LocalMasks(), cp_comm, mode)


def layer_input(spec: LayerSpec, seed: int, rank: int = 0, device: str = "cpu", cp_rank: int = 0) -> Tensor:
    """Rank `rank`'s slice of a seeded serial input [s, b, h] (all of it without SP), of
    cp rank `cp_rank`'s chunks with CP."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    full = torch.randn(spec.full_seq_length, spec.micro_batch_size, spec.hidden_size, generator=gen)
    full = local_rows(full, spec.cp, cp_rank)
    start = rank * spec.local_seq_length if spec.sequence_parallel else 0
    local = full.narrow(0, start, spec.local_seq_length).clone()
    return local.to(device=device, dtype=spec.torch_dtype)
