"""Golden numbers for issue 18's engine refactor (typed links, collectives as plan data):
every number `simcluster run --json` gives for every shipped scenario, a digest of its
Chrome trace, `validate --json`'s table, the same runs with `--steady-state`, and each
scenario again with the data-parallel options the engine branches on switched on
(overlapped gradient reduction, the distributed optimizer, the overlapped parameter
all-gather). Recorded once from the commit before the refactor with

    .venv/bin/python -m tests.engine.golden_refactor --write

and compared with `==` by tests/engine/test_golden_refactor.py: the refactor must not
move a single bit.

Re-captured (issue 20, 2026-11-27) at the deliberate pricing change that priced the
dropout-0 bias-dropout-add as a bias add and took the H100 SwiGLU / bias-GeLU rates from two
more H100s: only runs on the H100, H200 and Blackwell profiles moved; every A100 run equal.

Re-captured (2026-11-27) at MLA's attention backward counted as its five GEMMs by their own
head dims (workload.ops.AttentionShape.flops): only scenarios/moe/deepseek-v3-h100.yaml moved.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config import ConfigError, load_scenario_and_hardware, parse_scenario
from simcluster.engine.trace import trace_events
from simcluster.simulation import run_simulation
from tests.paths import ROOT

GOLDEN = Path(__file__).with_name("golden_refactor.json")
SCENARIOS = sorted((ROOT / "scenarios").glob("*/*.yaml"))
# the options switched on for the variant runs (each needs dp·cp > 1 to matter)
VARIANTS = {
    "overlap": {"overlap_grad_reduce": True},
    "distopt": {"use_distributed_optimizer": True},
    "distopt-overlap": {"use_distributed_optimizer": True, "overlap_grad_reduce": True},
    "distopt-overlap-gather": {
        "use_distributed_optimizer": True,
        "overlap_grad_reduce": True,
        "overlap_param_gather": True,
    },
}


def _cli_json(*args: str) -> object:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _trace_digest(events: list[dict[str, object]]) -> str:
    return hashlib.sha256(json.dumps(events).encode()).hexdigest()


def capture() -> dict[str, object]:
    runs: dict[str, object] = {}
    for path in SCENARIOS:
        name = str(path.relative_to(ROOT))
        runs[name] = _cli_json("run", str(path), "--json")
        runs[f"{name} --steady-state"] = _cli_json("run", str(path), "--json", "--steady-state")
        scenario, hw = load_scenario_and_hardware(path)
        sim = run_simulation(scenario, hw, record=True)
        runs[f"{name} trace"] = _trace_digest(trace_events(sim.engine))
        for variant, options in VARIANTS.items():
            data = yaml.safe_load(path.read_text())
            data.setdefault("training", {}).update(options)
            try:
                changed = parse_scenario(data, name)
            except ConfigError as error:  # an invalid combination is recorded as such
                runs[f"{name} {variant}"] = f"error: {error}"
                continue
            runs[f"{name} {variant}"] = run_simulation(changed, hw).result.to_json_dict()
    runs["validate"] = _cli_json("validate", "--json")
    return runs


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.engine.golden_refactor --write")
    GOLDEN.write_text(json.dumps(capture(), sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
