"""The MoE / MLA model description and expert layout, re-exported for the workload.

The dataclasses and their Megatron-core rules live in `simcluster.config.moe_config` so the
scenario validator (config, below the workload) raises the same errors as the workload's
building blocks; this module keeps the workload's import path.
"""

from __future__ import annotations

from simcluster.config.moe_config import (
    ExpertLayout,
    MLAConfig,
    MoEConfig,
    check_mla_attention,
    check_moe_parallel,
)

__all__ = ["ExpertLayout", "MLAConfig", "MoEConfig", "check_mla_attention", "check_moe_parallel"]
