"""One source of truth: the real layer's saved bytes, the simulator's op graph and the
paper's Table 2 formula are the same number (apart from the named layer-norm stats)."""

from __future__ import annotations

import pytest

from simcluster.config.choices import Recompute
from simcluster.profiler.layer.accounting import measure_saved_bytes, negligible_buffers
from simcluster.profiler.layer.spec import LayerSpec
from simcluster.workload.layer import saved_activation_bytes
from simcluster.workload.memory import table2_bytes_per_layer

ROWS = [
    (1, False, Recompute.NONE),
    (2, False, Recompute.NONE),
    (4, True, Recompute.NONE),
    (2, False, Recompute.SELECTIVE),
    (4, True, Recompute.SELECTIVE),
    (2, False, Recompute.FULL),
]


@pytest.mark.parametrize(("tp", "sp", "recompute"), ROWS)
@pytest.mark.parametrize(("h", "a", "s", "b"), [(96, 4, 40, 3), (128, 8, 64, 2)])
def test_measured_equals_op_graph_equals_table2(tp, sp, recompute, h, a, s, b):
    """measured − layer-norm stats == Σ op-graph saved bytes == Table 2 row (bf16)."""
    spec = LayerSpec(h, a, s, b, tp=tp, sequence_parallel=sp, recompute=recompute)
    measured = measure_saved_bytes(spec).total_bytes - sum(negligible_buffers(spec, "cpu").values())
    op_graph = saved_activation_bytes(spec.config())
    paper = table2_bytes_per_layer(s, b, h, a, tp, sp, recompute)
    assert measured == op_graph == paper
