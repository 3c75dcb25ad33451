"""Host side of the MoE layer (`costs.moe_host`, `costs.host`): the kernels Megatron-core's
router, dispatchers and TE's GroupedLinear launch per op, the dispatcher's device-to-host
sync that leaves the host without a lead, and a run that prices them."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from simcluster.config.choices import Dtype
from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import parse_scenario
from simcluster.costs.chunk import op_time_s
from simcluster.costs.host import HostPiece, inorder_wait_s, kernels_issued, op_kernels, pass_pieces
from simcluster.costs.moe_host import SyncPoint, sync_points
from simcluster.costs.stage_pricing import StagePricing, pricing_layout
from simcluster.simulation import run_simulation
from simcluster.workload.model import build_workload
from simcluster.workload.ops import CollectiveKind, Module, OpKind
from tests.paths import ROOT

H100 = load_hardware("h100-sxm5-80gb")
QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"
MOE_MODULES = {
    Module.ROUTER, Module.ROUTER_TOPK, Module.MOE_PERMUTE, Module.MOE_SORT_CHUNKS, Module.EXPERT_FC1,
    Module.EXPERT_FC2, Module.MOE_UNPERMUTE,
}  # fmt: skip


def _scenario(dispatcher="alltoall", moe=None, backend="deepep", **parallel):
    """Qwen3-30B-A3B's layer cut to 16 experts, top-2, on ep 8: two local experts a rank."""
    data = yaml.safe_load(QWEN.read_text())
    data["model"]["moe"].update(num_experts=16, router_topk=2, **(moe or {}))
    data["parallel"].update(parallel)
    data["training"]["moe_token_dispatcher"] = dispatcher
    data["training"]["moe_flex_dispatcher_backend"] = backend
    return parse_scenario(data, "s.yaml")


def _segment(scenario):
    workload = build_workload(scenario)
    return next(seg for seg in workload.stages[0].chunks[0].segments if seg.kind.moe)


def _moe_block_kernels(scenario):
    """Launches of the MoE block's ops (router to unpermute) in the forward and backward."""
    segment = _segment(scenario)
    out = []
    for ops in (segment.layer.forward, segment.layer.backward):
        counts = op_kernels(ops, scenario.training.dtype, segment.kind.moe)
        experts = (Module.EXPERT_FC1, Module.EXPERT_FC2)
        swiglu_after_experts = {
            i for i, op in enumerate(ops) if op.module is Module.SWIGLU and i and ops[i - 1].module in experts
        }
        out.append(
            sum(
                n
                for i, (op, n) in enumerate(zip(ops, counts))
                if op.module in MOE_MODULES or i in swiglu_after_experts
            )
        )
    return tuple(out)


def test_alltoall_kernels_follow_megatron_code():
    """alltoall, 2 local experts, BF16, Megatron's defaults (no permute / router fusion, no
    aux loss), read from Megatron-LM @d98e8a64 moe/ and TE @d0067d0 GroupedLinear."""
    forward = (
        1  # router.py RouterGatingLinearFunction: te_general_gemm
        + 3  # topk_routing_with_score_function: topk, softmax, type_as
        + 6  # ... routing probs (zeros_like, scatter) and map (zeros_like, int, scatter, bool)
        + 8  # preprocess: sum, long, input_splits sum, all-gather, slice contiguous, 3 sums
        + 6  # permute: T.contiguous, argsort, %, probs T.contiguous, probs index, index_select
        + 5  # _maybe_dtoh_and_synchronize: 5 D2H copies (per-local-expert counts with 2 experts)
        + 2  # token_dispatch: all_to_all of tokens and of probs
        + 2  # dispatch_postprocess: sort_chunks_by_idxs cats tokens and probs
        + 2 + 4 + 2  # GroupedLinear fc1 (a cuBLAS GEMM per local expert), weighted GLU, fc2
        + 1 + 1 + 2  # combine_preprocess sort back; combine all_to_all; unpermute zeros + scatter_add_
    )  # fmt: skip
    backward = (
        1 + 1 + 1  # scatter_add_'s gather; all_to_all; sort back's cat
        + 2 + 2 + 7 + 2 + 2  # fc2 dgrad, wgrad per expert; GLU backward; fc1 dgrad, wgrad
        + 2 + 2  # sort's cats (tokens, probs); all_to_alls
        + 5 + 5  # permute's backward; top-k's backward
        + 1 + 2  # router dgrad; wgrad and DDP's main_grad add
    )  # fmt: skip
    assert _moe_block_kernels(_scenario()) == (forward, backward) == (45, 35)


