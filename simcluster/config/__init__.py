"""Files -> frozen, validated models. No logic beyond validation."""

from simcluster.config.choices import Dtype, Recompute, ScheduleKind
from simcluster.config.errors import ConfigError
from simcluster.config.hardware import HardwareProfile, load_hardware
from simcluster.config.scenario import (
    ModelSpec,
    ParallelSpec,
    Scenario,
    TrainingSpec,
    load_scenario,
    load_scenario_and_hardware,
    parse_scenario,
)

__all__ = [
    "ConfigError",
    "Dtype",
    "HardwareProfile",
    "ModelSpec",
    "ParallelSpec",
    "Recompute",
    "Scenario",
    "ScheduleKind",
    "TrainingSpec",
    "load_hardware",
    "load_scenario",
    "load_scenario_and_hardware",
    "parse_scenario",
]
