"""`simcluster plan` on a MoE scenario: --json and the table show ep / etp; --ep / --etp
pin them; bad values exit 2 naming the option."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from simcluster.cli import app
from tests.plan.plan_world import TINY, TINY_MOE


def _write(tmp_path, data):
    data = {key: value for key, value in data.items() if key != "parallel"}
    path = tmp_path / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _plan(*args):
    return CliRunner().invoke(app, ["plan", *map(str, args), "--no-progress"])


# a small slice of the space (the CLI pins only ep / etp; the rest is searched)
PINNED = ("--gpus", 4, "--top", 3)


def test_json_shows_ep_and_etp_and_respects_the_pins(tmp_path):
    """--ep 2,4 --etp 1: every candidate's scenario has ep 2 or 4 and etp 1; axes lists them."""
    result = _plan(_write(tmp_path, TINY_MOE), *PINNED, "--ep", "2,4", "--etp", "1", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["axes"][:5] == ["tp", "pp", "cp", "ep", "etp"]
    assert len(payload["candidates"]) == 3
    for candidate in payload["candidates"]:
        parallel = candidate["scenario"]["parallel"]
        assert parallel["ep"] in (2, 4) and parallel["etp"] == 1
        assert f"-ep{parallel['ep']}-etp1-" in candidate["scenario"]["name"]
        # the launch line, or why the export cannot write it yet
        assert candidate["megatron_args"] or candidate["megatron_args_problem"]


def test_table_names_ep_and_etp(tmp_path):
    result = _plan(_write(tmp_path, TINY_MOE), *PINNED, "--ep", "2", "--etp", "1")
    assert result.exit_code == 0, result.output
    assert "ep 2, etp 1" in result.stdout  # the best layout's line (or the "same in all" line)


@pytest.mark.parametrize(
    ("model", "args", "message"),
    [
        (TINY_MOE, ("--ep", "3"), "--ep: value 3: must divide model.moe.num_experts (8)"),
        (TINY_MOE, ("--ep", "2,x"), "--ep: value 'x' in '2,x'"),
        (TINY, ("--ep", "2"), "--ep: not searched for this model (expert parallelism needs model.moe)"),
    ],
    ids=["not-dividing", "not-a-number", "dense"],
)
def test_bad_ep_exits_2_naming_the_option(tmp_path, model, args, message):
    result = _plan(_write(tmp_path, model), "--gpus", 4, *args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_pinned_ep_no_layout_can_hold_names_the_folding_rule(tmp_path):
    """--ep 8 on 2 GPUs: no layout folds 8 expert ranks into tp·cp·dp ≤ 2; the error says so."""
    result = _plan(_write(tmp_path, TINY_MOE), "--gpus", 2, "--ep", "8")
    assert result.exit_code == 2
    assert "ep * etp dividing tp * cp * dp (Megatron-core's expert folding), with ep one of 8" in " ".join(
        result.output.split()
    )