def test_allgather_and_flex_kernels():
    """allgather: three all-gathers, the local map's bookkeeping with its .cpu() copy, a
    permute without probs, masked_select, unpermute, reduce-scatter; flex: DeepEP's layout,
    notify and dispatch, the multihot conversion, permute with probs, unpermute, combine."""
    gather_forward = 1 + 9 + 3 + (5 + 4 + 3) + 2 + 4 + 2 + 2 + 1
    gather_backward = 1 + 1 + 2 + 2 + 7 + 2 + 2 + 5 + 2 + 5 + 1 + 2
    assert _moe_block_kernels(_scenario("allgather")) == (gather_forward, gather_backward)
    flex_forward = 1 + (9 + 2) + 3 + (11 + 6) + 2 + 4 + 2 + 2 + 1
    flex_backward = 2 + 1 + 2 + 2 + 7 + 2 + 2 + (2 + 5) + 2 + (5 + 3) + 1 + 2
    assert _moe_block_kernels(_scenario("flex")) == (flex_forward, flex_backward)


def test_hybridep_kernels():
    """hybridep: no top-k conversion after the router; probs .float() and the routing map's
    all-gather; scan, pad and dispatch; Hybrid-EP's permute (one kernel); unpermute and combine
    one each. Backward: a cached dispatch, unpermute, permute, combine after the cast's backward."""
    forward = 1 + 9 + (1 + 1) + 3 + 1 + 2 + 4 + 2 + 1 + 1
    backward = 1 + 1 + 2 + 2 + 7 + 2 + 2 + 1 + (1 + 1) + 5 + 1 + 2
    assert _moe_block_kernels(_scenario("flex", backend="hybridep")) == (forward, backward)
    deepep = _moe_block_kernels(_scenario("flex"))
    # DeepEP's path adds topk + .float(), Megatron's multihot + permute, the unscatter; less the gather
    assert (deepep[0] - forward, deepep[1] - backward) == (2 + (17 - 1) + (2 - 1) - 2, 1 + 6 + 3)


def test_local_experts_set_the_grouped_gemm_launches():
    """TE's GroupedLinear issues one GEMM per local expert: 16 experts on ep 2 (8 local)
    add 6 launches to each of fc1 and fc2 over ep 8 (2 local) in the forward, 24 in the
    backward (dgrad and wgrad of both)."""
    small, large = _moe_block_kernels(_scenario(ep=8)), _moe_block_kernels(_scenario(ep=2))
    assert (large[0] - small[0], large[1] - small[1]) == (12, 24)


def test_dense_ops_keep_one_kernel_each():
    """The attention block's ops of a MoE layer are counted as a dense layer's: one each."""
    segment = _segment(_scenario())
    ops = segment.layer.forward
    counts = op_kernels(ops, Dtype.BF16, segment.kind.moe)
    dense = [n for op, n in zip(ops, counts) if op.module in (Module.QKV, Module.FLASH, Module.PROJ)]
    assert dense == [1, 1, 1]
    assert kernels_issued(ops, Dtype.BF16) == len(ops)  # without the spec: one per op, as before


def test_alltoall_syncs_before_the_dispatch_all_to_all():
    """The counts are copied at before_permutation_1 (the GPU's work before the permute) and
    the host blocks at before_ep_alltoall (after issuing the permute); no sync backward."""
    segment = _segment(_scenario())
    ops = segment.layer.forward
    (point,) = sync_points(ops, segment.kind.moe)
    assert (
        ops[point.gpu_index].module is Module.MOE_PERMUTE and ops[point.gpu_index].kind is OpKind.ELEMENTWISE
    )
    assert ops[point.host_index].collective is CollectiveKind.ALL_TO_ALL
    assert point.host_index == point.gpu_index + 1
    assert sync_points(segment.layer.backward, segment.kind.moe) == ()


