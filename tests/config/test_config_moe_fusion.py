"""`training.moe_router_fusion` / `training.moe_permute_fusion`: defaults, the loader's rules
(one clear error each), and `--moe-router-fusion` / `--moe-permute-fusion` through
import-megatron and export-megatron."""

from __future__ import annotations

import shlex

import pytest

from simcluster.config import ConfigError, load_scenario
from simcluster.config.megatron_args import parse_megatron_args, to_megatron_args
from simcluster.config.scenario import NOT_MODELLED_YET_MESSAGE, parse_scenario
from tests.config.test_config_megatron_moe import MIXTRAL, MOE_LINE
from tests.megatron_line import as_read_back


def _mixtral(**training):
    data = load_scenario(MIXTRAL).model_dump(mode="json")
    data["training"].update(training)
    return data


def test_both_default_to_false_and_mixtral_sets_neither():
    """Megatron's defaults (transformer_config.py: False): every shipped result is unchanged."""
    scenario = load_scenario(MIXTRAL)
    assert (scenario.training.moe_router_fusion, scenario.training.moe_permute_fusion) == (False, False)


@pytest.mark.parametrize("key", ["moe_router_fusion", "moe_permute_fusion"])
def test_fusion_of_a_dense_model_is_one_clear_error(key):
    """Without model.moe there is no router or permutation to fuse."""
    data = _mixtral(**{key: True})
    del data["model"]["moe"]
    data["parallel"].update(ep=1, etp=None)
    with pytest.raises(ConfigError) as error:
        parse_scenario(data, "dense.yaml")
    problems = [p for p in error.value.problems if p.startswith(f"training.{key}: value true")]
    assert len(problems) == 1 and "needs model.moe" in problems[0] and "false (the default)" in problems[0]


@pytest.mark.parametrize(
    ("dispatcher", "backend"), [("allgather", "deepep"), ("flex", "deepep")], ids=["allgather", "deepep"]
)
def test_permute_fusion_not_priced_with_allgather_or_deepep(dispatcher, backend):
    """The refusal says it is not modelled yet and what is allowed; router fusion is fine there."""
    data = _mixtral(
        moe_token_dispatcher=dispatcher, moe_flex_dispatcher_backend=backend, moe_permute_fusion=True
    )
    data["parallel"]["etp"] = 1
    with pytest.raises(ConfigError) as error:
        parse_scenario(data, "q.yaml", refuse_unpriced=False)
    (problem,) = [p for p in error.value.problems if p.startswith("training.moe_permute_fusion: value true")]
    assert NOT_MODELLED_YET_MESSAGE in problem and "allowed: alltoall" in problem
    data["training"].update(moe_permute_fusion=False, moe_router_fusion=True)
    assert parse_scenario(data, "q.yaml", refuse_unpriced=False).training.moe_router_fusion


def test_alltoall_and_hybridep_accept_permute_fusion():
    data = _mixtral(moe_router_fusion=True, moe_permute_fusion=True)
    assert parse_scenario(data, "q.yaml").training.moe_permute_fusion
    data["training"].update(moe_token_dispatcher="flex", moe_flex_dispatcher_backend="hybridep")
    data["parallel"]["etp"] = 1
    assert parse_scenario(data, "q.yaml", refuse_unpriced=False).training.moe_permute_fusion


def test_export_writes_the_flags_and_import_reads_them_back():
    """scenario -> flags -> scenario, `==`, with both keys on; off, no flag is written."""
    on = parse_scenario(_mixtral(moe_router_fusion=True, moe_permute_fusion=True), "q.yaml")
    words = shlex.split(to_megatron_args(on, 8))
    assert "--moe-router-fusion" in words and "--moe-permute-fusion" in words
    imported = parse_megatron_args(to_megatron_args(on, 8), on.hardware, on.name)
    assert imported.validated() == as_read_back(on) and imported.not_modelled == ()
    off = shlex.split(to_megatron_args(load_scenario(MIXTRAL), 8))
    assert "--moe-router-fusion" not in off and "--moe-permute-fusion" not in off


def test_import_of_deepep_with_permute_fusion_demotes_only_that_flag():
    """DeepEP's fused permute is not priced: the flag is listed as not modelled with the
    scenario's reason and the key stays false; the router fusion beside it is kept."""
    line = MOE_LINE.replace("--moe-token-dispatcher-type alltoall", "--moe-token-dispatcher-type flex")
    imported = parse_megatron_args(f"{line} --moe-router-fusion --moe-permute-fusion")
    assert imported.requested["training"]["moe_permute_fusion"] is True
    (flag,) = [f for f in imported.not_modelled if f.startswith("--moe-permute-fusion")]
    assert NOT_MODELLED_YET_MESSAGE in flag
    training = imported.validated().training
    assert (training.moe_router_fusion, training.moe_permute_fusion) == (True, False)


def test_fusion_flags_of_a_dense_line_have_no_effect_and_say_so():
    dense = MOE_LINE.replace("--num-experts 8 ", "").replace("--expert-model-parallel-size 4 ", "")
    imported = parse_megatron_args(f"{dense} --moe-router-fusion --moe-permute-fusion")
    assert "moe_router_fusion" not in imported.requested["training"]
    assert any("fusion flags without --num-experts: no effect" in note for note in imported.notes)
