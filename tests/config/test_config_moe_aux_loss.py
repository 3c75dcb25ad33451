"""`model.moe.aux_loss_coeff` / `load_balancing_type` / `z_loss_coeff`: defaults, one clear
error per bad value, and `--moe-aux-loss-coeff`, `--moe-router-load-balancing-type`,
`--moe-z-loss-coeff` through import-megatron and export-megatron."""

from __future__ import annotations

import shlex

import pytest

from simcluster.config import ConfigError, load_scenario
from simcluster.config.megatron_args import parse_megatron_args, to_megatron_args
from simcluster.config.moe_choices import LoadBalancingType
from simcluster.config.moe_config import MoEConfig
from simcluster.config.scenario import parse_scenario
from tests.config.test_config_megatron_moe import MIXTRAL, MOE_LINE
from tests.megatron_line import as_read_back


def _mixtral(**moe):
    data = load_scenario(MIXTRAL).model_dump(mode="json")
    data["model"]["moe"].update(moe)
    return data


def test_defaults_are_megatrons():
    """coeff 0, aux_loss, no z-loss (transformer_config.py): no loss runs."""
    moe = MoEConfig(num_experts=8, router_topk=2, ffn_hidden_size=16)
    assert (moe.aux_loss_coeff, moe.load_balancing_type, moe.z_loss_coeff) == (
        0.0,
        LoadBalancingType.AUX_LOSS,
        None,
    )
    assert not moe.aux_loss_enabled


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("aux_loss_coeff", -0.01, "greater than or equal to 0"),
        ("z_loss_coeff", -1.0, "greater than or equal to 0"),
        ("load_balancing_type", "sinkhorn", "'aux_loss', 'seq_aux_loss', 'global_aux_loss' or 'none'"),
    ],
)
def test_bad_value_is_one_clear_error(field, value, allowed):
    """The file, the field, the value and what is allowed."""
    with pytest.raises(ConfigError) as error:
        parse_scenario(_mixtral(**{field: value}), "m.yaml")
    (problem,) = error.value.problems
    assert problem.startswith(f"model.moe.{field}: value") and str(value) in problem and allowed in problem
    assert "m.yaml" in str(error.value)


def test_moe_config_refuses_a_negative_coefficient():
    """The workload's dataclass holds the same rule (the loader's message names the field)."""
    with pytest.raises(ValueError, match="MoEConfig.aux_loss_coeff=-1"):
        MoEConfig(num_experts=8, router_topk=2, ffn_hidden_size=16, aux_loss_coeff=-1)


def test_export_writes_the_flags_and_import_reads_them_back():
    """scenario -> flags -> scenario, `==`; Megatron's defaults write no flag."""
    on = parse_scenario(
        _mixtral(load_balancing_type="seq_aux_loss", aux_loss_coeff=1e-4, z_loss_coeff=1e-3), "m.yaml"
    )
    words = shlex.split(to_megatron_args(on, 8))
    assert words[words.index("--moe-router-load-balancing-type") + 1] == "seq_aux_loss"
    assert float(words[words.index("--moe-aux-loss-coeff") + 1]) == 1e-4
    assert float(words[words.index("--moe-z-loss-coeff") + 1]) == 1e-3
    imported = parse_megatron_args(to_megatron_args(on, 8), on.hardware, on.name)
    assert imported.validated() == as_read_back(on) and imported.not_modelled == ()
    off = parse_scenario(_mixtral(aux_loss_coeff=0.0), "m.yaml")
    words = shlex.split(to_megatron_args(off, 8))
    assert not {"--moe-router-load-balancing-type", "--moe-aux-loss-coeff", "--moe-z-loss-coeff"} & set(words)


def test_import_reads_megatrons_defaults_and_demotes_sinkhorn():
    """No flag: coeff 0, aux_loss; sinkhorn routing is listed as not modelled (no loss priced)."""
    moe = parse_megatron_args(MOE_LINE).validated().model.moe
    assert (moe.aux_loss_coeff, moe.load_balancing_type, moe.z_loss_coeff) == (
        0.0,
        LoadBalancingType.AUX_LOSS,
        None,
    )
    imported = parse_megatron_args(f"{MOE_LINE} --moe-router-load-balancing-type sinkhorn")
    assert any(flag.startswith("--moe-router-load-balancing-type") for flag in imported.not_modelled)
    assert imported.validated().model.moe.load_balancing_type is LoadBalancingType.AUX_LOSS
    line = f"{MOE_LINE} --moe-router-load-balancing-type global_aux_loss --moe-aux-loss-coeff 1e-3"
    moe = parse_megatron_args(line).validated().model.moe
    assert (moe.load_balancing_type, moe.aux_loss_coeff) == (LoadBalancingType.GLOBAL_AUX_LOSS, 1e-3)


def test_import_of_several_types_is_not_modelled_and_runs_without_a_loss():
    """Megatron takes a list of types with one coefficient each; one type is modelled."""
    types = "--moe-router-load-balancing-type seq_aux_loss global_aux_loss"
    line = f"{MOE_LINE} {types} --moe-aux-loss-coeff 1e-3 1e-4"
    imported = parse_megatron_args(line)
    assert any(flag.startswith("--moe-router-load-balancing-type") for flag in imported.not_modelled)
    assert imported.validated().model.moe.aux_loss_coeff == 0.0
