"""A Llama 3 8B scenario shared by the tests of the modern layer (Megatron's Llama 3 8B shape)."""

import copy
from typing import Any

LLAMA3_8B: dict[str, Any] = {
    "hardware": "h100-sxm5-80gb",
    "model": {
        "num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 8192,
        "vocab_size": 128256, "ffn_hidden_size": 14336, "num_query_groups": 8, "activation": "swiglu",
        "normalization": "rmsnorm", "position_embedding": "rope",
        "untie_embeddings_and_output_weights": True, "hidden_dropout": 0.0, "attention_dropout": 0.0,
    },
    "parallel": {"tp": 1, "pp": 1, "dp": 8},
    "training": {"micro_batch_size": 1, "global_batch_size": 16, "attention_backend": "flash"},
}  # fmt: skip


def llama3_8b(
    hardware: str | None = None,
    model: dict[str, Any] | None = None,
    parallel: dict[str, Any] | None = None,
    training: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A fresh copy of `LLAMA3_8B` with the given sections updated."""
    data = copy.deepcopy(LLAMA3_8B)
    if hardware is not None:
        data["hardware"] = hardware
    for section, update in (("model", model), ("parallel", parallel), ("training", training)):
        data[section].update(update or {})
    return data


# One rank's Llama 3 8B layer on 4,096 tokens (a CP-2 rank of the 8k sequence) with flash
# attention, as `workload.layer_config.LayerConfig` keywords; tests add dtype, tp, recipe.
LLAMA3_8B_LAYER: dict[str, Any] = {
    "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 4096, "micro_batch_size": 1,
    "ffn_hidden_size": 14336, "num_query_groups": 8, "activation": "swiglu", "normalization": "rmsnorm",
    "position_embedding": "rope", "attention_backend": "flash", "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
}  # fmt: skip
