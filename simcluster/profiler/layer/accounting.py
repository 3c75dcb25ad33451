"""What autograd keeps for backward, measured, against the paper's Table 2.

`measure_saved_bytes` runs one layer forward on one rank (rank 0 shapes, `ShardStandInComm`)
under torch.autograd.graph.saved_tensors_hooks and adds up every distinct storage that
autograd saves, once each (keyed on the storage's data pointer), leaving out the parameters.
Saved views count their whole storage: Q, K and V are views of one QKV output of 6sbh/t
bytes, and that is what stays alive.

`table2_bytes` is Table 2's formula for the spec's row; `negligible_buffers` names the rest of
what torch keeps and the paper leaves out, so that measured == table2 + negligible exactly:

- layernorm_stats: mean and rstd of both layer norms, one value per token each:
  2 LNs × 2 × (s/t with SP, else s)·b × stat bytes, where the stat element is fp32 (4 B) on
  CUDA (torch's kernel, like Apex's fused LN, accumulates in fp32) and the parameter dtype
  on CPU (torch's CPU kernel: 2 B in bf16). None under full recompute (inside the checkpoint).

Kept but not visible to the hooks, hence in neither number: torch.utils.checkpoint's copy of
the RNG state per checkpointed region (torch.get_rng_state(): 5,056 B on CPU; 16 B per CUDA
device), held by the checkpoint frame, not as a saved tensor. Nothing else is saved: the
causal mask is rebuilt in forward, dropout masks are the only RNG products kept, and the
layer input under full recompute is the one saved tensor (2sbh, or 2sbh/t with SP).

With context parallelism (spec.cp > 1) the layer is rank 0 of the cp ring too, its K/V
"received" from the stand-in (a new buffer, as on a real ring), and the prediction is the op
graph's CP layer (`workload.context_parallel`): the same bytes as the local flash kernel on
s/c tokens. The ring saves the last received K/V buffer instead of the layer's K and V,
which changes what views keep alive (`workload.layer.qkv_output_held_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from torch import Tensor, nn

from simcluster.config.choices import (
    AttentionBackend,
    Dtype,
    LayerMode,
    Normalization,
    PositionEmbedding,
    Recompute,
)
from simcluster.config.moe_choices import RecomputeModule
from simcluster.profiler.layer.parallel import ShardStandInComm
from simcluster.profiler.layer.spec import LayerSpec
from simcluster.profiler.layer.transformer import layer_input, local_layer
from simcluster.workload.context_parallel import context_parallel_layer_ops
from simcluster.workload.layer import layer_ops


@dataclass(frozen=True)
class SavedBytes:
    """Bytes autograd keeps for backward, by kind; every storage counted once.

    activation_bytes: 16-bit (the run's dtype) tensors; dropout_mask_bytes: bool masks;
    layernorm_stats_bytes: per-token statistics (saved tensors whose last dim is 1).
    """

    total_bytes: int
    activation_bytes: int
    dropout_mask_bytes: int
    layernorm_stats_bytes: int
    num_storages: int


class SavedTensorCounter:
    """Context manager: records each distinct storage autograd saves inside it.

    Storages of `exclude` (the parameters and buffers) are skipped. The pack hook returns the tensor
    itself, so the graph and backward are unchanged.
    """

    def __init__(self, exclude: nn.Module | list[Tensor]) -> None:
        # A module's constant buffers (RoPE's cos/sin tables) are model state, not activations.
        params = [*exclude.parameters(), *exclude.buffers()] if isinstance(exclude, nn.Module) else exclude
        self._excluded = {_storage_key(p) for p in params}
        self._seen: dict[tuple[str, int], tuple[str, int]] = {}
        self._alive: list[torch.UntypedStorage] = []  # no address reuse while counting
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def __enter__(self) -> SavedTensorCounter:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._hooks.__exit__(*exc_info)

    def _pack(self, tensor: Tensor) -> Tensor:
        key = _storage_key(tensor)
        nbytes = tensor.untyped_storage().nbytes()
        if key not in self._excluded and key not in self._seen and nbytes > 0:
            self._seen[key] = (_category(tensor), nbytes)
            self._alive.append(tensor.untyped_storage())
        return tensor

    def result(self) -> SavedBytes:
        by_kind = {"activation": 0, "dropout_mask": 0, "layernorm_stats": 0}
        for kind, nbytes in self._seen.values():
            by_kind[kind] += nbytes
        return SavedBytes(
            total_bytes=sum(by_kind.values()),
            activation_bytes=by_kind["activation"],
            dropout_mask_bytes=by_kind["dropout_mask"],
            layernorm_stats_bytes=by_kind["layernorm_stats"],
            num_storages=len(self._seen),
        )


def _unpack(tensor: Any) -> Any:
    return tensor


def _storage_key(tensor: Tensor) -> tuple[str, int]:
    return str(tensor.device), tensor.untyped_storage().data_ptr()


def _category(tensor: Tensor) -> str:
    if tensor.dtype == torch.bool:
        return "dropout_mask"
    if tensor.dim() >= 2 and tensor.shape[-1] == 1:
        return "layernorm_stats"
    return "activation"


def measure_saved_bytes(
    spec: LayerSpec, device: str = "cpu", seed: int = 0, mode: LayerMode = LayerMode.EAGER
) -> SavedBytes:
    """Bytes one layer forward keeps for backward on rank 0 of `spec.tp` (stand-in comm),
    its memory-bound regions run eager or fused (`mode`)."""
    layer = local_layer(
        spec, ShardStandInComm(spec.tp), seed, device, cp_comm=ShardStandInComm(spec.cp), mode=mode
    )
    x = layer_input(spec, seed, rank=0, device=device).requires_grad_()
    with SavedTensorCounter(layer) as counter:
        out = layer(x)
    del out
    return counter.result()


def table2_row(spec: LayerSpec) -> str:
    """The name of Table 2's row that `spec` falls in."""
    if spec.recompute is Recompute.FULL:
        return "full recompute" + (" (sequence parallel: 2sbh/t)" if spec.sequence_parallel else "")
    if spec.tp == 1:
        name = "no parallelism"
    elif spec.sequence_parallel:
        name = "tensor + sequence parallel"
    else:
        name = "tensor parallel (baseline)"
    return name + (" + selective recompute" if spec.recompute is Recompute.SELECTIVE else "")


def table2_bytes(spec: LayerSpec) -> int:
    """Activation bytes per layer per rank as the simulator's op graph counts them
    (`simcluster.workload.layer`), which equals Table 2 (Korthikanti et al.) in 16 bit:
    no parallelism sbh(34 + 5as/h); TP baseline sbh(10 + 24/t + 5as/(ht)); TP + SP
    sbh(34/t + 5as/(ht)); TP + selective sbh(10 + 24/t); TP + SP + selective 34sbh/t; full
    recompute 2sbh. The table's full-recompute row ignores SP; Megatron keeps the layer
    input, which with SP is the [s/t, b, h] shard, so this is 2sbh/t there. For another
    element size e the same terms read sbh((4e + 2)·r + 12e/t) + as²b(2e + 1)/t, r = 1/t
    under SP, else 1. Using the op graph here is the one-source-of-truth link: measured
    bytes == op graph + named negligible buffers is tested for every row. With CP it is the
    op graph's CP layer on s/c tokens (`context_parallel_layer_ops`), what `simcluster
    memory` predicts per rank.
    """
    cfg = spec.config()
    ops = context_parallel_layer_ops(layer_ops(cfg), cfg, spec.cp)
    return _exact(Fraction(ops.saved_bytes).limit_denominator(1 << 20))


def _exact(value: Fraction) -> int:
    if value.denominator != 1:
        raise ValueError(f"byte count {value} is not whole: check divisibility by tp")
    return int(value)


def negligible_buffers(spec: LayerSpec, device_type: str = "cpu") -> dict[str, int]:
    """Bytes torch keeps that Table 2 (and the op graph) neglect, by name (module docstring).

    RMSNorm keeps one fp32 rsigma per token instead of LayerNorm's mean and rstd (TE's
    fused norm, TE `layernorm_linear.py`), on any device.
    """
    if spec.recompute is Recompute.FULL:
        return {"layernorm_stats": 0}
    tokens = spec.local_seq_length * spec.micro_batch_size
    norms = 1 if spec.recomputes(RecomputeModule.MLP) else 2  # norm 2 inside the mlp checkpoint
    if spec.normalization is Normalization.RMSNORM:
        return {"layernorm_stats": norms * tokens * 4}
    stat_bytes = 4 if device_type == "cuda" or spec.dtype is Dtype.FP32 else spec.dtype.num_bytes
    return {"layernorm_stats": norms * 2 * tokens * stat_bytes}


def section4_terms(spec: LayerSpec) -> dict[str, int]:
    """Activation bytes per layer per rank, term by term as docs/memory.md derives them from
    what each Megatron/TE autograd function saves, generalised to every option mix (Table 2's
    terms where an option is off). e = element bytes, T = tokens in the norm/dropout regions
    (sb/t with SP, else sb), S = sb, q = a·d, k = g·d, f = ffn, t = TP:

    - norm inputs 2·eTh (rows 1, 8); QKV and fc1 inputs eTh each (rows 3, 9);
    - flash core: Q, K, V, O = eS(2q + 2k)/t and the fp32 LSE 4S·a/t (row 5; proj's input
      is O, row 6); unfused core: Q, K, V as one QKV storage eS(q + 2k)/t without GQA, or Q
      eSq/t and the repeated K and V 2·eSq/t with it, softmax and dropout outputs 2e·as²b/t
      and the dropout mask as²b/t (Table 2; the softmax output alone at p = 0), proj's
      input eSq/t;
    - activation input: GeLU / squared ReLU eSf/t, SwiGLU eS·2f/t (row 10); fc2 input eSf/t;
    - bias-dropout-add masks 2T·h (none at p = 0; rows 7, 12).

    Selective recompute keeps the core's inputs (Q, K, V, before any repeat) and drops what
    the core saved inside; V being a view of the QKV output, the checkpoint also keeps the
    rest of that output where Q or K is a new tensor: eS·q/t for a RoPE'd or copied Q (a
    rank with several groups of several heads), eS·k/t for a RoPE'd K
    (`workload.layer.qkv_output_held_bytes`). Full recompute keeps the layer input eTh only.
    The core's checkpoint is `core_attn`'s (Megatron's default module); `mlp` keeps of the
    MLP only norm 2's input (already a norm input), dropping fc1's, the activation's and fc2's.
    RoPE's tables are not activations (row 4). Norm statistics are in `negligible_buffers`.
    """
    e, t, h = spec.dtype.num_bytes, spec.tp, spec.hidden_size
    region, full = spec.local_seq_length * spec.micro_batch_size, spec.tokens
    if spec.recompute is Recompute.FULL:
        return {"layer_input": e * region * h}
    q, k, f = spec.query_width, spec.kv_width, spec.ffn_hidden_size
    flash = spec.attention_backend is AttentionBackend.FLASH
    selective = spec.recomputes(RecomputeModule.CORE_ATTN)  # the core's checkpoint
    terms = {"norm_inputs": 2 * e * region * h, "qkv_input": e * region * h}
    if flash or selective or k == q:
        terms["attention_qkv"] = _exact(Fraction(e * full * (q + 2 * k), t))
    else:  # Megatron's unfused path: K and V repeated to a/t heads before the bmms
        terms["attention_q"] = _exact(Fraction(e * full * q, t))
        terms["attention_kv_repeated"] = _exact(Fraction(2 * e * full * q, t))
    if selective:
        rope = spec.position_embedding is PositionEmbedding.ROPE
        q_copied = rope or (spec.kv_heads_per_rank > 1 and spec.heads_per_group > 1)
        held = (q if q_copied else 0) + (k if rope else 0)
        if held:
            terms["qkv_output_held_by_checkpoint"] = _exact(Fraction(e * full * held, t))
    if flash and not selective:
        terms["attention_lse"] = 4 * full * spec.heads_per_rank
    if not flash and not selective:
        scores = _exact(Fraction(spec.micro_batch_size * spec.num_attention_heads * spec.seq_length**2, t))
        dropped = spec.attention_dropout > 0  # else ×V keeps the softmax output itself
        terms["attention_scores"] = (2 * e + 1) * scores if dropped else e * scores
    terms["attention_output"] = _exact(Fraction(e * full * q, t))  # O, proj's input
    if not spec.recomputes(RecomputeModule.MLP):  # else the checkpoint keeps norm 2's input only
        terms["fc1_input"] = e * region * h
        terms["activation_input"] = _exact(Fraction(e * full * spec.fc1_width, t))
        terms["fc2_input"] = _exact(Fraction(e * full * f, t))
    if spec.hidden_dropout > 0:
        terms["dropout_masks"] = 2 * region * h
    return terms


def expected_saved_bytes(spec: LayerSpec, device_type: str = "cpu") -> int:
    """What `measure_saved_bytes` should report: the op graph's bytes (Table 2 for the
    paper's layer, §4 for the modern options, the QKV output a selective checkpoint keeps
    included) and the negligible buffers. Nothing else: the real layer hands Q, K, V to its
    core as TE's DotProductAttention does (`ops.te_qkv_layout`)."""
    return table2_bytes(spec) + sum(negligible_buffers(spec, device_type).values())
