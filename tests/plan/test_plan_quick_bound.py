"""The quick bound (`plan.layer_bound`) never exceeds the full bound, its layer kinds are the
workload's, its dp-free prices equal the real ones, and the lazy order (`plan.order`)
visits layouts exactly as sorting by the full bound does: same answer, same counts."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcluster import memory_plan
from simcluster.config.errors import ConfigError
from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import Scenario, parse_scenario
from simcluster.costs.stage_pricing import StagePricing, pricing_layout
from simcluster.headroom import memory_limit_bytes
from simcluster.plan import plan_layouts, search
from simcluster.plan.bound import bound_inputs, lower_bound_s
from simcluster.plan.layer_bound import QuickBound, dp_free_key, layer_kinds
from simcluster.plan.memory_floor import peak_floor_bytes
from simcluster.plan.order import BoundOrder
from simcluster.plan.search import Candidate
from simcluster.workload.model import build_workload, kind_ops
from tests.plan.plan_world import TINY, a100, tiny_moe_scenario, tiny_scenario

H100 = load_hardware("h100-sxm5-80gb")
MLA = {"q_lora_rank": 64, "kv_lora_rank": 32, "qk_head_dim": 32, "qk_pos_emb_head_dim": 16, "v_head_dim": 32}


@st.composite
def layouts(draw) -> Scenario | None:
    """Small layouts of an 8-layer model, dense or MoE (dense first layers, ep, etp,
    dispatchers), with MLA, MTP and sliding windows, on every split the loader accepts."""
    moe = draw(st.booleans())
    tp = draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([1, 1, 2]))
    pp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 4]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    micro = draw(st.sampled_from([1, 2]))
    model = {**TINY["model"], "num_layers": 8, "activation": "swiglu"}
    if moe:
        model["moe"] = {
            "num_experts": 8, "router_topk": 2, "ffn_hidden_size": 256,
            "first_k_dense_layers": draw(st.sampled_from([0, 1, 3])),
        }  # fmt: skip
    if draw(st.booleans()):
        model["mla"] = MLA
    if draw(st.booleans()):
        model.update(window_size=64, window_attn_skip_freq=draw(st.sampled_from([None, 2])))
    model["mtp_num_layers"] = draw(st.sampled_from([0, 1])) if pp > 1 or vpp == 1 else 0
    ep = draw(st.sampled_from([1, 2, 4])) if moe else 1
    parallel = {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "vpp": vpp, "ep": ep,
                "sequence_parallel": tp > 1 and draw(st.booleans())}  # fmt: skip
    if moe:
        parallel["etp"] = draw(st.sampled_from([1, tp]))
    data = {
        **TINY,
        "hardware": H100.name,
        "model": model,
        "parallel": parallel,
        "training": {
            "micro_batch_size": micro,
            "global_batch_size": micro * dp * draw(st.sampled_from([1, 2, 4, 8])),
            "recompute": draw(st.sampled_from(["none", "selective", "full"])),
            "use_distributed_optimizer": draw(st.booleans()),
            "overlap_grad_reduce": draw(st.booleans()),
            "attention_backend": "flash",
            "moe_token_dispatcher": draw(st.sampled_from(["alltoall", "allgather"])),
        },
    }
    try:
        return parse_scenario(data, "layout")
    except ConfigError:
        return None


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_quick_bound_never_exceeds_the_full_bound(scenario):
    """quick ≤ full bound (so sorting lazily is sorting by the full bound), and the quick
    bound is not vacuous: at least the busiest stage's layers, m times."""
    if scenario is None:
        return
    pricing = StagePricing(H100)
    workload = build_workload(scenario, H100.fp8_weight_copies)
    full = lower_bound_s(bound_inputs(scenario, H100, workload, pricing))
    quick = QuickBound(StagePricing(H100)).bound_s(scenario)
    assert 0 < quick <= full
    layers_s = [
        sum(s.num_layers * pricing.segment(s, pricing_layout(scenario, H100)).forward_s for s in c.segments)
        for stage in workload.stages
        for c in stage.chunks
    ]
    assert quick >= scenario.num_microbatches * max(layers_s) * (1 - 1e-6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_layer_kinds_are_the_workloads(scenario):
    """Each model layer's kind equals the one its workload segment carries."""
    if scenario is None:
        return
    kinds = layer_kinds(scenario)
    split = scenario.pipeline_split
    for stage in build_workload(scenario).stages:
        for chunk in stage.chunks:
            index = split.layer_offset(stage.stage, chunk.chunk)
            for segment in chunk.segments[: len(chunk.segments) - (1 if _has_mtp(scenario, chunk) else 0)]:
                for _ in range(segment.num_layers):
                    assert kinds[index] == segment.kind
                    index += 1


def _has_mtp(scenario: Scenario, chunk) -> bool:
    return bool(scenario.model.mtp_num_layers) and chunk.output is not None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts(), st.sampled_from([1, 2, 4, 8]))
