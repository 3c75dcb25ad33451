"""`run`'s time split by kind (`costs.breakdown`): the step's parts sum to the iteration, the
layer's to its price, and each kind appears where its work is."""

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simcluster.config import ConfigError, load_hardware, parse_scenario
from simcluster.costs.op_kind import OpKind, op_kind
from simcluster.simulation import run_simulation
from simcluster.workload.ops import (
    CollectiveKind,
    GemmShape,
    GradOf,
    Module,
    Pass,
    collective,
    elementwise,
    gemm,
)
from tests.modern_cases import llama3_8b

H100 = load_hardware("h100-sxm5-80gb")


def _result(data, hw=H100):
    return run_simulation(parse_scenario(data, "s.yaml"), hw).result


@st.composite
def modern_scenarios(draw):
    """Small Llama-like layouts over every feature the split names (FP8, CP, TP overlap, PP)."""
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2]))
    fp8 = draw(st.booleans())
    sp = tp > 1 and draw(st.booleans())
    data = llama3_8b(
        model={"num_layers": 8, "hidden_size": 1024, "num_attention_heads": 16, "num_query_groups": 8,
               "ffn_hidden_size": 3584, "seq_length": 2048, "vocab_size": 32000},
        parallel={"tp": tp, "pp": pp, "cp": cp, "dp": dp, "sequence_parallel": sp,
                  "vpp": draw(st.sampled_from([1, 2])) if pp > 1 else 1},
        training={
            "micro_batch_size": 1, "global_batch_size": dp * draw(st.sampled_from([1, 4, 8])),
            "recompute": draw(st.sampled_from(["none", "selective", "full"])),
            "dtype": "fp8" if fp8 else "bf16", "tp_comm_overlap": sp and draw(st.booleans()),
            "use_distributed_optimizer": draw(st.booleans()), "overlap_grad_reduce": draw(st.booleans()),
            "cuda_graph_impl": draw(st.sampled_from(["none", "local", "full_iteration"])),
        },
    )  # fmt: skip
    try:
        return parse_scenario(data, "random")
    except ConfigError:
        return None


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(modern_scenarios(), st.sampled_from([None, 42.3, 2000.0]))
def test_the_step_split_sums_to_the_iteration_and_the_layer_split_to_its_price(scenario, host_us):
    """Σ time_by_kind_s = iteration time; Σ layer_time_by_kind_s = the layer's forward + backward;
    no part is negative; the task kinds add up to the engine's compute + recompute + TP comm +
    host wait; PP / DP / optimizer / idle are the engine's own."""
    assume(scenario is not None)
    hw = H100.model_copy(
        update={"compute": H100.compute.model_copy(update={"host_issue_us_per_op": host_us})}
    )
    result = run_simulation(scenario, hw).result
    split, old = result.time_by_kind_s, result.time_breakdown_s
    assert sum(split.values()) == pytest.approx(result.iteration_time_s, rel=1e-9)
    assert all(v >= -1e-9 * result.iteration_time_s for v in split.values())
    layer = result.layer_time_by_kind_s
    assert sum(layer.values()) == pytest.approx(result.layer.combined_s, rel=1e-9)
    assert all(v >= -1e-12 for v in layer.values())
    task_kinds = (
        "gemm", "attention", "memory_bound", "fp8_cast", "tp_comm", "ep_comm", "cp_comm",
        "embedding_and_loss",
    )  # fmt: skip
    engine_tasks = old["compute"] + old["recompute"] + old["tp_comm"] + old["ep_comm"] + old["host_wait"]
    assert sum(split[k] for k in task_kinds) + split["host_wait"] == pytest.approx(engine_tasks, rel=1e-9)
    for kind in ("pp_comm", "dp_comm", "optimizer"):
        assert split[kind] == pytest.approx(old[kind], rel=1e-12, abs=1e-15)
    assert split["pipeline_idle"] == pytest.approx(old["idle"], rel=1e-9, abs=1e-12)


def test_every_kind_is_reported_in_order():
    """The split names every kind, in the report order, for any run."""
    result = _result(llama3_8b())
    assert list(result.time_by_kind_s) == [
        "gemm", "attention", "memory_bound", "fp8_cast", "tp_comm", "ep_comm", "cp_comm", "pp_comm",
        "dp_comm", "optimizer", "embedding_and_loss", "host_wait", "pipeline_idle",
    ]  # fmt: skip
    layer_kinds = ["gemm", "attention", "memory_bound", "fp8_cast", "tp_comm", "ep_comm", "cp_comm"]
    assert list(result.layer_time_by_kind_s) == layer_kinds


def test_fp8_casts_cp_and_tp_comm_appear_only_where_their_work_is():
    """bf16 at tp 1, cp 1 has no FP8 cast, TP or CP comm; FP8 has casts; TP has TP comm; CP has CP comm."""
    plain = _result(llama3_8b()).layer_time_by_kind_s
    assert plain["fp8_cast"] == plain["tp_comm"] == plain["cp_comm"] == 0.0
    assert plain["gemm"] > plain["attention"] > plain["memory_bound"] > 0
    fp8 = _result(llama3_8b(training={"dtype": "fp8"})).layer_time_by_kind_s
    assert fp8["fp8_cast"] > 0 and fp8["gemm"] < plain["gemm"]  # FP8 GEMMs, cast split off
    tp = _result(llama3_8b(parallel={"tp": 8, "sequence_parallel": True, "dp": 1})).layer_time_by_kind_s
    assert tp["tp_comm"] > 0 and tp["cp_comm"] == 0.0
    cp = _result(llama3_8b(parallel={"cp": 2, "dp": 4})).layer_time_by_kind_s
    assert cp["cp_comm"] > 0 and cp["tp_comm"] == 0.0


def test_the_unfused_attention_core_is_attention_and_the_projections_are_gemms():
    """op_kind: the paper's QKᵀ / ×V batched GEMMs and softmax are attention; the QKV and output
    projections are GEMMs; collectives are communication; current scaling's amax kernels FP8."""
    shape = GemmShape(m=8, n=8, k=8)
    f, b = Pass.FORWARD, Pass.INPUT_GRAD
    assert op_kind(gemm("attn.qkv", shape, module=Module.QKV, pass_=f)) is OpKind.GEMM
    dgrad_q = gemm("attn.qk.dgrad_q", shape, module=Module.QK, pass_=b, grad_of=GradOf.Q)
    assert op_kind(dgrad_q) is OpKind.ATTENTION
    assert op_kind(elementwise("attn.softmax.bwd", 1.0, module=Module.SOFTMAX, pass_=b)) is OpKind.ATTENTION
    assert op_kind(elementwise("ln1", 1.0, module=Module.LAYERNORM, pass_=f)) is OpKind.MEMORY_BOUND
    assert op_kind(elementwise("mlp.fc1.amax", 1.0, module=Module.FP8_AMAX, pass_=f)) is OpKind.FP8_CAST
    gather = collective("attn.allgather", CollectiveKind.ALL_GATHER, 1.0, module=Module.QKV, pass_=f)
    assert op_kind(gather) is OpKind.COMMUNICATION
