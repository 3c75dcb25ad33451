"""Multi-latent attention in torch, one rank (tp = 1), as Megatron-core's `MLASelfAttention`
runs it with Transformer Engine (megatron/core/transformer/multi_latent_attention.py,
Megatron-LM @d98e8a64ddf34856e74b24714e3bedb2f5a39553; no RoPE fusion, no up-projection
recompute): the down projections on the input norm's output, the latent norms fused into
the up projections (TE's LayerNormColumnParallelLinear keeps the norm's input, its fp32
rsigma and its output), RoPE on the rope parts of Q and K (K's shared by all heads),
Q = [q_nope, q_rope], K = [k_nope, k_rope], V copied contiguous, flash attention, proj.

Its purpose is the memory check: what autograd keeps is `workload.mla.mla_saved_bytes` plus
the two norms' fp32 rsigma (tests/profiler/test_profiler_moe.py). torch's CPU flash
kernel needs Q·K's head width equal to V's (else it falls back to the math kernel with its
s² tensors), so the tests pick qk_head_dim + qk_pos_emb_head_dim = v_head_dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simcluster.profiler.layer.ops import apply_rope, rms_norm, rope_tables
from simcluster.workload.moe_config import MLAConfig


class MLABlock(nn.Module):
    """x [s, b, h] (the input norm's output) -> attention output [s, b, h]."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        mla: MLAConfig,
        seq_length: int,
        dtype: torch.dtype,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if not mla.q_lora_rank:
            raise ValueError("MLABlock: q_lora_rank must be set (the DeepSeek-V3 layout)")
        gen = torch.Generator().manual_seed(seed)
        n, m, h, q_lora = num_heads, mla, hidden_size, mla.q_lora_rank

        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter((torch.randn(*shape, generator=gen) * 0.1).to(dtype))

        self.n, self.mla = n, m
        self.q_down = param(q_lora, h)
        self.q_norm = nn.Parameter(torch.ones(q_lora, dtype=dtype))
        self.q_up = param(n * m.q_head_dim, q_lora)
        self.kv_down = param(m.kv_lora_rank + m.qk_pos_emb_head_dim, h)
        self.kv_norm = nn.Parameter(torch.ones(m.kv_lora_rank, dtype=dtype))
        self.kv_up = param(n * (m.qk_head_dim + m.v_head_dim), m.kv_lora_rank)
        self.proj = param(h, n * m.v_head_dim)
        cos, sin = rope_tables(torch.arange(seq_length), m.qk_pos_emb_head_dim, 10000.0, dtype)
        self.cos: Tensor
        self.sin: Tensor
        self.register_buffer("cos", cos)  # constants, not activations
        self.register_buffer("sin", sin)

    def forward(self, x: Tensor) -> Tensor:
        s, b, _ = x.shape
        m, n = self.mla, self.n
        q_compressed = F.linear(x, self.q_down)  # [s, b, q_lora]
        kv_combined = F.linear(x, self.kv_down)  # [s, b, kv_lora + rope]
        kv_compressed, k_pos = torch.split(kv_combined, [m.kv_lora_rank, m.qk_pos_emb_head_dim], dim=-1)
        q = F.linear(rms_norm(q_compressed, self.q_norm, 1e-6), self.q_up).view(s, b, n, m.q_head_dim)
        kv = F.linear(rms_norm(kv_compressed, self.kv_norm, 1e-6), self.kv_up)
        kv = kv.view(s, b, n, m.qk_head_dim + m.v_head_dim)
        q_nope, q_pos = torch.split(q, [m.qk_head_dim, m.qk_pos_emb_head_dim], dim=-1)
        k_nope, value = torch.split(kv, [m.qk_head_dim, m.v_head_dim], dim=-1)
        q_pos = apply_rope(q_pos, self.cos, self.sin)
        k_pos = apply_rope(k_pos.unsqueeze(-2), self.cos, self.sin)  # [s, b, 1, rope]: one for all heads
        query = torch.cat([q_nope, q_pos], dim=-1).contiguous()
        key = torch.cat([k_nope, k_pos.expand(-1, -1, n, -1)], dim=-1).contiguous()
        value = value.contiguous()
        out = F.scaled_dot_product_attention(
            query.permute(1, 2, 0, 3), key.permute(1, 2, 0, 3), value.permute(1, 2, 0, 3), is_causal=True
        )  # (b, n, s, v)
        return F.linear(out.permute(2, 0, 1, 3).reshape(s, b, n * m.v_head_dim), self.proj)
