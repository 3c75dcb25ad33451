"""Multi-latent attention (DeepSeek-V2/V3) and sliding-window attention: parameters,
FLOPs, per-rank GEMMs and saved activations.

MLA as Megatron-core builds it (megatron/core/transformer/multi_latent_attention.py
`MLASelfAttention`, with the spec of megatron/core/models/gpt/gpt_layer_specs.py;
Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553), n heads, hidden h:

    linear_q_down_proj   h -> q_lora                 TELinear "duplicated": weight on every
    linear_kv_down_proj  h -> kv_lora + rope          tp rank, run on the rank's s/tp tokens
    linear_q_up_proj     q_lora -> n·(qk + rope)      column-parallel over tp (norm fused in)
    linear_kv_up_proj    kv_lora -> n·(qk + v)        column-parallel over tp (norm fused in)
    core attention       Q·Kᵀ over qk + rope, P·V over v, n/tp heads
    linear_proj          n·v -> h                     row-parallel over tp

(q_lora None: one column-parallel linear_q_proj h -> n·(qk + rope).) The rope part of K
(`k_pos_emb`, rope wide) is computed once per token and shared by all heads: the
"decoupled RoPE" of DeepSeek-V2 §2.1.3.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcluster.workload.moe_config import MLAConfig
from simcluster.workload.ops import GemmShape

FLASH_LSE_BYTES = 4  # fp32 log-sum-exp per query and head


@dataclass(frozen=True, slots=True)
class MLAShape:
    hidden_size: int
    num_attention_heads: int
    mla: MLAConfig

    @property
    def linear_weights(self) -> int:
        """Weight elements of the five linears (no norms)."""
        h, n, m = self.hidden_size, self.num_attention_heads, self.mla
        q = h * m.q_lora_rank + m.q_lora_rank * n * m.q_head_dim if m.q_lora_rank else h * n * m.q_head_dim
        kv = h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + m.kv_lora_rank * n * (
            m.qk_head_dim + m.v_head_dim
        )
        return q + kv + n * m.v_head_dim * h

    @property
    def norm_weights(self) -> int:
        """q_layernorm (q_lora) and kv_layernorm (kv_lora) weights (RMSNorm: one per element)."""
        return (self.mla.q_lora_rank or 0) + self.mla.kv_lora_rank

    @property
    def params(self) -> int:
        return self.linear_weights + self.norm_weights


def window_score_pairs(seq_length: int, window_size: int | None) -> float:
    """Visible (query, key) pairs of a causal sequence of s, counted as the repository counts
    causal attention (the triangle's area s²/2, ops.AttentionShape.visible_fraction): with a
    left window of w (Megatron `--window-size (w, 0)`: a query sees itself and w keys before
    it, TE's window convention) the band has area s·(w + 1) - (w + 1)²/2 while w + 1 < s; s²/2
    otherwise (so the two agree at w + 1 = s)."""
    s = float(seq_length)
    if window_size is None or window_size + 1 >= seq_length:
        return s * s / 2.0
    band = window_size + 1.0
    return s * band - band * band / 2.0


def is_window_layer(layer_number: int, window_size: int | None, window_attn_skip_freq: int | None) -> bool:
    """megatron/core/transformer/utils.py `is_layer_window_attention` (1-based layer_number):
    no window -> False; no skip frequency -> every layer; N -> all but every N-th layer
    (`layer_number % N != 0`), so N = 2 alternates window and full attention from a window
    layer first (gpt-oss)."""
    if not window_size:
        return False
    if window_attn_skip_freq is None:
        return True
    return layer_number % window_attn_skip_freq != 0


def core_attention_forward_flops(
    micro_batch_size: int, seq_length: int, num_heads: int, qk_dim: int, v_dim: int, window_size: int | None
) -> float:
    """Q·Kᵀ and P·V over the visible pairs: 2·b·n·pairs·(qk_dim + v_dim) (4·b·n·s²/2·d at
    qk = v = d and no window: the flash-attention causal convention)."""
    pairs = window_score_pairs(seq_length, window_size)
    return 2.0 * micro_batch_size * num_heads * pairs * (qk_dim + v_dim)


def mla_forward_flops(
    shape: MLAShape, micro_batch_size: int, seq_length: int, window_size: int | None = None
) -> float:
    """Whole-layer forward FLOPs (no parallel split): 2·b·s·linear_weights + the core over
    qk + rope and v. Megatron's MFU count (training.py `num_floating_point_operations`,
    multi_latent_attention branch) has the same linears plus q_lora + kv_lora for the norms,
    and its causal core 2·b·s²·n·(q_head + v)/2: the same as this at no window."""
    m = shape.mla
    linear = 2.0 * micro_batch_size * seq_length * shape.linear_weights
    core = core_attention_forward_flops(
        micro_batch_size, seq_length, shape.num_attention_heads, m.q_head_dim, m.v_head_dim, window_size
    )
    return linear + core


def mla_rank_gemms(shape: MLAShape, tokens: float, tp: int, sequence_parallel: bool) -> dict[str, GemmShape]:
    """Forward GEMMs on one rank: the down projections on the rank's tokens (T/tp with
    sequence parallelism; their weights duplicated), the up projections and linear_proj
    on all T = s·b/cp tokens with n/tp heads."""
    h, m = shape.hidden_size, shape.mla
    heads = shape.num_attention_heads // tp
    rows = int(tokens / tp) if sequence_parallel else int(tokens)
    t = int(tokens)
    gemms = {}
    if m.q_lora_rank:
        gemms["attn.q_down"] = GemmShape(m=rows, n=m.q_lora_rank, k=h)
        gemms["attn.q_up"] = GemmShape(m=t, n=heads * m.q_head_dim, k=m.q_lora_rank)
    else:
        gemms["attn.q_proj"] = GemmShape(m=t, n=heads * m.q_head_dim, k=h)
    gemms["attn.kv_down"] = GemmShape(m=rows, n=m.kv_lora_rank + m.qk_pos_emb_head_dim, k=h)
    gemms["attn.kv_up"] = GemmShape(m=t, n=heads * (m.qk_head_dim + m.v_head_dim), k=m.kv_lora_rank)
    gemms["attn.proj"] = GemmShape(m=t, n=h, k=heads * m.v_head_dim)
    return gemms


def mla_saved_bytes(
    shape: MLAShape,
    tokens: float,
    tp: int,
    sequence_parallel: bool,
    element_bytes: int = 2,
    recompute_up_proj: bool = False,
) -> float:
    """Bytes the attention block keeps for backward on one rank (flash attention), tokens
    T = s·b/cp, r = 1/tp with sequence parallelism:

        down projections' input   T·r·h·e          (the input norm's output; the dense
                                                    formula counts it as the QKV input)
        q path                    T·r·q_lora·e·2   (q_compressed; the fused q norm's output)
        kv path                   T·r·(kv_lora + rope)·e + T·r·kv_lora·e
                                                   (kv_combined, of which kv_compressed is a
                                                    view; the fused kv norm's output)
        Q, K, V, O                T·(n/tp)·e·(2·(qk + rope) + 2·v)
        LSE                       T·(n/tp)·4

    `mla_up_proj` recompute (`--recompute-modules mla_up_proj`: the up projections and RoPE
    under `CheckpointWithoutOutput`, whose outputs Q, K, V are discarded after the core
    and re-made before its backward) keeps the checkpoint's inputs (q_compressed,
    kv_compressed, the all-gathered k_pos_emb T·rope·e) and drops the norms' outputs
    and Q, K, V."""
    h, n, m, e = shape.hidden_size, shape.num_attention_heads / tp, shape.mla, element_bytes
    local = tokens / tp if sequence_parallel else tokens
    q_lora = m.q_lora_rank or 0
    kv_combined = local * (m.kv_lora_rank + m.qk_pos_emb_head_dim) * e
    out_and_lse = tokens * n * (m.v_head_dim * e + FLASH_LSE_BYTES)
    if recompute_up_proj:
        k_pos_emb = tokens * m.qk_pos_emb_head_dim * e
        return local * h * e + local * q_lora * e + kv_combined + k_pos_emb + out_and_lse
    norms_out = local * (q_lora + m.kv_lora_rank) * e
    qkv = tokens * n * e * (2 * m.q_head_dim + m.v_head_dim)
    return local * h * e + local * q_lora * e + kv_combined + norms_out + qkv + out_and_lse