def test_sync_points_per_dispatcher_and_capacity():
    """allgather syncs once before its permute, flex twice (DeepEP's counts, then the
    multihot's mask index after the dispatch kernel); padding to capacity never syncs."""
    gather = _segment(_scenario("allgather"))
    (point,) = sync_points(gather.layer.forward, gather.kind.moe)
    assert point.gpu_index == point.host_index
    assert gather.layer.forward[point.gpu_index].module is Module.MOE_PERMUTE
    flex = _segment(_scenario("flex"))
    first, second = sync_points(flex.layer.forward, flex.kind.moe)
    assert flex.layer.forward[first.gpu_index].deepep is not None
    assert second.gpu_index == first.gpu_index + 1
    hybrid = _segment(_scenario("flex", backend="hybridep"))
    (point,) = sync_points(hybrid.layer.forward, hybrid.kind.moe)  # after the scan, before dispatch
    assert point.gpu_index == point.host_index
    assert hybrid.layer.forward[point.gpu_index].deepep is not None
    assert hybrid.layer.forward[point.gpu_index - 1].collective is CollectiveKind.ALL_GATHER
    dropping = _segment(_scenario(moe={"capacity_factor": 1.0}))
    (point,) = sync_points(dropping.layer.forward, dropping.kind.moe)  # before_permutation_1
    assert point.gpu_index == point.host_index
    spec = dropping.kind.moe
    padded = replace(spec, moe=replace(spec.moe, pad_to_capacity=True))  # drop_and_pad: no DtoH
    assert sync_points(dropping.layer.forward, padded) == ()


def test_sync_wait_by_hand():
    """(gpu 3, host 1, sync) then (gpu 1, host 4): the first op waits 1 s for its issue, the
    host resumes when the GPU reaches the copy at 4 s and issues the next op at 8 s: wait
    1 + 4 = 5. Without the sync the host would have issued it at 5 s (wait 1 + 1)."""
    per_op = 1.0
    assert inorder_wait_s([HostPiece(3.0, 1, sync_after=True), HostPiece(1.0, 4)], per_op) == 5.0
    assert inorder_wait_s([HostPiece(3.0, 1), HostPiece(1.0, 4)], per_op) == 2.0


def test_copy_recorded_before_the_sync_releases_the_host_earlier():
    """The host blocks after the second op on a copy recorded after the first (copy_lag 1):
    it resumes at 3 s, not 8 s, and the third op starts as the second ends (wait 1, the first
    op's issue); waiting on the second op's end instead costs one more second."""
    per_op = 1.0
    early = [HostPiece(2.0, 1), HostPiece(5.0, 1, sync_after=True, copy_lag=1), HostPiece(1.0, 1)]
    late = [HostPiece(2.0, 1), HostPiece(5.0, 1, sync_after=True), HostPiece(1.0, 1)]
    assert inorder_wait_s(early, per_op) == 1.0
    assert inorder_wait_s(late, per_op) == 2.0


def _hw(host_us):
    compute = H100.compute.model_copy(update={"host_issue_us_per_op": host_us})
    return H100.model_copy(update={"compute": compute})


@pytest.mark.parametrize("host_us", [0.0, 10.0, 42.3, 200.0])
def test_a_task_with_syncs_is_never_faster_than_without(host_us):
    """Each chunk's busy seconds with the syncs ≥ max(GPU, host) over the whole task (the
    in-order wait is never below the aggregate one)."""
    scenario = _scenario(pp=1)
    hw = _hw(host_us)
    pricing = StagePricing(hw)
    layout = pricing_layout(scenario, hw)
    # the H100 profile's MoE host weights (moe_host_us_per_op over host_issue_us_per_op) are not
    # integers, so the segments' and the whole task's host seconds are summed in different
    # orders: equal up to rounding (1e-12 relative)
    slack = 1 - 1e-12
    for chunk in build_workload(scenario).stages[0].chunks:
        priced = pricing.chunk(chunk, layout)
        assert priced.forward_wait_s is not None
        assert priced.forward_busy_s >= max(priced.cost.forward_s, priced.host_forward_s) * slack
        assert priced.backward_busy_s >= max(priced.cost.backward_s, priced.host_backward_s) * slack