def test_layer_prices_do_not_depend_on_dp(scenario, dp):
    """Two layouts that differ only in dp share a `dp_free_key` per kind, and their layer
    prices are equal, bit for bit (what lets `QuickBound` price each key once)."""
    if scenario is None:
        return
    par, tr = scenario.parallel, scenario.training
    other_data = scenario.model_dump(mode="json")
    other_data["parallel"]["dp"] = dp
    other_data["training"]["global_batch_size"] = tr.micro_batch_size * dp * 2
    try:
        other = parse_scenario(other_data, "other")
    except ConfigError:
        return
    assert par.dp * par.cp * par.tp > 0
    pricing = StagePricing(H100)
    for scen_a, scen_b in ((scenario, other),):
        layout_a, layout_b = pricing_layout(scen_a, H100), pricing_layout(scen_b, H100)
        for kind_a, kind_b in zip(layer_kinds(scen_a), layer_kinds(scen_b), strict=True):
            assert dp_free_key(kind_a, layout_a) == dp_free_key(kind_b, layout_b)
            price = [
                pricing.layer(
                    kind, kind_ops(kind), lay.tp, lay.dtype, lay.cp, lay.tp_comm_overlap, lay.experts
                )
                for kind, lay in ((kind_a, layout_a), (kind_b, layout_b))
            ]
            assert price[0] == price[1]
            if kind_a.moe is None and layout_a.experts is not None:
                # a dense layer's price ignores the expert groups (its key leaves them out)
                ops, lay = kind_ops(kind_a), layout_a
                without = pricing.layer(kind_a, ops, lay.tp, lay.dtype, lay.cp, lay.tp_comm_overlap, None)
                assert without == price[0]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_memory_floor_never_exceeds_the_exact_peak(scenario):
    """floor ≤ the fullest stage's exact peak, and it counts more than the static bytes
    where the stage stores activations (it would prune nothing otherwise)."""
    if scenario is None:
        return
    workload = build_workload(scenario, H100.fp8_weight_copies)
    peaks = [stage.peak_memory_bytes for stage in memory_plan.stage_memory_estimate(scenario, H100, workload)]
    floor = peak_floor_bytes(scenario, workload)
    assert floor <= max(peaks)
    static = max(stage.static.total_bytes for stage in workload.stages)
    assert floor > static * (1 + 1e-6) or min(c.saved_bytes for s in workload.stages for c in s.chunks) == 0


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.booleans()), min_size=1, max_size=40))
def test_lazy_order_is_the_full_bound_order(entries):
    """Cheap bounds below the full ones, ties included: popping gives (full bound, index)
    order, refining only what reaches the front."""
    full = [float(b) for b, _, _ in entries]
    cheap = [
        Candidate(i, None, full[i] - gap if not exact else full[i], 0.0, exact)  # type: ignore[arg-type]
        for i, (_, gap, exact) in enumerate(entries)
    ]
    order = BoundOrder(cheap, lambda c: Candidate(c.index, None, full[c.index], 0.0, True))  # type: ignore[arg-type]
    popped = [order.pop() for _ in range(len(entries))]
    assert [(c.bound_s, c.index) for c in popped] == sorted((b, i) for i, b in enumerate(full))
    assert all(c.bound_exact for c in popped) and not order


def _json(result) -> dict:
    payload = result.to_json_dict()
    payload.pop("elapsed_s")
    return payload


def test_plan_is_unchanged_by_the_lazy_order_and_the_memory_floor(monkeypatch):
    """The search with quick bounds and memory floors returns what it returns with every
    layout's full bound (quick bound 0: each one refined before it is visited) and its exact
    peak (floor 0): same answer, bounds and counts; on the small device the floor prunes."""
    tight = a100(0.3)
    cases = [(tiny_scenario(), a100(), 5), (tiny_scenario(), tight, 8), (tiny_moe_scenario(), a100(), 4)]
    results = [plan_layouts(base, hw, 8, top=top, headroom_fraction=0.2) for base, hw, top in cases]
    floors: list[float] = []
    monkeypatch.setattr(
        search, "peak_floor_bytes", lambda *args: floors.append(peak_floor_bytes(*args)) or 0.0
    )
    monkeypatch.setattr(search.QuickBound, "bound_s", lambda self, scenario: 0.0)
    for (base, hw, top), lazy in zip(cases, results, strict=True):
        floors.clear()
        assert _json(lazy) == _json(plan_layouts(base, hw, 8, top=top, headroom_fraction=0.2))
        assert lazy.pruned_bound > 0
    floors.clear()
    plan_layouts(tiny_scenario(), tight, 8, top=8, headroom_fraction=0.2)
    assert any(floor > memory_limit_bytes(tight, 0.2) for floor in floors)
    assert results[1].pruned_memory > 0


def test_random_bounds_order_like_a_sort():
    """A fixed random draw (seeded) of many entries: the heap agrees with sorted()."""
    rng = random.Random(18)
    full = [rng.choice([1.0, 2.0, 2.5, 3.0]) for _ in range(500)]
    cheap = [Candidate(i, None, b * rng.random(), 0.0, False) for i, b in enumerate(full)]  # type: ignore[arg-type]
    order = BoundOrder(cheap, lambda c: Candidate(c.index, None, full[c.index], 0.0, True))  # type: ignore[arg-type]
    assert [order.pop().index for _ in range(len(full))] == sorted(
        range(len(full)), key=lambda i: (full[i], i)
    )


def test_global_aux_loss_puts_dp_in_the_key():
    """global_aux_loss all-reduces the router's counts over tp·cp·dp: layouts differing in dp
    must not share a price (aux_loss over tp·cp still does)."""
    from tests.workload.test_moe_aux_loss import _scenario

    def keys(dp, **moe):
        scenario = _scenario(aux_loss_coeff=1e-3, **moe)
        data = scenario.model_dump(mode="json")
        data["parallel"]["dp"] = dp
        data["training"]["global_batch_size"] = dp * 16
        scenario = parse_scenario(data, "s.yaml")
        layout = pricing_layout(scenario, H100)
        return {dp_free_key(kind, layout) for kind in layer_kinds(scenario) if kind.moe is not None}

    assert keys(16) == keys(32)
    global_loss = "global_aux_loss"
    assert keys(16, load_balancing_type=global_loss).isdisjoint(keys(32, load_balancing_type=global_loss))
