"""The layer-stack memory profiler: its CPU path here, its CUDA path where a GPU exists."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from simcluster.config.choices import Recompute
from simcluster.profiler.bench.gpu_memory import main, measure_stack
from simcluster.profiler.layer.spec import LayerSpec

TINY = [
    "--hidden-size",
    "64",
    "--num-attention-heads",
    "4",
    "--seq-length",
    "32",
    "--micro-batch-size",
    "2",
    "--tp",
    "2",
    "--num-layers",
    "3",
    "--device",
    "cpu",
]
REPO = Path(__file__).resolve().parents[2]


def test_cpu_run_writes_csv_and_markdown(tmp_path: Path) -> None:
    """Six Table 2 rows; a stack of 3 layers keeps 3 × (Table 2 + negligible) bytes."""
    rows = main([*TINY, "--out-dir", str(tmp_path)])
    assert len(rows) == 6
    assert all(r.retained_bytes == r.predicted_bytes for r in rows)
    with (tmp_path / "gpu_memory.csv").open() as f:
        records = list(csv.DictReader(f))
    assert [r["recompute"] for r in records] == ["none", "none", "selective", "selective", "full", "full"]
    assert records[0]["torch_version"] == torch.__version__
    markdown = (tmp_path / "gpu_memory.md").read_text().splitlines()
    assert len(markdown) == 2 + 6 and markdown[2].startswith("| ")


def test_runs_with_torch_and_stdlib_only(tmp_path: Path) -> None:
    """`python -m simcluster.profiler.bench.gpu_memory` needs none of the simulator's dependencies."""
    blocked = ["pydantic", "yaml", "simpy", "pandas", "matplotlib", "typer", "pyarrow"]
    code = (
        f"import sys, runpy\nfor m in {blocked!r}: sys.modules[m] = None\n"
        f"sys.argv = ['gpu_memory', *{TINY!r}, '--recompute', 'selective', "
        f"'--out-dir', {str(tmp_path)!r}]\n"
        "runpy.run_module('simcluster.profiler.bench.gpu_memory', run_name='__main__')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "gpu_memory.csv").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("recompute", list(Recompute))
@pytest.mark.parametrize("sp", [False, True])
def test_cuda_allocated_bytes_match_prediction(recompute: Recompute, sp: bool) -> None:
    """max/memory_allocated of a real forward vs Table 2 + fp32 LN stats, within rounding."""
    spec = LayerSpec(1024, 16, 512, 2, tp=2, sequence_parallel=sp, recompute=recompute)
    row = measure_stack(spec, num_layers=2, device="cuda")
    rounding = 512 * 20 * row.num_layers  # the caching allocator rounds blocks to 512 B
    assert abs(row.retained_bytes - row.predicted_bytes) <= rounding
    assert row.peak_bytes >= row.retained_bytes
