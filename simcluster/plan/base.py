"""The scenario a plan starts from. Its layout is what the plan searches, so a plan file may
leave out `parallel` and `training.micro_batch_size` (tp = pp = 1, micro-batch 1 are used
only to validate the rest); every other key and rule is the scenario loader's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from simcluster.config.files import read_yaml
from simcluster.config.scenario import Scenario, parse_scenario


def load_plan_scenario(path: str | Path, hardware: str | None = None) -> Scenario:
    """Load `path` as a plan's base scenario; `hardware` replaces its profile reference."""
    path = Path(path)
    data: Any = read_yaml(path)
    if isinstance(data, dict):
        data = {**data}
        data.setdefault("parallel", {"tp": 1, "pp": 1})
        if isinstance(data.get("training"), dict):
            data["training"] = {"micro_batch_size": 1, **data["training"]}
        if hardware is not None:
            data["hardware"] = hardware
    return parse_scenario(data, path, default_name=path.stem)
