"""Host side of the fused MoE router and permutation (`training.moe_router_fusion`,
`training.moe_permute_fusion`; `costs.moe_host`): the launches TE's fused kernels take in place
of the unfused ones, and the sync the fused chunk sort no longer needs."""

from __future__ import annotations

from dataclasses import replace

import yaml

from simcluster.config.scenario import parse_scenario
from simcluster.costs.host import op_kernels
from simcluster.costs.moe_host import sync_points
from simcluster.workload.ops import Module, OpKind
from tests.costs.test_costs_moe_host import QWEN, _moe_block_kernels, _segment


def _scenario(router=False, permute=False, dispatcher="alltoall", backend="deepep", **parallel):
    """The host tests' layer (16 experts, top-2, ep 8: two local experts a rank) with the keys."""
    data = yaml.safe_load(QWEN.read_text())
    data["model"]["moe"].update(num_experts=16, router_topk=2)
    data["parallel"].update(parallel)
    data["training"].update(
        moe_token_dispatcher=dispatcher,
        moe_flex_dispatcher_backend=backend,
        moe_router_fusion=router,
        moe_permute_fusion=permute,
    )
    return parse_scenario(data, "s.yaml")


def _kernels_of(scenario, module, **spec_fields):
    """Launches of each non-collective op of `module`, forward and backward, in order;
    `spec_fields` replace fields of the layer's `MoEConfig` (router and padding options the
    scenario has no key for) in the spec the counts read."""
    segment = _segment(scenario)
    spec = segment.kind.moe
    if spec_fields:
        spec = replace(spec, moe=replace(spec.moe, **spec_fields))
    out = []
    for ops in (segment.layer.forward, segment.layer.backward):
        counts = op_kernels(ops, scenario.training.dtype, spec)
        out.append(
            [n for op, n in zip(ops, counts) if op.module is module and op.kind is not OpKind.COLLECTIVE]
        )
    return tuple(out)


def test_router_fusion_is_one_kernel_each_way():
    """softmax top-k: 3 + 6 launches forward and 5 backward unfused; TE's
    `fused_topk_with_score_function_fwd` / `_bwd`: one each (45, 35 -> 37, 31)."""
    assert _kernels_of(_scenario(), Module.ROUTER_TOPK) == ([9], [5])
    assert _kernels_of(_scenario(router=True), Module.ROUTER_TOPK) == ([1], [1])
    assert _moe_block_kernels(_scenario(router=True)) == (45 - 8, 35 - 4)


def test_router_fusion_with_sigmoid_groups_and_expert_bias():
    """DeepSeek-V3's router: sigmoid, group-limited top-k and the expert bias run inside the
    fused kernel; the bias update (`_apply_expert_bias`: sum, +=) stays two launches."""
    moe = {
        "router_score": "sigmoid",
        "router_num_groups": 4,
        "router_group_topk": 2,
        "router_expert_bias": True,
    }
    unfused = _kernels_of(_scenario(), Module.ROUTER_TOPK, **moe)
    assert unfused == ([7 + 6 + 2 + 2 + 5], [9])
    assert _kernels_of(_scenario(router=True), Module.ROUTER_TOPK, **moe) == ([1 + 2], [1])


def test_permute_fusion_kernels_alltoall():
    """Fused permute: make_row_id_map's three passes and the permute kernel (4 for 6), the
    D2H copies without the per-local-expert one (4 for 5); backward one kernel (for 5). Each
    chunk sort: map + sort forward (2, for the dispatch side's 2 cats and the combine side's
    1), one kernel backward; unpermute one kernel each way (for zeros + scatter_add_, gather)."""
    permute, sort, unpermute = Module.MOE_PERMUTE, Module.MOE_SORT_CHUNKS, Module.MOE_UNPERMUTE
    assert _kernels_of(_scenario(), permute) == ([6 + 5], [5])
    assert _kernels_of(_scenario(permute=True), permute) == ([4 + 4], [1])
    assert _kernels_of(_scenario(), sort) == ([2, 1], [1, 2])
    assert _kernels_of(_scenario(permute=True), sort) == ([2, 2], [1, 1])
    assert _kernels_of(_scenario(), unpermute) == ([2], [1])
    assert _kernels_of(_scenario(permute=True), unpermute) == ([1], [1])
    assert _moe_block_kernels(_scenario(permute=True)) == (45 - 3 + 1 - 1, 35 - 4 - 1)


def test_padded_chunks_move_by_view_fused_or_not():
    """Padded to capacity the dispatcher moves chunks by transpose + contiguous (tokens and
    probs), not `sort_chunks_by_idxs`: the same launches with and without permute fusion."""
    sort = Module.MOE_SORT_CHUNKS
    padded = _kernels_of(_scenario(permute=True), sort, capacity_factor=1.0, pad_to_capacity=True)
    assert padded == _kernels_of(_scenario(), sort, capacity_factor=1.0, pad_to_capacity=True)
    assert padded == ([2, 1], [1, 2])


def test_fused_chunk_sort_moves_the_single_rank_sync_to_before_finish():
    """ep·etp = 1 with several local experts: unfused the host blocks at "before_permutation_2"
    (the chunk sort needs the split sizes on the host); fused, the sort reads them on the GPU,
    so the host blocks at "before_finish", before the experts' GEMMs (token_dispatcher.py
    `preprocess`, Megatron-LM @d7288711)."""
    unfused, fused = _segment(_scenario(ep=1)), _segment(_scenario(permute=True, ep=1))
    (point,) = sync_points(unfused.layer.forward, unfused.kind.moe)
    assert unfused.layer.forward[point.host_index].module is Module.MOE_SORT_CHUNKS
    (point,) = sync_points(fused.layer.forward, fused.kind.moe)
    assert fused.layer.forward[point.host_index].module is Module.EXPERT_FC1
    assert fused.layer.forward[point.gpu_index].module is Module.MOE_PERMUTE


def test_hybridep_ignores_permute_fusion():
    """`_HybridEPManager` stores the flag and never reads it: the same launches."""
    plain = _moe_block_kernels(_scenario(dispatcher="flex", backend="hybridep"))
    assert _moe_block_kernels(_scenario(permute=True, dispatcher="flex", backend="hybridep")) == plain
