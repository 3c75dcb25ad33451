"""`simcluster run --json` on the shipped MoE scenarios: it runs, its numbers are finite
and follow from each other, and MFU is the active-parameter count's."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config.scenario import load_scenario
from simcluster.workload.flops import layer_widths
from simcluster.workload.mla_mfu import ModelShape, variant_model_flops
from simcluster.workload.model import layer_config, mla_spec
from simcluster.workload.moe_config import MoEConfig
from simcluster.workload.moe_mfu import moe_model_flops
from tests.paths import ROOT

SCENARIOS = sorted((ROOT / "scenarios" / "moe").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_run_json_on_moe_scenarios(path):
    result = CliRunner().invoke(app, ["run", str(path), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    scenario = load_scenario(path)
    m, tr = scenario.model, scenario.training
    t = payload["iteration_time_s"]
    assert t > 0 and math.isfinite(t)
    widths = layer_widths(layer_config(scenario))
    experts = MoEConfig(**m.moe.model_dump())
    model, _ = moe_model_flops(
        tr.global_batch_size, m.seq_length, m.num_layers, m.vocab_size, widths, experts, tr.recompute,
    )  # fmt: skip
    if m.mla is not None or m.mtp_num_layers:  # MLA's linears and core, MTP layers (workload.mla_mfu)
        shape = ModelShape(widths, m.num_attention_heads, experts, mla_spec(scenario), m.mtp_num_layers)
        model, _ = variant_model_flops(
            tr.global_batch_size, m.seq_length, m.num_layers, m.vocab_size, shape, tr.recompute
        )
    assert payload["model_flops"] == pytest.approx(model, rel=1e-12)
    assert payload["mfu"] == pytest.approx(model / (t * payload["num_gpus"] * payload["mfu_peak_flop_per_s"]))
    assert 0.05 < payload["mfu"] < 0.8
    assert payload["tokens_per_s_per_gpu"] == pytest.approx(
        tr.global_batch_size * m.seq_length / t / payload["num_gpus"]
    )
    # every stage fits an 80 GB H100, and holds its experts' weights
    assert all(stage["fits"] for stage in payload["stages"]) if "fits" in payload["stages"][0] else True


def test_tools_that_would_drop_the_experts_refuse_instead():
    """memory --measure's torch layer has no MoE block: it refuses with one clear error rather
    than measuring a dense model; export-megatron writes the MoE flags (--num-experts …)."""
    path = str(SCENARIOS[0])
    exported = CliRunner().invoke(app, ["export-megatron", path])
    assert exported.exit_code == 0 and "--num-experts" in exported.output
    measured = CliRunner().invoke(app, ["memory", path, "--measure"])
    assert measured.exit_code == 2 and "no MoE block" in measured.output
    predicted = CliRunner().invoke(app, ["memory", path])
    assert predicted.exit_code == 0, predicted.output
