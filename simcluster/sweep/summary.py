"""A finished sweep as data: the summary counts and the best rows, JSON-ready (finite
numbers or null, never NaN), each with its Megatron-LM launch line, for `simcluster sweep
--json` and notebooks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from simcluster.config.errors import ConfigError
from simcluster.config.megatron_args import to_megatron_args
from simcluster.sweep.axes import LAYOUT_COLUMNS, MODEL_COLUMN
from simcluster.sweep.expand import layout_config

if TYPE_CHECKING:
    from simcluster.sweep.expand import SweepConfig
    from simcluster.sweep.run import SweepOutcome
    from simcluster.sweep.spec import SweepSpec

DEFAULT_TOP = 10


def swept_columns(outcome: SweepOutcome) -> list[str]:
    """The layout columns a table of this sweep must show: tp, pp, dp, every axis the spec
    names (even one with one value: the reader asked for it), and the model when the spec
    has several bases."""
    named = [name for name in outcome.spec.axes if name not in ("tp", "pp")]
    model = [MODEL_COLUMN] if len(outcome.spec.bases) > 1 else []
    return [*model, "tp", "pp", "dp", *named]


def megatron_args(spec: SweepSpec, config: SweepConfig) -> str:
    """The configuration's Megatron-LM launch line, as `plan` and `export-megatron` write it
    (`to_megatron_args`, torchrun's --nproc_per_node from its hardware profile): one string
    that `import-megatron` reads back to the same layout. ConfigError for a configuration
    Megatron-LM cannot run (the GPipe schedule)."""
    profile = spec.profiles.get(config.scenario.hardware)
    if profile is None:  # a resumed row of a profile this spec no longer sweeps
        raise ConfigError(
            spec.source, [f"hardware: value {config.scenario.hardware!r}: not a profile of this spec"]
        )
    return to_megatron_args(config.scenario, profile.network.gpus_per_node)


def row_megatron_args(outcome: SweepOutcome, row: pd.Series, configs: dict[str, SweepConfig]) -> str:
    """`megatron_args` of a table row: its configuration from `configs` (by id), else
    rebuilt from the row's layout (a row resumed from an earlier spec's axes)."""
    config = configs.get(str(row["config_id"]))
    if config is None:
        config = layout_config(outcome.spec, {name: _plain(row[name]) for name in LAYOUT_COLUMNS})
    return megatron_args(outcome.spec, config)


def configs_by_id(outcome: SweepOutcome) -> dict[str, SweepConfig]:
    """Each valid configuration of the sweep by its id (a table row's `config_id`)."""
    return {config.config_id: config for config in outcome.expansion.configs}


def _megatron_args_or_none(
    outcome: SweepOutcome, row: pd.Series, configs: dict[str, SweepConfig]
) -> str | None:
    try:
        return row_megatron_args(outcome, row, configs)
    except ConfigError:
        return None


def _plain(value: Any) -> Any:
    """A JSON value: numpy scalars as Python numbers, NaN / NA as None, arrays as lists."""
    if isinstance(value, (np.ndarray, list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or value is pd.NA or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value


def row_json(row: pd.Series) -> dict[str, Any]:
    return {str(column): _plain(value) for column, value in row.items()}


def sweep_json(outcome: SweepOutcome, out: Path, top: int = DEFAULT_TOP) -> dict[str, Any]:
    """The summary of `outcome` and its best `top` rows that fit, every column and
    `megatron_args` (null where Megatron-LM cannot run the configuration: GPipe), ranked by
    MFU, or by tokens/s per GPU where the hardware varies (`ranked_by` says which)."""
    from simcluster.sweep.run import best_rows

    expansion = outcome.expansion
    configs = configs_by_id(outcome)
    best, ranked_by = best_rows(outcome.table, top)
    return {
        "spec": str(outcome.spec.source),
        "out": str(out),
        "models": [base.name for base in outcome.spec.bases],
        "num_gpus": outcome.spec.num_gpus,
        "headroom_fraction": outcome.headroom_fraction,
        "swept_axes": swept_columns(outcome),
        "num_combinations": expansion.num_combinations,
        "num_valid": len(expansion.configs),
        "num_invalid": len(expansion.invalid),
        "invalid_by_field": expansion.invalid_by_field(),
        "num_run": outcome.num_run,
        "num_resumed": outcome.num_resumed,
        "status_counts": outcome.status_counts,
        "elapsed_s": outcome.elapsed_s,
        "ranked_by": ranked_by,
        "top": [
            {
                **row_json(row),
                "megatron_args": _megatron_args_or_none(outcome, row, configs),
            }
            for _, row in best.iterrows()
        ],
    }
