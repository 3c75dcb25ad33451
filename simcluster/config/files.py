"""Reading configuration files: one place that turns missing files and bad YAML into
ConfigErrors naming the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from simcluster.config.errors import ConfigError


def read_yaml(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(path, ["file not found"])
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(path, [f"not valid YAML: {error}"]) from None
