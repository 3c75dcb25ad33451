"""A tiny plan world: a 4-layer model small enough that simulating every layout of 8 GPUs
takes seconds, and the A100 profile with a memory size a test may shrink."""

from __future__ import annotations

from typing import Any

from simcluster.config.hardware import HardwareProfile, load_hardware
from simcluster.config.scenario import Scenario, parse_scenario

TINY: dict[str, Any] = {
    "name": "tiny",
    "hardware": "a100-sxm4-80gb",
    "model": {
        "num_layers": 4,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "seq_length": 256,
        "vocab_size": 1024,
    },
    "parallel": {"tp": 1, "pp": 1},
    "training": {"micro_batch_size": 1, "global_batch_size": 16},
}


def tiny_scenario(**training: Any) -> Scenario:
    data = {**TINY, "training": {**TINY["training"], **training}}
    return parse_scenario(data, "tiny")


def a100(memory_gb: float | None = None) -> HardwareProfile:
    hw = load_hardware("a100-sxm4-80gb")
    if memory_gb is None:
        return hw
    # plan fills the usable memory: the driver's capacity less the CUDA context and NCCL
    # buffers; a small test device has that capacity and no reserve.
    gpu = hw.gpu.model_copy(
        update={
            "memory_gb": memory_gb,
            "memory_capacity_mib": memory_gb * 1e9 / 2**20,
            "cuda_context_mib": None,
            "nccl_buffers_mib": None,
        }
    )
    return hw.model_copy(update={"gpu": gpu})


TINY_MOE: dict[str, Any] = {
    **TINY,
    "name": "tiny-moe",
    "model": {
        **TINY["model"],
        "activation": "swiglu",
        "moe": {"num_experts": 8, "router_topk": 2, "ffn_hidden_size": 256},
    },
}
"""The tiny model with 8 experts (top-2) in every layer."""


def tiny_moe_scenario(**training: Any) -> Scenario:
    data = {**TINY_MOE, "training": {**TINY_MOE["training"], **training}}
    return parse_scenario(data, "tiny-moe")
