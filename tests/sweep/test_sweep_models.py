"""Specs that vary the hardware, the sequence length and the model (a list of base files):
each is a column of the table and part of the configuration id, `auto` covers every base,
the loader's rules filter per model, and resume fingerprints each base and profile."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from sweep_cases import TINY_SCENARIO

from simcluster.config.errors import ConfigError
from simcluster.config.hardware import load_hardware
from simcluster.sweep import execute_sweep, expand, load_sweep_spec, run_sweep


def _with_second_base(spec_path, **model) -> None:
    """Add scenarios/small.yaml (the tiny model with `model` changed) as a second base."""
    folder = spec_path.parent
    small = {**TINY_SCENARIO, "name": "small", "model": {**TINY_SCENARIO["model"], **model}}
    (folder / "scenarios" / "small.yaml").write_text(yaml.safe_dump(small))
    data = yaml.safe_load(spec_path.read_text())
    data["base"] = ["scenarios/tiny.yaml", "scenarios/small.yaml"]
    spec_path.write_text(yaml.safe_dump(data))


def _problems(path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_sweep_spec(path)
    return "\n".join(caught.value.problems)


def test_hardware_axis_runs_each_profile_with_its_own_capacity(write_sweep, tmp_path):
    """Two shipped profiles by name: one row each, the H100 faster than the A100, each row's
    capacity its own profile's usable memory."""
    names = ["a100-sxm4-80gb", "h100-sxm5-80gb"]
    table = run_sweep(write_sweep({"tp": [2], "hardware": names}), tmp_path / "o.parquet", workers=1,
                      progress=False).set_index("hardware")  # fmt: skip
    assert sorted(table.index) == names and set(table["status"]) == {"ok"}
    assert table.loc["h100-sxm5-80gb", "iteration_time_s"] < table.loc["a100-sxm4-80gb", "iteration_time_s"]
    for name in names:
        assert table.loc[name, "capacity_bytes"] == load_hardware(name).usable_memory_bytes
        assert f"hardware={name}" in table.loc[name, "config_id"]


def test_seq_length_axis_sets_the_model_and_the_loader_filters(write_sweep):
    """seq_length 512 and 1024 both valid; 1001 with tp 2 and sequence parallelism is not
    divisible by tp: the loader rejects it, naming model.seq_length."""
    spec = load_sweep_spec(
        write_sweep({"tp": [2], "sequence_parallel": [True], "seq_length": [512, 1001, 1024]})
    )
    expansion = expand(spec)
    assert [c.layout["seq_length"] for c in expansion.configs] == [512, 1024]
    assert [c.scenario.model.seq_length for c in expansion.configs] == [512, 1024]
    ((key, problems),) = expansion.invalid
    assert "seq_length=1001" in key and any(p.startswith("model.seq_length") for p in problems)


def test_a_list_of_bases_sweeps_each_model(write_sweep, tmp_path):
    """tiny (8 layers) and small (6 layers): `auto` pp is the union {1, 2, 4}; pp 4 does not
    divide 6 layers, so small has no pp-4 rows (invalid), tiny has them; rows carry the model."""
    spec_path = write_sweep({"tp": [1], "pp": "auto"})
    _with_second_base(spec_path, num_layers=6)
    spec = load_sweep_spec(spec_path)
    assert [base.name for base in spec.bases] == ["tiny", "small"] and spec.axes["pp"] == (1, 2, 4)
    table = run_sweep(spec_path, tmp_path / "o.parquet", workers=1, progress=False)
    pps = table.groupby("model")["pp"].apply(sorted).to_dict()
    assert pps == {"tiny": [1, 2, 4], "small": [1, 2]}
    assert table["config_id"].is_unique and list(table["model"]) == ["small"] * 2 + ["tiny"] * 3


def test_bases_sharing_a_name_are_refused(write_sweep):
    spec_path = write_sweep({"tp": [1]})
    _with_second_base(spec_path, num_layers=6)
    small = spec_path.parent / "scenarios" / "small.yaml"
    small.write_text(small.read_text().replace("name: small", "name: tiny"))
    assert "base[1]: value 'scenarios/small.yaml': its scenario name 'tiny' is also base[0]'s" in _problems(
        spec_path
    )


def test_bad_bases_and_profiles_name_the_field(write_sweep):
    """A missing second base, bases of different GPU counts without num_gpus, an unknown
    profile on the hardware axis: each a problem naming the field and the value."""
    spec_path = write_sweep({"tp": [1], "hardware": ["no-such-gpu"]})
    data = yaml.safe_load(spec_path.read_text())
    assert "axes.hardware: value 'no-such-gpu': hardware: value 'no-such-gpu'" in _problems(spec_path)
    data["base"] = ["scenarios/tiny.yaml", "scenarios/missing.yaml"]
    spec_path.write_text(yaml.safe_dump(data))
    assert "base[1]: value 'scenarios/missing.yaml': no scenario file at" in _problems(spec_path)
    _with_second_base(spec_path)
    small = spec_path.parent / "scenarios" / "small.yaml"
    small.write_text(yaml.safe_dump({**yaml.safe_load(small.read_text()), "parallel": {"tp": 2, "pp": 1}}))
    data = yaml.safe_load(spec_path.read_text())
    del data["num_gpus"], data["axes"]["hardware"]
    spec_path.write_text(yaml.safe_dump(data))
    assert "num_gpus: missing, and the bases use different GPU counts (tiny.yaml 1, small.yaml 2)" in (
        _problems(spec_path)
    )


def test_resume_extends_with_another_model_and_refuses_a_changed_one(write_sweep, tmp_path):
    """Adding a base is more values (its rows join the table, the old ones are not re-run);
    changing a base that the table already holds is refused, naming that base."""
    spec_path, out = write_sweep({"tp": [1, 2]}), tmp_path / "o.parquet"
    first = run_sweep(spec_path, out, workers=1, progress=False)
    _with_second_base(spec_path, num_layers=4)
    more = execute_sweep(spec_path, out, workers=1, progress=False, resume=True)
    assert (more.num_resumed, more.num_run) == (len(first), 2)
    pd.testing.assert_frame_equal(more.table[more.table["model"] == "tiny"].reset_index(drop=True), first)
    small = spec_path.parent / "scenarios" / "small.yaml"
    small.write_text(small.read_text().replace("vocab_size: 32000", "vocab_size: 51200"))
    with pytest.raises(ConfigError, match=r"\(the base scenario small differs;"):
        execute_sweep(spec_path, out, workers=1, progress=False, resume=True)


def test_todays_single_base_specs_stay_valid():
    """The shipped spec (one base file, no new keys) loads as before."""
    spec = load_sweep_spec("sweeps/gpt3-175b-1024gpus.yaml")
    assert len(spec.bases) == 1 and spec.num_gpus == 1024 and "hardware" not in spec.axes


def test_the_shipped_hardware_and_sequence_spec_loads():
    """sweeps/gpt3-175b-a100-vs-h100.yaml (the README's example): both profiles, both lengths."""
    spec = load_sweep_spec("sweeps/gpt3-175b-a100-vs-h100.yaml")
    assert list(spec.profiles) == ["a100-sxm4-80gb", "h100-sxm5-80gb"]
    assert spec.axes["seq_length"] == (2048, 4096) and spec.axes["hardware"] == tuple(spec.profiles)
    configs = expand(spec).configs
    assert {(c.layout["hardware"], c.scenario.model.seq_length) for c in configs} == {
        (h, s) for h in spec.profiles for s in (2048, 4096)
    }