def test_host_cost_zero_gives_the_gpu_only_result():
    """A profile that prices the host at 0 µs per kernel gives the run without host pricing, ==
    (but for the share of the host's issue time, 0 there and not priced here)."""
    scenario = _scenario()
    free, unpriced = run_simulation(scenario, _hw(0.0)).result, run_simulation(scenario, _hw(None)).result
    assert free.host_issue_share == 0.0 and unpriced.host_issue_share is None
    assert replace(free, host_issue_share=None) == unpriced


def test_a_slow_host_waits_after_each_sync():
    """At 200 µs a kernel the forward's wait equals the segment sum computed by hand from
    the layer's pieces (sync cuts between layers' pre- and post-dispatch parts)."""
    scenario = _scenario(pp=1)
    hw = _hw(200.0)
    pricing = StagePricing(hw)
    layout = pricing_layout(scenario, hw)
    chunk = build_workload(scenario).stages[0].chunks[0]
    priced = pricing.chunk(chunk, layout)
    assert priced.forward_host_wait_s > max(0.0, priced.host_forward_s - priced.cost.forward_s)
    result = run_simulation(scenario, hw).result
    assert result.time_by_kind_s["host_wait"] > 0


def test_point_fields():
    """A SyncPoint's copy point is never after its wait point."""
    segment = _segment(_scenario())
    for point in sync_points(segment.layer.forward, segment.kind.moe):
        assert isinstance(point, SyncPoint) and point.gpu_index <= point.host_index


def _graph_kernels(scenario, pass_name="forward"):
    from simcluster.costs.host import layer_op_kernels

    segment = _segment(scenario)
    tr = scenario.training
    ops = getattr(segment.layer, pass_name)
    return ops, layer_op_kernels(ops, tr.dtype, segment.kind.moe, tr.cuda_graph_impl, tr.cuda_graph_scope)


def _with_graph(scope, dispatcher="alltoall", impl="transformer_engine"):
    data = yaml.safe_load(QWEN.read_text())
    data["model"]["moe"].update(num_experts=16, router_topk=2)
    data["training"].update(moe_token_dispatcher=dispatcher, cuda_graph_impl=impl, cuda_graph_scope=scope)
    return parse_scenario(data, "s.yaml")


def test_router_scope_captures_attention_router_and_nothing_after():
    """[attn, moe_router]: one graph launch for the attention, the pre-MLP norm and the router
    (forward and backward); the dispatcher and experts stay eager, kernel for kernel."""
    eager = _scenario()
    graphed = _with_graph(["attn", "moe_router"])
    for name in ("forward", "backward"):
        ops, counts = _graph_kernels(graphed, name)
        _, eager_counts = _graph_kernels(eager, name)
        topk = next(i for i, op in enumerate(ops) if op.module is Module.ROUTER_TOPK)
        mlp_block = {Module.MOE_PERMUTE, Module.EXPERT_FC1, Module.EXPERT_FC2, Module.MOE_UNPERMUTE}
        for i, op in enumerate(ops):
            if op.module in mlp_block:
                assert counts[i] == eager_counts[i] > 0, op.name
        assert sum(1 for n, e in zip(counts, eager_counts) if n != e) >= 3
        assert sum(counts) < sum(eager_counts)
        assert counts[topk] == 0 or counts[topk] == 1  # captured (1: the graph's launch)
    ops, counts = _graph_kernels(graphed)
    assert (
        counts[0] == 1
        and sum(counts[: next(i for i, op in enumerate(ops) if op.module is Module.ROUTER_TOPK) + 1]) == 1
    )


def test_preprocess_scope_captures_the_permute_and_moves_the_copy():
    """moe_preprocess adds the counts' all-gather and the permute to the graph; the counts are
    then copied at the dispatch all-to-all (cuda_dtoh_point before_ep_alltoall)."""
    from simcluster.costs.host import layer_sync_points

    router = _with_graph(["attn", "moe_router"])
    preprocess = _with_graph(["attn", "moe_router", "moe_preprocess"])
    ops, with_pre = _graph_kernels(preprocess)
    _, without = _graph_kernels(router)
    permute = next(
        i for i, op in enumerate(ops) if op.module is Module.MOE_PERMUTE and op.kind is OpKind.ELEMENTWISE
    )
    assert with_pre[permute] == 0 < without[permute]
    segment = _segment(preprocess)
    tr = preprocess.training
    (point,) = layer_sync_points(ops, segment.kind.moe, tr.cuda_graph_impl, tr.cuda_graph_scope)
    assert (
        point.gpu_index == point.host_index and ops[point.gpu_index].collective is CollectiveKind.ALL_TO_ALL
    )


