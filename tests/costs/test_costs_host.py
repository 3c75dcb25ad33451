"""Host issue time (`costs.host`): the GPU waits only when the host is slower, op by op in
issue order, CUDA graphs remove what they capture, and a profile without the key prices no
host time."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simcluster.config import ConfigError, load_hardware, parse_scenario
from simcluster.config.choices import CudaGraphImpl, Dtype
from simcluster.config.files import read_yaml
from simcluster.config.hardware import parse_hardware
from simcluster.costs.host import HostPiece, chunk_kernels, inorder_wait_s, kernels_issued
from simcluster.simulation import run_simulation
from simcluster.workload.model import build_workload
from tests.modern_cases import llama3_8b
from tests.paths import ROOT

H100 = load_hardware("h100-sxm5-80gb")
# A small Llama layer at tp 8: the GPU work per task is well under a millisecond.
SMALL = llama3_8b(
    model={"num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "num_query_groups": 8,
           "ffn_hidden_size": 3584, "seq_length": 1024, "vocab_size": 32000},
    parallel={"tp": 8, "sequence_parallel": True, "dp": 1},
    training={"global_batch_size": 4},
)  # fmt: skip


def _hw(host_us):
    return H100.model_copy(
        update={"compute": H100.compute.model_copy(update={"host_issue_us_per_op": host_us})}
    )


def _run(data, host_us, graph="none"):
    data = {**data, "training": {**data["training"], "cuda_graph_impl": graph}}
    return run_simulation(parse_scenario(data, "s.yaml"), _hw(host_us)).result


def test_no_host_key_prices_no_host_time():
    """Without compute.host_issue_us_per_op the GPU never waits, whatever the layer's size."""
    result = _run(SMALL, None)
    assert result.time_breakdown_s["host_wait"] == result.time_by_kind_s["host_wait"] == 0.0


def test_host_bound_wait_appears_only_when_the_host_is_slower():
    """A slow host (2 ms per op) makes every task host-bound: each op starts when the host has
    issued it, so a task lasts the host's time plus its last op, and the step grows by the
    wait; a fast host (1 ns per op) costs only the first op's issue of each task."""
    gpu_only = _run(SMALL, None)
    fast = _run(SMALL, 1e-3)
    assert fast.iteration_time_s == pytest.approx(gpu_only.iteration_time_s, rel=1e-6)
    assert 0 < fast.time_by_kind_s["host_wait"] < 1e-6
    slow = _run(SMALL, 2000.0)
    wait = slow.time_by_kind_s["host_wait"]
    assert wait > 0 and slow.time_breakdown_s["host_wait"] == pytest.approx(wait)
    assert slow.iteration_time_s > gpu_only.iteration_time_s
    # one stage, no pipeline: the step is m × (forward + backward) tasks of host time each
    scenario = parse_scenario(SMALL, "s.yaml")
    chunk = build_workload(scenario, 2).stages[0].chunks[0]
    forward, backward = chunk_kernels(chunk, Dtype.BF16, CudaGraphImpl.NONE, amax=False)
    host_step_s = scenario.num_microbatches * (forward + backward) * 2000e-6
    tasks_s = sum(slow.time_breakdown_s[k] for k in ("compute", "recompute", "tp_comm", "host_wait"))
    gpu_s = sum(gpu_only.time_breakdown_s[k] for k in ("compute", "recompute", "tp_comm"))
    assert host_step_s < tasks_s < host_step_s + gpu_s


def test_order_decides_the_wait():
    """Host 5 s and GPU 5 s in both orders: a host-heavy op first leaves the GPU idle 4 s,
    a GPU-heavy op first lets the host catch up (only the first issue, 1 s, is waited for);
    the task's totals alone (max(0, host − gpu) = 0) see neither."""
    host_heavy_first = [HostPiece(1.0, 4), HostPiece(4.0, 1)]
    gpu_heavy_first = [HostPiece(4.0, 1), HostPiece(1.0, 4)]
    assert inorder_wait_s(host_heavy_first, 1.0) == 4.0
    assert inorder_wait_s(gpu_heavy_first, 1.0) == 1.0


_PIECES = st.lists(st.tuples(st.floats(0.0, 10.0), st.integers(0, 6)), min_size=1, max_size=12)


