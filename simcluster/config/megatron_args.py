"""Megatron-LM launch lines <-> scenarios: `import-megatron` (`parse_megatron_args`) and
`export-megatron` / `plan` (`to_megatron_args`).

The parts: `megatron_flags` (which flag is used, ignored, not modelled or unknown),
`megatron_cmdline` (shell words -> flags -> typed values), `megatron_fields` (flags -> the
model / parallel / training mappings), `megatron_moe` (the MoE, MLA, MTP, window,
kv-channels and recompute-module flags; `megatron_pattern` reads Megatron's per-layer
patterns), `megatron_import` (the scenario, and what happened to each flag) and
`megatron_export` / `megatron_moe_export` (scenario -> flags). This module keeps the one
import path the rest of the package and its users rely on.
"""

from __future__ import annotations

from simcluster.config.megatron_cmdline import collect_flags, split_command_line
from simcluster.config.megatron_export import to_megatron_args
from simcluster.config.megatron_fields import padded_vocab_size
from simcluster.config.megatron_flags import DEFAULT_HARDWARE, DEFAULT_VOCAB_SIZE, SOURCE
from simcluster.config.megatron_import import MegatronImport, parse_megatron_args

__all__ = [
    "DEFAULT_HARDWARE",
    "DEFAULT_VOCAB_SIZE",
    "SOURCE",
    "MegatronImport",
    "collect_flags",
    "padded_vocab_size",
    "parse_megatron_args",
    "split_command_line",
    "to_megatron_args",
]
