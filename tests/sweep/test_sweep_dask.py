"""The same sweep on a local process pool and on a Dask LocalCluster gives the same table."""

from __future__ import annotations

import pandas as pd
import pytest
from sweep_cases import SMALL_NUM_VALID

from simcluster.sweep import run_sweep

distributed = pytest.importorskip("distributed")


def test_dask_local_cluster_matches_the_process_pool(write_sweep, tmp_path):
    """Two pool workers vs a one-worker, two-thread in-process Dask cluster (by address)."""
    spec = write_sweep(memory_gb=2.0)
    pool = run_sweep(spec, tmp_path / "pool.parquet", workers=2, progress=False)
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
    ) as cluster:
        dask = run_sweep(spec, tmp_path / "dask.parquet", dask=cluster.scheduler_address, progress=False)
    assert len(pool) == SMALL_NUM_VALID and set(pool["status"]) == {"ok", "oom"}
    pd.testing.assert_frame_equal(dask, pool)
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "dask.parquet"), pool)
