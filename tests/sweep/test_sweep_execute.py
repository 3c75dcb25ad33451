"""Execution: out-of-memory configurations are kept as rows but never simulated; a
configuration that raises is an error row; every finished row is on disk."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from sweep_cases import SMALL_NUM_VALID

from simcluster import simulation
from simcluster.config.errors import ConfigError
from simcluster.memory_plan import stage_memory_estimate
from simcluster.sweep import best_by_mfu, execute_sweep, expand, load_sweep_spec, run_sweep
from simcluster.sweep.store import parts_folder


@pytest.fixture
def simulated(monkeypatch) -> list[str]:
    """The scenarios run_simulation was called for (as 'tp,pp,vpp,sp,recompute')."""
    calls: list[str] = []
    real = simulation.run_simulation

    def spy(scenario, hw, record=False, workload=None, steady_state=False, pricing=None):
        p, t = scenario.parallel, scenario.training
        calls.append(f"{p.tp},{p.pp},{p.vpp},{p.sequence_parallel},{t.recompute.value}")
        return real(scenario, hw, record, workload, steady_state, pricing)

    monkeypatch.setattr(simulation, "run_simulation", spy)
    return calls


def test_every_valid_configuration_is_simulated_when_all_fit(write_sweep, tmp_path, simulated):
    """80 GB: 18 ok rows, each event-simulated; the table is sorted by layout."""
    table = run_sweep(write_sweep(), tmp_path / "out.parquet", workers=1, progress=False)
    assert len(table) == SMALL_NUM_VALID == len(simulated)
    assert set(table["status"]) == {"ok"}
    assert (table["num_events"] > 0).all() and table["fits"].all()
    usable = (81920 - 400 - 1011) * 2**20  # the A100 profile: driver capacity less CUDA and NCCL reserve
    assert (table["capacity_bytes"] == usable).all() and (table["headroom_fraction"] == 0.1).all()
    assert (table["memory_headroom_bytes"] == usable - table["max_stage_peak_memory_bytes"]).all()
    assert list(table[["tp", "pp"]].itertuples(index=False)) == sorted(
        table[["tp", "pp"]].itertuples(index=False)
    )
    assert table.iloc[0]["config_id"].startswith("tp=1,pp=1,dp=4,vpp=1,")
    assert table.iloc[0]["recompute"] == "none" and table.iloc[1]["recompute"] == "full"
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "out.parquet"), table)


def test_out_of_memory_rows_carry_the_bytes_needed_and_are_not_simulated(write_sweep, tmp_path, simulated):
    """2 GB GPUs, no headroom: tp = 1 without recompute (2.5 to 3.5 GB) and tp = pp = 1 with
    full recompute (2.7 GB) do not fit; they become oom rows, the other 14 are simulated."""
    spec_path = write_sweep(memory_gb=2.0)
    table = run_sweep(spec_path, tmp_path / "out.parquet", workers=1, progress=False, headroom_fraction=0.0)
    oom = table[table["status"] == "oom"]
    assert len(oom) == 4 and len(simulated) == SMALL_NUM_VALID - 4
    assert set(oom["tp"]) == {1} and not ((oom["pp"] == 2) & (oom["recompute"] == "full")).any()
    assert (oom["num_events"] == 0).all() and oom["mfu"].isna().all() and not oom["fits"].any()
    assert (oom["memory_headroom_bytes"] < 0).all()
    assert oom["message"].str.contains("GB, may use 2.0 GB").all()
    spec = load_sweep_spec(spec_path)
    for config in expand(spec).configs:
        row = table[table["config_id"] == config.config_id].iloc[0]
        peaks = [stage.peak_memory_bytes for stage in stage_memory_estimate(config.scenario, spec.hardware)]
        assert row["max_stage_peak_memory_bytes"] == max(peaks)
        assert list(row["stage_peak_memory_bytes"]) == peaks
        assert (row["status"] == "oom") == (max(peaks) > 2e9)


def test_headroom_leaves_that_fraction_of_usable_memory_free(write_sweep, tmp_path):
    """2 GB GPUs, headroom 0.1: the limit is 1.8 GB, so tp 2, pp 1 without SP or recompute
    (1.81 GB, which fits with no headroom) is an oom row too: 5 oom, 13 simulated. The
    headroom is in every row and in the resume fingerprint."""
    spec_path, out = write_sweep(memory_gb=2.0), tmp_path / "out.parquet"
    table = run_sweep(spec_path, out, workers=1, progress=False, headroom_fraction=0.1)
    oom = table[table["status"] == "oom"]
    assert len(oom) == 5 and (table["headroom_fraction"] == 0.1).all()
    squeezed = oom[(oom["tp"] == 2) & (oom["pp"] == 1)].iloc[0]
    assert 1.8e9 < squeezed["max_stage_peak_memory_bytes"] <= 2e9 and squeezed["memory_headroom_bytes"] > 0
    assert not squeezed["fits"] and "may use 1.8 GB (2.0 GB usable, headroom 0.1)" in squeezed["message"]
    ok = table[table["status"] == "ok"]
    assert (ok["max_stage_peak_memory_bytes"] <= 1.8e9).all() and ok["fits"].all()
    best = best_by_mfu(table, 100)
    assert list(best["config_id"]) == list(ok.sort_values("mfu", ascending=False)["config_id"])
    with pytest.raises(ConfigError, match=r"\(the headroom_fraction differs;"):
        run_sweep(spec_path, out, workers=1, progress=False, headroom_fraction=0.2, resume=True)


@pytest.mark.parametrize("headroom", [-0.1, 1.0, math.nan])
def test_headroom_outside_0_1_is_refused(write_sweep, tmp_path, headroom):
    """The same rule and message as plan's --headroom."""
    with pytest.raises(ConfigError, match=r"--headroom: value .*: must be at least 0 and below 1"):
        run_sweep(write_sweep(), tmp_path / "o.parquet", workers=1, headroom_fraction=headroom)
    assert not (tmp_path / "o.parquet").exists()