def test_whole_layer_scope_on_a_dropless_moe_layer_is_attention_and_router():
    """Megatron-core cannot capture a dropless MoE layer whole (its dispatcher syncs): the
    empty scope prices it as [attn, moe_router]; a dense model keeps one launch a pass."""
    assert _graph_kernels(_with_graph([]))[1] == _graph_kernels(_with_graph(["attn", "moe_router"]))[1]


@pytest.mark.parametrize(
    ("scope", "message"),
    [
        (["moe"], "drop-and-pad"),
        (["moe_preprocess"], "moe_preprocess needs moe_router"),
        (["moe", "moe_router"], "not both"),
        (["mlp"], "mlp needs dense layers"),
    ],
)
def test_megatron_scope_rules_are_errors(scope, message):
    with pytest.raises(Exception, match=message):
        _with_graph(scope)


def test_graphs_never_add_host_time_and_full_iteration_removes_it():
    """Each scope's host seconds ≤ eager's, ≥ 0; full_iteration leaves none."""
    hw = _hw(42.3)
    eager = _scenario()
    chunk = build_workload(eager).stages[0].chunks[0]
    layout = pricing_layout(eager, hw)
    base = StagePricing(hw).chunk(chunk, layout)
    for scope in ([], ["attn"], ["attn", "moe_router"], ["attn", "moe_router", "moe_preprocess"]):
        graphed = _with_graph(scope)
        priced = StagePricing(hw).chunk(
            build_workload(graphed).stages[0].chunks[0], pricing_layout(graphed, hw)
        )
        assert 0 < priced.host_forward_s < base.host_forward_s
        assert 0 < priced.host_backward_s < base.host_backward_s
    full = _with_graph([], impl="full_iteration")
    priced = StagePricing(hw).chunk(build_workload(full).stages[0].chunks[0], pricing_layout(full, hw))
    assert (priced.host_forward_s, priced.host_backward_s) == (0.0, 0.0)


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather", "flex"])
def test_a_host_bound_task_is_its_host_seconds_and_a_tail(dispatcher):
    """With every op host-bound (10 ms a kernel) each op starts when the host has issued it:
    the task outlasts its host seconds by the GPU work left after the last issue before each
    sync and at the end, never by more than its GPU seconds."""
    scenario = _scenario(dispatcher, pp=1)
    hw = _hw(10_000.0)
    pricing = StagePricing(hw)
    chunk = build_workload(scenario).stages[0].chunks[0]
    priced = pricing.chunk(chunk, pricing_layout(scenario, hw))
    assert priced.forward_wait_s is not None
    assert priced.host_forward_s < priced.forward_busy_s <= priced.host_forward_s + priced.cost.forward_s
    assert priced.host_backward_s < priced.backward_busy_s <= priced.host_backward_s + priced.cost.backward_s


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather", "flex"])
def test_pass_pieces_keep_the_kernels_and_the_price(dispatcher):
    """One piece per op: the kernels are the op's, the GPU seconds sum to the pass's price and,
    up to each copy point, to the price of the ops before it; the host blocks after the op
    before its sync, on the op where the copy was recorded."""
    scenario = _scenario(dispatcher, pp=1)
    segment = _segment(scenario)
    ops, spec = segment.layer.forward, segment.kind.moe
    layout = pricing_layout(scenario, H100)
    cost = StagePricing(H100).segment(segment, layout)

    def price(part):
        recipe = segment.layer.fp8_recipe
        return sum(op_time_s(op, H100, layout.tp, layout.dtype, recipe, layout.experts) for op in part)

    kernels = op_kernels(ops, layout.dtype, spec)
    points = sync_points(ops, spec)
    own = tuple(price((op,)) for op in ops)
    pieces = pass_pieces(ops, cost.forward.total_s, price, kernels, points, own)
    assert tuple(piece.kernels for piece in pieces) == kernels
    assert sum(piece.gpu_s for piece in pieces) == pytest.approx(cost.forward.total_s, rel=1e-12)
    for point in points:
        assert sum(p.gpu_s for p in pieces[: point.gpu_index]) == pytest.approx(price(ops[: point.gpu_index]))
        marked = pieces[point.host_index - 1]
        assert marked.sync_after and marked.copy_lag == point.host_index - point.gpu_index
    assert sum(piece.sync_after for piece in pieces) == len(points)


