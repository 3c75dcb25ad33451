"""Files -> frozen, validated models. No logic beyond validation, and the one translation
into and out of them: a Megatron launch line <-> a scenario (`megatron_args`, over
`megatron_flags`, `megatron_cmdline`, `megatron_import` and `megatron_export`).

Re-exports are lazy so that `simcluster.config.choices` (plain enums) imports with the
standard library alone: the torch profiler runs on machines without pydantic or yaml.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Dtype": "choices",
    "Recompute": "choices",
    "ScheduleKind": "choices",
    "ConfigError": "errors",
    "HardwareProfile": "hardware",
    "load_hardware": "hardware",
    "ModelSpec": "scenario",
    "ParallelSpec": "scenario",
    "Scenario": "scenario",
    "TrainingSpec": "scenario",
    "load_scenario": "scenario",
    "load_scenario_and_hardware": "scenario",
    "parse_scenario": "scenario",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