def test_a_configuration_that_raises_is_an_error_row(write_sweep, tmp_path, monkeypatch):
    """The simulator raising for one configuration leaves one error row; the rest run."""
    real = simulation.run_simulation

    def flaky(scenario, hw, record=False, workload=None, steady_state=False, pricing=None):
        if scenario.parallel.vpp == 2 and scenario.parallel.sequence_parallel:
            raise RuntimeError("engine deadlock (injected)")
        return real(scenario, hw, record, workload, steady_state, pricing)

    monkeypatch.setattr(simulation, "run_simulation", flaky)
    table = run_sweep(write_sweep(), tmp_path / "out.parquet", workers=1, progress=False)
    errors = table[table["status"] == "error"]
    assert len(errors) == 2 and len(table) == SMALL_NUM_VALID  # tp = pp = vpp = 2, sp, none | full
    assert errors["message"].str.startswith("RuntimeError: engine deadlock (injected) (at ").all()
    assert errors["max_stage_peak_memory_bytes"].notna().all()  # memory was estimated before
    assert errors["mfu"].isna().all() and (errors["num_events"] == 0).all()
    assert set(table["status"]) == {"ok", "error"}


def test_every_finished_row_is_on_disk_before_the_next_one(write_sweep, tmp_path):
    """With flush_every_s = 0 each row is on disk by the time the hook sees it: in a part file
    beside the output (`store`), combined into the output when the sweep ends."""
    out = tmp_path / "out.parquet"
    seen: list[str] = []

    def check(row):
        seen.append(row["config_id"])
        assert set(seen) <= set(pd.read_parquet(parts_folder(out))["config_id"])

    execute_sweep(write_sweep(), out, workers=1, progress=False, flush_every_s=0.0, on_row=check)
    assert len(seen) == SMALL_NUM_VALID
    assert set(pd.read_parquet(out)["config_id"]) == set(seen) and not parts_folder(out).exists()


def test_csv_twin_and_best_by_mfu(write_sweep, tmp_path):
    """--csv writes the same rows as CSV; best_by_mfu keeps fitting rows, highest MFU first."""
    out = tmp_path / "out.parquet"
    table = run_sweep(write_sweep(memory_gb=2.0), out, workers=1, csv=True, progress=False)
    csv = pd.read_csv(out.with_suffix(".csv"))
    assert list(csv["config_id"]) == list(table["config_id"])
    best = best_by_mfu(table, 3)
    assert len(best) == 3 and (best["status"] == "ok").all()
    assert list(best["mfu"]) == sorted(table.loc[table["status"] == "ok", "mfu"], reverse=True)[:3]
    assert not math.isnan(best["mfu"].iloc[0])
