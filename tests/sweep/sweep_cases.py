"""Shared by the sweep tests. A tiny sweep world: an 8-layer model, 4 GPUs, a copy of the
A100 profile whose memory size a test may shrink to make configurations run out of memory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]

TINY_SCENARIO: dict[str, Any] = {
    "name": "tiny",
    "hardware": "gpu.yaml",
    "model": {
        "num_layers": 8,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "seq_length": 1024,
        "vocab_size": 32000,
    },
    "parallel": {"tp": 1, "pp": 1},
    "training": {"micro_batch_size": 1, "global_batch_size": 8},
}

# 2 tp x 2 pp x 2 vpp x 2 sp x 2 recompute = 32 combinations, all dividing 4 GPUs.
# Valid: (tp, pp) = (1, 1): 1 vpp x 1 sp x 2 = 2; (1, 2): 2 x 1 x 2 = 4; (2, 1): 1 x 2 x 2 = 4;
# (2, 2): 2 x 2 x 2 = 8  ->  18 valid (vpp > 1 needs pp > 1, sp needs tp > 1), 14 invalid.
SMALL_AXES: dict[str, Any] = {
    "tp": [1, 2],
    "pp": [1, 2],
    "vpp": [1, 2],
    "sequence_parallel": [False, True],
    "recompute": ["none", "full"],
}
SMALL_NUM_VALID = 18

SweepWriter = Callable[..., Path]


def write_sweep_files(
    folder: Path, axes: dict[str, Any] | None = None, num_gpus: int = 4, memory_gb: float = 80.0
) -> Path:
    """Write scenario + profile + spec under `folder`; return the spec's path."""
    profile = yaml.safe_load((ROOT / "hwprofiles" / "a100-sxm4-80gb.yaml").read_text())
    profile["gpu"]["memory_gb"] = memory_gb
    if memory_gb != 80.0:  # a small test device: that capacity, no CUDA/NCCL reserve
        profile["gpu"]["memory_capacity_mib"] = memory_gb * 1e9 / 2**20
        profile["gpu"].pop("cuda_context_mib", None)
        profile["gpu"].pop("nccl_buffers_mib", None)
    scenarios = folder / "scenarios"
    scenarios.mkdir(exist_ok=True)
    (scenarios / "gpu.yaml").write_text(yaml.safe_dump(profile))
    (scenarios / "tiny.yaml").write_text(yaml.safe_dump(TINY_SCENARIO))
    spec = {"base": "scenarios/tiny.yaml", "num_gpus": num_gpus, "axes": axes or SMALL_AXES}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path
