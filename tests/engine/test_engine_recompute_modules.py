"""`training.recompute_modules` end to end (`simulation.run_simulation`): the shipped Mixtral
scenario with selective [core_attn, moe_act] runs, each stage's stored activations drop by
its in-flight microbatches × its MoE layers × the busiest expert rank's fc2 input, and the
re-run is time in the backward only."""

from __future__ import annotations

import copy

import pytest
import yaml

from simcluster.config import parse_scenario
from simcluster.config.hardware import load_hardware
from simcluster.simulation import run_simulation
from simcluster.workload.model import build_workload
from simcluster.workload.moe_layer import layer_rows
from tests.paths import ROOT

MIXTRAL = ROOT / "scenarios" / "moe" / "mixtral-8x7b-h100.yaml"


def _run(modules):
    data = yaml.safe_load(MIXTRAL.read_text())
    data["training"]["recompute"] = "selective"
    if modules is not None:
        data["training"]["recompute_modules"] = modules
    scenario = parse_scenario(copy.deepcopy(data), "s.yaml")
    hw = load_hardware(scenario.hardware)
    return scenario, build_workload(scenario), run_simulation(scenario, hw).result


def test_moe_act_frees_fc2_inputs_of_every_microbatch_in_flight():
    scenario, workload, base = _run(["core_attn"])
    _, _, act = _run(["core_attn", "moe_act"])
    kind = workload.layer_kind
    assert kind is not None and kind.moe is not None
    rows = layer_rows(kind.config, kind.moe)
    per_layer = rows.busiest_expert * kind.config.element_bytes * kind.moe.moe.ffn_hidden_size
    par = scenario.parallel
    for stage, before, after in zip(workload.stages, base.stages, act.stages, strict=True):
        moe_layers = sum(seg.num_layers for chunk in stage.chunks for seg in chunk.segments if seg.kind.moe)
        in_flight = min(par.pp - stage.stage, scenario.num_microbatches)  # 1F1B, no interleaving
        expected = in_flight * moe_layers * per_layer
        assert before.activation_bytes - after.activation_bytes == pytest.approx(expected, rel=1e-9)
        assert expected > 0
    # the same forward, a longer backward: the re-run activation is priced there
    assert act.layer.forward_s == base.layer.forward_s
    assert act.layer.backward_s > base.layer.backward_s
    assert act.time_breakdown_s["recompute"] > base.time_breakdown_s["recompute"]
    assert act.iteration_time_s > base.iteration_time_s


def test_default_modules_give_todays_result_exactly():
    """null and [core_attn] are one run, `==` to the last bit."""
    _, _, default = _run(None)
    _, _, explicit = _run(["core_attn"])
    assert default.to_json_dict() == explicit.to_json_dict()