@given(_PIECES, st.floats(0.0, 3.0))
def test_inorder_wait_is_the_longest_chain(raw, per_op):
    """Without syncs the task ends at max_i(host issue of op i + the GPU seconds from op i on),
    so the wait is at least max(0, host − gpu) of the whole task and at most the host's total."""
    pieces = [HostPiece(g, k) for g, k in raw]
    wait = inorder_wait_s(pieces, per_op)
    gpu = [g for g, _ in raw]
    issued = [sum(k for _, k in raw[: i + 1]) * per_op for i in range(len(raw))]
    chain = max(issued[i] + sum(gpu[i:]) for i in range(len(raw)))
    assert wait == pytest.approx(max(0.0, chain - sum(gpu)), abs=1e-9)
    assert max(0.0, issued[-1] - sum(gpu)) - 1e-9 <= wait <= issued[-1] + 1e-9


def test_cuda_graphs_remove_the_wait_they_capture():
    """full_iteration leaves no host time: the run equals the host-free one; per-layer graphs
    (local, transformer_engine) leave the embedding and output layer eager, so less wait."""
    gpu_only = _run(SMALL, None)
    eager = _run(SMALL, 2000.0)
    local = _run(SMALL, 2000.0, "local")
    te = _run(SMALL, 2000.0, "transformer_engine")
    full = _run(SMALL, 2000.0, "full_iteration")
    assert full.iteration_time_s == gpu_only.iteration_time_s and full.time_by_kind_s["host_wait"] == 0.0
    assert 0 < local.time_by_kind_s["host_wait"] < eager.time_by_kind_s["host_wait"]
    assert te.iteration_time_s == local.iteration_time_s


def test_kernel_counts():
    """One kernel per op; a TE fprop / dgrad FP8 GEMM issues its cast too (wgrad reuses it);
    a captured layer is one graph launch per pass, the embedding and output layer stay eager."""
    scenario = parse_scenario(SMALL, "s.yaml")
    chunk = build_workload(scenario, 2).stages[0].chunks[0]
    (segment,) = chunk.segments
    layer = segment.layer
    assert kernels_issued(layer.forward, Dtype.BF16) == len(layer.forward)
    te_fprop = [op for op in layer.forward if op.name in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")]
    assert kernels_issued(layer.forward, Dtype.FP8) == len(layer.forward) + len(te_fprop)
    extras_forward = len(chunk.embedding.forward) + len(chunk.output.forward)
    eager = chunk_kernels(chunk, Dtype.BF16, CudaGraphImpl.NONE, amax=False)
    assert eager[0] == chunk.num_layers * len(layer.forward) + extras_forward
    local = chunk_kernels(chunk, Dtype.BF16, CudaGraphImpl.LOCAL, amax=True)
    assert local[0] == chunk.num_layers + extras_forward + 1
    assert chunk_kernels(chunk, Dtype.BF16, CudaGraphImpl.FULL_ITERATION, amax=True) == (0, 0)


def test_bad_cuda_graph_value_names_the_field_and_the_choices():
    data = {**SMALL, "training": {**SMALL["training"], "cuda_graph_impl": "external"}}
    with pytest.raises(ConfigError, match="cuda_graph_impl") as error:
        parse_scenario(data, "s.yaml")
    assert "transformer_engine" in str(error.value) and "full_iteration" in str(error.value)


@pytest.mark.parametrize(("value", "message"), [(0, "greater than 0"), (-3.0, "greater than 0")])
def test_bad_host_issue_value_is_refused(value, message):
    data = read_yaml(ROOT / "hwprofiles" / "h100-sxm5-80gb.yaml")
    data["compute"]["host_issue_us_per_op"] = value
    with pytest.raises(ConfigError, match="host_issue_us_per_op"):
        parse_hardware(data, "h.yaml")


def test_a_host_issue_value_needs_a_source():
    data = read_yaml(ROOT / "hwprofiles" / "h100-sxm5-80gb.yaml")
    del data["compute"]["sources"]["host_issue_us_per_op"]
    with pytest.raises(ConfigError, match="host_issue_us_per_op"):
        parse_hardware(data, "h.yaml")
