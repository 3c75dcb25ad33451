"""A cheap lower bound on a layout's time bound (`bound.lower_bound_s`), from its layers'
prices alone, without building its workload or pricing its stages.

`bound.lower_bound_s` is at least stage r's pipeline work, m · Σ_c (forward + backward busy
seconds of chunk c), for every stage r. A chunk's busy seconds are max(GPU, host) ≥ its GPU
seconds (`costs.stage_pricing.PricedChunk`), and its GPU seconds are the sum of its layers'
priced forward, backward and recompute seconds plus its embedding / output layer and FP8's
amax reductions (`costs.chunk.compose_chunk`), all ≥ 0. So

    quick_r = m · Σ_{layers ℓ of stage r} (forward_s(ℓ) + backward_s(ℓ))

with each layer priced as its kind (`workload.model.LayerKind`, the one `build_workload`
gives it) never exceeds the full bound; `quick = max_r quick_r`, shrunk by `FLOAT_SLACK`
for the different order of the float sums. It leaves out the fill and drain, the sends,
the gradient reduction, the optimizer step, the MTP layers and the extras, so it is a few
percent below the full bound on the layouts that matter, and costs a layer-price lookup
instead of a workload and its stage prices.

`plan.search` orders layouts by it and computes the full bound only for layouts that reach
the front of the order (`plan.order.BoundOrder`): the visiting order, and so the answer and
the counts, are those of sorting by the full bound. A hypothesis test checks quick ≤ full
bound on random layouts, and that the layer kinds here are the workload's.
"""

from __future__ import annotations

from dataclasses import replace

from simcluster.config.moe_choices import LoadBalancingType
from simcluster.config.scenario import Scenario
from simcluster.costs.stage_pricing import PricingLayout, StagePricing, pricing_layout
from simcluster.workload.mla import is_window_layer
from simcluster.workload.model import LayerKind, kind_ops, layer_config, mla_spec, moe_spec

FLOAT_SLACK = 1e-9
"""Relative shrink of the quick bound: its float sums run in another order than the full
bound's (a few ulps apart); any slack far above that and far below the bounds' spread works."""


def layer_kinds(scenario: Scenario) -> tuple[LayerKind, ...]:
    """The kind of each model layer (0-based), as `workload.model._layer_segments` builds
    them: dense or MoE (`first_k_dense_layers`), full or sliding-window attention
    (`workload.mla.is_window_layer`, 1-based). Equal values, not the same objects."""
    m = scenario.model
    cfg = layer_config(scenario)
    spec = moe_spec(scenario)
    mla = mla_spec(scenario, cfg)
    first_k = spec.moe.first_k_dense_layers if spec is not None else 0
    built: dict[tuple[bool, bool], LayerKind] = {}
    kinds = []
    for index in range(m.num_layers):
        moe = spec is not None and index >= first_k
        window = is_window_layer(index + 1, m.window_size, m.window_attn_skip_freq)
        if (moe, window) not in built:
            config = replace(cfg, window_size=m.window_size) if window else cfg
            built[moe, window] = LayerKind(config, scenario.parallel.cp, spec if moe else None, mla)
        kinds.append(built[moe, window])
    return tuple(kinds)


def dp_free_key(kind: LayerKind, layout: PricingLayout) -> tuple[object, ...]:
    """What a layer's price (`StagePricing.layer`: `price_layer_ops` of `kind_ops(kind)` on
    the layout's groups) depends on, without dp: a MoE layer's ops count its tokens per
    rank from tp, cp, ep and etp (`workload.moe`; `ExpertLayout.dp` only sizes the expert
    optimizer shards, `workload.moe_memory`), and its collectives run over the ep, etp and
    etp·ep groups (`costs.chunk.op_group`), never the expert-data-parallel one; a dense
    layer's run over the TP group alone, so its key leaves out the expert groups. Layouts
    that differ only in pp (hence dp), and a dense layer's layouts that differ only in ep
    and etp, share one price; a test checks the prices are equal. The one exception is the
    router's global_aux_loss, whose token counts are all-reduced over tp·cp·dp
    (`workload.moe_aux_loss`): then that group joins the key."""
    spec = kind.moe
    moe = None
    if spec is not None:
        moe = (spec.moe, spec.layout.tp, spec.layout.cp, spec.layout.ep, spec.layout.expert_tp,
               spec.dispatcher, spec.grouped_gemm)  # fmt: skip
    experts = layout.experts
    # a dense layer's ops all run over the TP group: the expert groups do not price it
    groups = None
    if experts is not None and spec is not None:
        # global_aux_loss: the counts' all-reduce runs over tp·cp·dp, so dp prices the layer
        global_loss = spec.moe.load_balancing_type is LoadBalancingType.GLOBAL_AUX_LOSS
        over_dp = spec.moe.aux_loss_enabled and global_loss
        groups = (experts.ep, experts.etp, experts.etp_ep, experts.tp_dp_cp if over_dp else None)
    return (kind.config, kind.cp, kind.mla, moe, layout.tp, layout.cp, layout.dtype,
            layout.tp_comm_overlap, groups)  # fmt: skip


class QuickBound:
    """`bound_s` for the layouts of one search: each layer kind priced once per
    `dp_free_key` (by `pricing`, whose cache the full bound and the simulations share)."""

    def __init__(self, pricing: StagePricing) -> None:
        self.pricing = pricing
        self._seconds: dict[tuple[object, ...], float] = {}

    def _layer_s(self, kind: LayerKind, layout: PricingLayout) -> float:
        key = dp_free_key(kind, layout)
        seconds = self._seconds.get(key)
        if seconds is None:
            cost = self.pricing.layer(
                kind, kind_ops(kind), layout.tp, layout.dtype, layout.cp, layout.tp_comm_overlap,
                layout.experts,
            )  # fmt: skip
            seconds = self._seconds[key] = cost.forward_s + cost.backward_s
        return seconds

    def layer_s(self, scenario: Scenario) -> tuple[float, ...]:
        """Each model layer's forward + backward (recompute included) GPU seconds."""
        layout = pricing_layout(scenario, self.pricing.hw)
        seconds: dict[LayerKind, float] = {}
        per_layer = []
        for kind in layer_kinds(scenario):
            if kind not in seconds:
                seconds[kind] = self._layer_s(kind, layout)
            per_layer.append(seconds[kind])
        return tuple(per_layer)

    def bound_s(self, scenario: Scenario) -> float:
        """m · the busiest stage's layer seconds, shrunk by `FLOAT_SLACK` (module docstring)."""
        per_layer = self.layer_s(scenario)
        split = scenario.pipeline_split
        busiest = 0.0
        for stage, chunks in enumerate(split.chunk_layers):
            stage_s = 0.0
            for chunk, count in enumerate(chunks):
                first = split.layer_offset(stage, chunk)
                stage_s += sum(per_layer[first : first + count])
            busiest = max(busiest, stage_s)
        return scenario.num_microbatches * busiest * (1 - FLOAT_SLACK)
