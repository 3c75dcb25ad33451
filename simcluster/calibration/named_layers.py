"""The named layers the profiler times beside the paper grid (`profiler.bench.modern_layers`,
`profiler.bench.host_graph`): their `workload.LayerConfig` fields beyond the shard shape.

Standard library only: the measuring modules (torch) and the fitting side (no torch) both
read them, so a host-time file that names a layer ("llama3-8b") is priced from the same
fields it was run with. Public shapes: Llama 3 8B / 70B (Meta's model cards: h 4096 / 8192,
32 / 64 heads, 8 KV heads, FFN 14336 / 28672, RMSNorm, RoPE, SwiGLU), GPT-3 175B (Brown et
al. 2020, Table 2.1: h 12288, 96 heads).
"""

from __future__ import annotations

from typing import Any

FLASH_LLAMA: dict[str, Any] = {
    "activation": "swiglu",
    "normalization": "rmsnorm",
    "position_embedding": "rope",
    "attention_backend": "flash",
}
LLAMA3_8B = {
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_query_groups": 8,
    "ffn_hidden_size": 14336,
    **FLASH_LLAMA,
}
LLAMA3_70B = {**LLAMA3_8B, "hidden_size": 8192, "num_attention_heads": 64, "ffn_hidden_size": 28672}
GPT3_175B_FLASH = {"hidden_size": 12288, "num_attention_heads": 96, "attention_backend": "flash"}
GPT3_175B_PAPER = {"hidden_size": 12288, "num_attention_heads": 96}
TINY = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "ffn_hidden_size": 96,
    **FLASH_LLAMA,
}
NAMED_LAYERS = {
    "llama3-8b": LLAMA3_8B,
    "llama3-70b": LLAMA3_70B,
    "gpt3-175b-flash": GPT3_175B_FLASH,
    "gpt3-175b-paper": GPT3_175B_PAPER,
    "tiny": TINY,
}


def dropout_of(model: dict[str, Any]) -> float:
    """The dropout the profiler runs a named layer with: 0 with flash attention (Megatron's
    Llama recipes), the paper's 0.1 otherwise."""
    return 0.0 if model.get("attention_backend") == "flash" else 0.1
