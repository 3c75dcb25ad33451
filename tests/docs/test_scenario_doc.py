"""docs/scenario.md's key table is the scenario contract in one place: it names every key the
loader accepts, no other, each with the loader's default (or "required")."""

from __future__ import annotations

import enum
import re

from pydantic_core import PydanticUndefined

from simcluster.config.scenario import ModelSpec, ParallelSpec, Scenario, TrainingSpec
from tests.paths import ROOT

DOC = (ROOT / "docs" / "scenario.md").read_text(encoding="utf-8")
# Keys whose default is computed from other keys, so the table says how in words.
COMPUTED = {
    "name": "the file stem",
    "model.ffn_hidden_size": "4 · hidden_size",
    "model.num_query_groups": "num_attention_heads",
}


def _table() -> dict[str, str]:
    """key -> default cell of the table under "Every key"."""
    start = DOC.index("## Every key")
    section = DOC[start : DOC.index("\n## ", start + 1)]
    rows = re.findall(r"^\| `([\w.]+)` \| ([^|]+) \|", section, re.MULTILINE)
    return {key: default.strip() for key, default in rows}


def _loader_defaults() -> dict[str, object]:
    keys: dict[str, object] = {}
    for name, field in Scenario.model_fields.items():
        if name not in ("model", "parallel", "training"):
            keys[name] = field.default
    for section, model in (("model", ModelSpec), ("parallel", ParallelSpec), ("training", TrainingSpec)):
        for name, field in model.model_fields.items():
            keys[f"{section}.{name}"] = field.default
    return keys


def _shown(default: object) -> str:
    if default is PydanticUndefined:
        return "required"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, enum.Enum):
        return f"`{default.value}`"
    if default is None:
        return "`null`"
    if isinstance(default, tuple):  # a YAML list
        return "`[" + ", ".join(_shown(item).strip("`") for item in default) + "]`"
    return str(default)


def test_the_key_table_names_every_loader_key_and_no_other():
    assert set(_table()) == set(_loader_defaults())


def test_each_key_shows_the_loaders_default():
    table = _table()
    for key, default in _loader_defaults().items():
        if key in COMPUTED:
            assert COMPUTED[key] in table[key], key
        else:
            assert table[key] == _shown(default), key
