"""`parallel.pipeline_layout` (Megatron-core `--pipeline-model-parallel-layout`): the string is
expanded as `PipelineParallelLayerLayout.parse_str_to_list` does, split into virtual stages in
virtual-stage order, and refused, one rule at a time, where Megatron-core refuses it."""

import re
import shlex

import pytest

from simcluster.config import ConfigError, parse_scenario
from simcluster.config.megatron_args import parse_megatron_args, to_megatron_args
from simcluster.config.pipeline_layout import (
    MAX_EXPANDED_SYMBOLS,
    LayoutError,
    LayoutRequest,
    layout_problems,
    parse_layout,
)
from simcluster.config.pipeline_split import SplitRequest, pipeline_split, split_problems
from tests.config.scenario_cases import refusal as _problems
from tests.config.scenario_cases import with_changes

DSV3_STANDALONE = "Et*3|(tt|)*29,m|L"  # Megatron-LM's own test layout for pp 8, 32 stages
DSV3_COLOCATED = "Et*4|(t*4|)*14,tmL"  # Megatron-Bridge's DeepSeek-V3 (pp, vp) = (4, 4) / (16, 1)


def _scenario(**parallel):
    return with_changes("parallel", **parallel)


def test_expansion_follows_megatron_examples():
    """Megatron's docstring: "Ettt|(tt|)*29,m|L" is [E,t,t,t] + [t,t]*29 + [m] + [L]; groups
    expand before single symbols, commas vanish, and `(|ab)*2` gives empty stages."""
    layout = parse_layout(DSV3_STANDALONE)
    assert layout.stages == ("Ettt",) + ("tt",) * 29 + ("m", "L")
    assert layout.count("t") == 61 and layout.mtp_stage == 30
    assert parse_layout("E|t|t*2|t||(t|)*2,t*2,L").stages == ("E", "t", "tt", "t", "", "t", "t", "ttL")
    assert parse_layout("(|tt)*2,L").stages == ("", "tt", "ttL")
    assert parse_layout(DSV3_COLOCATED).stages == ("Etttt",) + ("tttt",) * 14 + ("tmL",)


def test_chunk_layers_in_virtual_stage_order():
    """Stage k is chunk k // pp of rank k % pp: with pp 8 the 32 stages of the standalone
    layout give rank 0 (3, 2, 2, 2), ranks 6 and 7 no layer in their last chunk (m, L)."""
    chunks = parse_layout(DSV3_STANDALONE).chunk_layers(8)
    assert chunks[0] == (3, 2, 2, 2)
    assert chunks[6] == (2, 2, 2, 0) and chunks[7] == (2, 2, 2, 0)
    assert all(chunks[r] == (2, 2, 2, 2) for r in range(1, 6))
    split = pipeline_split(SplitRequest(61, 8, 4, pipeline_layout=DSV3_STANDALONE, mtp_num_layers=1))
    assert split.chunk_layers == chunks
    assert split.stage_layers == (9, 8, 8, 8, 8, 8, 6, 6)
    # offsets walk the virtual stages in order: rank 1 chunk 1 starts after 3 + 2·7 + 2 layers
    assert split.layer_offset(1, 1) == 3 + 2 * 7 + 2


def test_even_layout_equals_the_default_split():
    """ "Ett|tt|tt|ttL" on pp 2 vpp 2 builds the default split's 2 layers per chunk."""
    request = SplitRequest(8, 2, 2, pipeline_layout="Ett|tt|tt|ttL")
    assert pipeline_split(request) == pipeline_split(SplitRequest(8, 2, 2))


def test_layout_equal_to_first_and_last_stage_sizes():
    """DeepSeek-V3's shipped split (pp 16, first 4, last 1) as a layout gives the same chunks."""
    explicit = SplitRequest(61, 16, first_pipeline_num_layers=4, last_pipeline_num_layers=1)
    layout = SplitRequest(61, 16, pipeline_layout=DSV3_COLOCATED, mtp_num_layers=1)
    assert pipeline_split(layout) == pipeline_split(explicit)


def test_scenario_loads_a_layout_and_splits_by_it():
    data = _scenario(pipeline_layout="Et|ttt|ttt|tL", vpp=2)
    scenario = parse_scenario(data, "s.yaml")
    assert scenario.pipeline_split.chunk_layers == ((1, 3), (3, 1))
    assert scenario.mtp_virtual_stage == 3


