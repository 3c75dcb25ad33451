"""Every number the stage pricing feeds, captured so a refactor of the pricing can be checked
with `==` (issue 18 "make room": results equal before and after).

    .venv/bin/python -m tests.costs.golden_stage_pricing --write   # from the base commit only

records into `golden_stage_pricing.json`: `run --json`'s result of every shipped scenario (and
of a few variants built here, for pricing paths no shipped scenario takes), the same with
`--steady-state`, `validate`'s Tables 4 and 5, `plan.bound`'s per-stage seconds and bound of
each, and the bound of every layout of two plan searches. Floats go through JSON as `repr`
does, so a read-back value is the float written, bit for bit. The test
(`test_costs_stage_pricing_golden.py`) recomputes everything and compares with `==`.

Re-captured (issue 20, 2026-11-27) at the deliberate pricing change that priced the
dropout-0 bias-dropout-add as a bias add and took the H100 SwiGLU / bias-GeLU rates from two
more H100s: only runs on the H100, H200 and Blackwell profiles moved; every A100 run equal.

Re-captured (2026-11-27) at MLA's attention backward counted as its five GEMMs by their own
head dims (workload.ops.AttentionShape.flops): only scenarios/moe/deepseek-v3-h100.yaml moved.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import Scenario, load_scenario, load_scenario_and_hardware, parse_scenario
from simcluster.costs.stage_pricing import StagePricing
from simcluster.headroom import DEFAULT_HEADROOM_FRACTION, memory_limit_bytes
from simcluster.plan.base import load_plan_scenario
from simcluster.plan.bound import bound_inputs, lower_bound_s, stage_seconds
from simcluster.plan.search import prepare
from simcluster.plan.space import search_space
from simcluster.simulation import run_simulation
from simcluster.validation import table4_comparisons, table5_comparisons
from simcluster.workload.model import build_workload
from tests.modern_cases import llama3_8b
from tests.paths import ROOT

GOLDEN = Path(__file__).with_name("golden_stage_pricing.json")

# Pricing paths beyond the shipped scenarios: tp without SP (the p2p all-gather), the
# distributed optimizer with and without its overlaps (buckets, parameter gather), FP8
# delayed scaling (amax reduction) with TE userbuffers, CUDA graphs (host issue), tied
# embeddings across a pipeline, an uneven split, cp with vpp.
VARIANTS: dict[str, dict[str, Any]] = {
    "tp-no-sp-pp": llama3_8b(
        model={"num_layers": 16, "untie_embeddings_and_output_weights": False},
        parallel={"tp": 2, "pp": 4, "dp": 2},
        training={"global_batch_size": 16},
    ),
    "distopt-overlap-vpp": llama3_8b(
        parallel={"tp": 2, "pp": 2, "dp": 4, "vpp": 2, "sequence_parallel": True},
        training={
            "global_batch_size": 64, "use_distributed_optimizer": True, "overlap_grad_reduce": True,
            "overlap_param_gather": True,
        },
    ),
    "distopt-plain": llama3_8b(
        parallel={"tp": 1, "pp": 2, "dp": 8},
        training={"global_batch_size": 32, "use_distributed_optimizer": True},
    ),
    "fp8-delayed-userbuffers": llama3_8b(
        parallel={"tp": 4, "pp": 2, "dp": 2, "sequence_parallel": True},
        training={
            "global_batch_size": 16, "dtype": "fp8", "tp_comm_overlap": True, "overlap_grad_reduce": True,
        },
    ),
    "cuda-graph-cp-vpp": llama3_8b(
        parallel={"tp": 2, "pp": 2, "cp": 2, "dp": 2, "vpp": 2, "sequence_parallel": True},
        training={"global_batch_size": 16, "cuda_graph_impl": "local"},
    ),
    "uneven-split": llama3_8b(
        model={"num_layers": 30},
        parallel={"tp": 1, "pp": 4, "dp": 2, "account_for_embedding_in_pipeline_split": True,
                  "account_for_loss_in_pipeline_split": True},
        training={"global_batch_size": 16},
    ),
}  # fmt: skip

PLAN_SEARCHES = (("scenarios/plan/gpt3-175b.yaml", 64),)


def shipped_scenarios() -> list[Path]:
    return sorted((ROOT / "scenarios").rglob("*.yaml"))


def scenario_cases() -> dict[str, Scenario]:
    """Every shipped scenario (by path under scenarios/) and every variant (by name)."""
    cases = {str(p.relative_to(ROOT)): load_scenario(p) for p in shipped_scenarios()}
    for name, data in VARIANTS.items():
        cases[f"variant:{name}"] = parse_scenario({"name": name, **data}, name)
    return cases


def _hardware(key: str, scenario: Scenario) -> Any:
    if key.startswith("variant:"):
        return load_hardware(scenario.hardware)
    return load_scenario_and_hardware(ROOT / key)[1]


def capture_case(key: str, scenario: Scenario) -> dict[str, Any]:
    """One scenario's numbers: the run's JSON (full and steady-state), the bound's stages."""
    hw = _hardware(key, scenario)
    workload = build_workload(scenario, hw.fp8_weight_copies)
    pricer = StagePricing(hw)
    return {
        "run": run_simulation(scenario, hw).result.to_json_dict(),
        "steady_state": run_simulation(scenario, hw, steady_state=True).result.to_json_dict(),
        "stage_seconds": [asdict(s) for s in stage_seconds(scenario, hw, workload, pricer)],
        "bound_s": lower_bound_s(bound_inputs(scenario, hw, workload, pricer)),
    }


def capture_plan(path: str, num_gpus: int) -> list[list[float]]:
    """Every layout's (bound, static bytes) of `plan`'s search, in enumeration order."""
    base = load_plan_scenario(ROOT / path)
    hw = load_hardware(base.hardware, relative_to=ROOT / path)
    limit = memory_limit_bytes(hw, DEFAULT_HEADROOM_FRACTION)
    return [[c.bound_s, c.static_bytes] for c in prepare(search_space(base, hw, num_gpus), limit)]


def capture_validation() -> list[list[Any]]:
    return [asdict(c) for c in (*table4_comparisons(), *table5_comparisons())]  # type: ignore[misc]


def capture() -> dict[str, Any]:
    return {
        "cases": {key: capture_case(key, s) for key, s in scenario_cases().items()},
        "validation": capture_validation(),
        "plans": {f"{path}@{n}": capture_plan(path, n) for path, n in PLAN_SEARCHES},
    }


def _encode(value: Any) -> Any:
    """JSON has no Infinity: a pruned layout's bound is written as the string "inf"."""
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    return value


def decode(value: Any) -> Any:
    if value == "inf":
        return math.inf
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {GOLDEN.name}")
    args = parser.parse_args()
    data = _encode(capture())
    if args.write:
        GOLDEN.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")
    else:
        print(json.dumps(data, indent=1, sort_keys=True)[:2000])


if __name__ == "__main__":
    main()
