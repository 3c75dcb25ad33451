"""Sweeps over a MoE model's expert layout: parallel.ep and parallel.etp are axes; the
loader's MoE rules reject bad combinations with their reasons; a table written before these
axes existed resumes with its ids unchanged."""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from sweep_cases import TINY_SCENARIO, write_sweep_files

from simcluster.config.errors import ConfigError
from simcluster.sweep import execute_sweep, run_sweep
from simcluster.sweep.expand import expand
from simcluster.sweep.spec import load_sweep_spec

MOE_MODEL = {
    **TINY_SCENARIO["model"],
    "activation": "swiglu",
    "moe": {"num_experts": 8, "router_topk": 2, "ffn_hidden_size": 512},
}


def _moe_spec(folder, axes, num_gpus=4):
    """The sweep world with its base turned into a MoE model of 8 experts."""
    spec = write_sweep_files(folder, axes, num_gpus=num_gpus)
    base = folder / "scenarios" / "tiny.yaml"
    base.write_text(yaml.safe_dump({**TINY_SCENARIO, "model": MOE_MODEL}))
    return spec


def test_ep_and_etp_are_swept_and_bad_combinations_say_why(tmp_path):
    """4 GPUs, tp 1, pp 1 (dp 4): ep 1, 2, 4 run; ep 3 and ep 8 do not fold into dp 4, each
    rejected with Megatron-core's rule; nor does etp 2 at ep 4."""
    spec = load_sweep_spec(_moe_spec(tmp_path, {"ep": [1, 2, 3, 4, 8], "etp": [1, 2]}))
    expansion = expand(spec)
    valid = sorted((c.layout["ep"], c.layout["etp"]) for c in expansion.configs)
    assert valid == [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)]
    reasons = dict(expansion.invalid)
    (ep3,) = [problems for key, problems in reasons.items() if "ep=3,etp=1" in key]
    assert "ep·etp=3 must divide tp·cp·dp=4" in ep3[0]
    (ep8,) = [problems for key, problems in reasons.items() if "ep=8,etp=1" in key]
    assert "ep·etp=8 must divide tp·cp·dp=4" in ep8[0]
    assert expansion.invalid_by_field() == {"parallel.ep": 5}  # counted by field, as other rules


def test_moe_rows_carry_ep_and_etp_and_their_ids_name_them(tmp_path):
    """The table has ep / etp columns; an id names ep only away from 1 (dense ids unchanged)."""
    table = run_sweep(_moe_spec(tmp_path, {"ep": [1, 2], "etp": [1]}), tmp_path / "o.parquet", workers=1,
                      progress=False)  # fmt: skip
    assert sorted(table["ep"]) == [1, 2] and list(table["etp"]) == [1, 1]
    assert (table["status"] == "ok").all()
    ids = dict(zip(table["ep"], table["config_id"]))
    assert "ep=" not in ids[1] and ",ep=2,etp=1," in ids[2]
    assert (
        table.loc[table["ep"] == 1, "iteration_time_s"].iloc[0]
        != table.loc[table["ep"] == 2, "iteration_time_s"].iloc[0]
    )


def test_dense_base_with_ep_is_invalid_and_etp_auto_is_an_error(write_sweep):
    """A dense model has no experts: ep 2 is rejected by the loader, `etp: auto` by the spec."""
    expansion = expand(load_sweep_spec(write_sweep({"ep": [1, 2]})))
    assert [c.layout["ep"] for c in expansion.configs] == [1]
    ((_, problems),) = expansion.invalid
    assert problems[0].startswith("parallel.ep: value 2: needs model.moe")
    with pytest.raises(ConfigError, match="axes.etp: value 'auto': no value for these bases"):
        load_sweep_spec(write_sweep({"etp": "auto"}))


def test_table_written_before_the_expert_axes_resumes_unchanged(write_sweep, tmp_path):
    """A table without ep / etp columns (written before they were axes) resumes: its rows
    get the base's ep 1 and etp null, keep their ids, and nothing is run again."""
    spec, out = write_sweep({"tp": [1, 2]}), tmp_path / "out.parquet"
    first = run_sweep(spec, out, workers=1, progress=False)
    old = pq.read_table(out)
    pq.write_table(old.drop_columns(["ep", "etp"]).replace_schema_metadata(old.schema.metadata), out)
    again = execute_sweep(spec, out, workers=1, progress=False, resume=True)
    assert again.num_run == 0
    pd.testing.assert_frame_equal(again.table, first)