@pytest.mark.parametrize(
    ("layout", "vpp", "expected"),
    [
        ("Ett|tt|xtt|ttL", 2, "unknown symbol 'x'"),
        ("Ett|tt|tt|tt|L", 2, "has 5 virtual stages"),
        ("Ett|ttttttL", 2, "has 2 virtual stages ('|'-separated parts); must be pp * vpp (2 * 2 = 4)"),
        ("Ett|tt|tt|tL", 2, "holds 7 transformer layers (t); model.num_layers is 8"),
        ("ttt|Ett|tt|L", 2, "needs exactly one E, the first symbol of the first virtual stage"),
        ("Ett|Ett|tt|ttL", 2, "needs exactly one E"),
        ("Ett|tt|ttL|tt", 2, "needs exactly one L, the last symbol of the last virtual stage"),
        ("Ett|tt|tt|ttmL", 2, "holds 1 MTP layers (m); model.mtp_num_layers is 0"),
        ("t*999999|L", 1, f"over the {MAX_EXPANDED_SYMBOLS:,} a layout may hold"),
    ],
)
def test_each_layout_rule_is_refused_at_load(layout, vpp, expected):
    text = _problems(_scenario(pipeline_layout=layout, vpp=vpp))
    assert "parallel.pipeline_layout" in text and expected in text


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        # m in chunk 0 of rank 1 with vpp 2: Megatron requires a rank's last chunk
        ("Ett|ttm|tt|ttL", "places the MTP layers in virtual stage 1 (chunk 0 of pipeline rank 1)"),
        ("Ett|tt|ttm|tmtL", "spreads the MTP layers over virtual stages [2, 3]"),
        ("Ett|tt|tm|tttL", "places a transformer layer (t) after an MTP layer (m)"),
    ],
)
def test_mtp_rules(layout, expected):
    """Megatron-core `validate_layer_layout`: all m in one virtual stage, the last chunk of its
    rank, after every t."""
    data = _scenario(pipeline_layout=layout, vpp=2)
    data["model"]["mtp_num_layers"] = 1 if "spreads" not in expected else 2
    assert expected in _problems(data)


@pytest.mark.parametrize(
    "other",
    [
        {"first_pipeline_num_layers": 2},
        {"last_pipeline_num_layers": 2},
        {"account_for_embedding_in_pipeline_split": True},
        {"account_for_loss_in_pipeline_split": True},
        {"first_pipeline_num_layers": 2, "account_for_loss_in_pipeline_split": True},
    ],
)
def test_layout_refuses_the_other_split_keys(other):
    """TransformerConfig.__post_init__: 'pipeline_model_parallel_layout cannot be set with other
    pipeline layout arguments'."""
    text = _problems(_scenario(pipeline_layout="Ettt|tttttL", **other))
    key = next(iter(other))
    assert f"parallel.pipeline_layout: cannot be combined with parallel.{key}" in text


def test_parse_errors_are_layout_errors():
    with pytest.raises(LayoutError, match="unknown symbol ' '"):
        parse_layout("Et t|L")
    assert layout_problems(LayoutRequest("Ett|ttL", 4, 2)) == []
    assert split_problems(SplitRequest(4, 2, pipeline_layout="Ett|ttL")) == []


# ---- import-megatron / export-megatron ------------------------------------------------------

LAYOUT_LINE = (
    "--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --micro-batch-size 1 "
    "--global-batch-size 8 --world-size 4 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
    "--bf16"
)


def test_layout_round_trips_through_megatron_flags():
    """scenario -> flags -> scenario, `==`; the line holds the layout once, quoted for the
    shell, and no vpp flag (Megatron derives vpp 2 from the layout's 4 stages)."""
    scenario = parse_scenario(_scenario(pipeline_layout="Et|ttt|ttt,|tL", vpp=2), "s.yaml")
    line = to_megatron_args(scenario, 4)
    words = shlex.split(line)
    assert words[words.index("--pipeline-model-parallel-layout") + 1] == "Et|ttt|ttt,|tL"
    assert not [word for word in words if "virtual" in word]
    imported = parse_megatron_args(line, scenario.hardware, scenario.name)
    assert imported.validated() == scenario
    assert imported.not_modelled == () and imported.unknown == ()


def test_imported_layout_sets_vpp_from_its_stages():
    imported = parse_megatron_args(
        LAYOUT_LINE + " --pipeline-model-parallel-layout 'Ett|tt|tt|ttL'", "a100-sxm4-80gb"
    )
    scenario = imported.validated()
    assert scenario.parallel.vpp == 2 and scenario.parallel.pipeline_layout == "Ett|tt|tt|ttL"
    assert scenario.pipeline_split.chunk_layers == ((2, 2), (2, 2))


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            "--pipeline-model-parallel-layout 'Ett|tt|ttL' ",
            "has 3 stages, which must be divisible by --pipeline-model-parallel-size (2)",
        ),
        (
            "--pipeline-model-parallel-layout 'Ett|tt|tt|ttL' --num-virtual-stages-per-pipeline-rank 2",
            "cannot be combined with --num-virtual-stages-per-pipeline-rank",
        ),
        ("--pipeline-model-parallel-layout 'Ett|ttq'", "unknown symbol 'q'"),
    ],
)
def test_imported_layout_errors(extra, expected):
    with pytest.raises(ConfigError, match=re.escape(expected)):
        parse_megatron_args(f"{LAYOUT_LINE} {extra}", "a100-sxm4-80gb").validated()