# --- the MoE block's measured host costs (compute.moe_host_us_per_op,
# expert_gemm_host_us_per_launch; docs/moe_host.md "The torch MoE block measured") ---


def test_weighted_launches_by_hand():
    """Weights (2, 0.5): every MoE-block launch counts 2, every expert GEMM launch 0.5, an FP8
    expert GEMM's input cast 2 (one GroupedLinear call), attention and norms 1."""
    from simcluster.costs.moe_host import is_expert_gemm, moe_op_kernels, weighted_moe_kernels

    scenario = _scenario()
    segment, spec = _segment(scenario), _segment(scenario).kind.moe
    for quantized in (False, True):
        dtype = Dtype.FP8 if quantized else Dtype.BF16
        for ops in (segment.layer.forward, segment.layer.backward):
            counts = op_kernels(ops, dtype, spec)
            weighted = weighted_moe_kernels(ops, counts, spec, quantized, (2.0, 0.5))
            for op, n, moe_n, w in zip(ops, counts, moe_op_kernels(ops, spec, quantized), weighted):
                if moe_n is None:
                    assert w == n
                elif is_expert_gemm(op):
                    assert op.gemm is not None and w == op.gemm.batch * 0.5 + (n - op.gemm.batch) * 2
                else:
                    assert w == 2 * n
            assert weighted_moe_kernels(ops, counts, spec, quantized, (1.0, 1.0)) == counts


def test_profile_weights_default_to_one_and_scale_the_host_seconds():
    """No MoE keys (or no host pricing): weights (1, 1), the plain counts; the H100 profile's
    56.3 / 28.6 µs over its 42.3: a chunk's host seconds are its dense launches × 42.3 µs plus
    its MoE launches at the measured costs."""
    from simcluster.costs.host import chunk_host_s, layer_op_kernels
    from simcluster.costs.moe_host import is_expert_gemm, moe_op_kernels

    plain = H100.compute.model_copy(
        update={"moe_host_us_per_op": None, "expert_gemm_host_us_per_launch": None}
    )
    assert plain.moe_host_weights() == (1.0, 1.0)
    assert H100.compute.model_copy(update={"host_issue_us_per_op": None}).moe_host_weights() == (1.0, 1.0)
    other, expert = H100.compute.moe_host_weights()
    assert other == pytest.approx(56.3 / 42.3) and expert == pytest.approx(28.6 / 42.3)
    scenario = _scenario(pp=1)
    chunk = build_workload(scenario).stages[0].chunks[0]
    tr = scenario.training
    segment = _segment(scenario)
    ops, spec = segment.layer.forward, segment.kind.moe
    assert layer_op_kernels(ops, tr.dtype, spec, tr.cuda_graph_impl) == op_kernels(ops, tr.dtype, spec)
    measured = chunk_host_s(chunk, H100, tr.dtype, tr.cuda_graph_impl, False)
    declared = chunk_host_s(
        chunk, H100.model_copy(update={"compute": plain}), tr.dtype, tr.cuda_graph_impl, False
    )
    moved = 0.0  # the forward's MoE launches: (56.3 − 42.3) µs each, expert GEMM launches (28.6 − 42.3)
    for seg in chunk.segments:
        if seg.kind.moe is None:
            continue
        f_ops = seg.layer.forward
        for op, n, moe_n in zip(
            f_ops, op_kernels(f_ops, tr.dtype, seg.kind.moe), moe_op_kernels(f_ops, seg.kind.moe, False)
        ):
            if moe_n is not None:
                expert_n = op.gemm.batch if is_expert_gemm(op) and op.gemm else 0
                moved += seg.num_layers * (expert_n * (28.6 - 42.3) + (n - expert_n) * (56.3 - 42.3)) * 1e-6
    assert moved > 0 and measured[0] - declared[0] == pytest.approx(moved)
