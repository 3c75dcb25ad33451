"""Megatron-core's uneven pipeline splits (`get_num_layers_to_build`): the layers each stage and chunk
builds, by hand, and the loader's refusals, one per rule."""

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from simcluster.config import parse_scenario
from simcluster.config.pipeline_split import SplitRequest, pipeline_split, split_problems
from tests.config.scenario_cases import BASE
from tests.config.scenario_cases import refusal as _problems


def _scenario(num_layers: int, **parallel):
    data = yaml.safe_load(yaml.safe_dump(BASE))
    data["model"]["num_layers"] = num_layers
    data["parallel"].update(parallel)
    return data


def test_llama3_405b_with_both_account_for_flags():
    """126 layers, pp 16, vpp 8: the split counts 126 + 2 = 128 = 16·8 slots, one per chunk;
    PP rank 0's first chunk holds the embedding and no layer, the last rank's last chunk the
    loss and no layer. Stages: 7, 8 × 14, 7."""
    split = pipeline_split(SplitRequest(126, 16, 8, account_for_embedding=True, account_for_loss=True))
    assert split.chunk_layers[0] == (0, 1, 1, 1, 1, 1, 1, 1)
    assert split.chunk_layers[15] == (1, 1, 1, 1, 1, 1, 1, 0)
    assert all(split.chunk_layers[r] == (1,) * 8 for r in range(1, 15))
    assert split.stage_layers == (7,) + (8,) * 14 + (7,)
    assert split.num_layers == 126
    # Without VPP the same flags give the same stage sizes: (126 + 2) / 16 = 8, minus one each end.
    plain = pipeline_split(SplitRequest(126, 16, account_for_embedding=True, account_for_loss=True))
    assert plain.chunk_layers == tuple((n,) for n in (7,) + (8,) * 14 + (7,))


def test_embedding_only_offsets_follow_get_transformer_layer_offset():
    """L 7, p 2, v 2, embedding counted: (7 + 1)/4 = 2 per chunk, rank 0's first chunk 1.
    Offsets: virtual stage order [0]=1 layer, [1]=2, [2]=2, [3]=2 → 0, 1, 3, 5; Megatron:
    vp·(8/2) + r·2 − 1 for every chunk but the first (`get_transformer_layer_offset`)."""
    split = pipeline_split(SplitRequest(7, 2, 2, account_for_embedding=True))
    assert split.chunk_layers == ((1, 2), (2, 2))
    offsets = {(r, c): split.layer_offset(r, c) for r in range(2) for c in range(2)}
    assert offsets == {(0, 0): 0, (1, 0): 1, (0, 1): 3, (1, 1): 5}
    assert all(offsets[r, c] == c * 4 + r * 2 - 1 for r, c in offsets if (r, c) != (0, 0))


def test_loss_only_without_vpp():
    """L 15, p 4, loss counted: 16/4 = 4 per stage, the last builds 3."""
    assert pipeline_split(SplitRequest(15, 4, account_for_loss=True)).stage_layers == (4, 4, 4, 3)


def test_explicit_first_and_last_stage_with_vpp():
    """L 30, p 4, v 2, F 6, Lₗ 8: middle 16 layers over 2 stages = 8 each; per chunk F/v 3,
    8/2 4, Lₗ/v 4. Offsets match Megatron's vp·(F/v + middle/v + Lₗ/v) + F/v + r′·(middle/v)/2
    with r′ = r − 1: rank 2 chunk 1 → 15 + 3 + 4 = 22."""
    split = pipeline_split(SplitRequest(30, 4, 2, first_pipeline_num_layers=6, last_pipeline_num_layers=8))
    assert split.chunk_layers == ((3, 3), (4, 4), (4, 4), (4, 4))
    for r in range(1, 4):
        for c in range(2):
            assert split.layer_offset(r, c) == c * (3 + 8 + 4) + 3 + (r - 1) * (8 // 2)


def test_explicit_first_stage_only():
    """L 10, p 3, F 2: the other two stages take 4 each."""
    assert pipeline_split(SplitRequest(10, 3, first_pipeline_num_layers=2)).stage_layers == (2, 4, 4)
    assert pipeline_split(SplitRequest(10, 3, last_pipeline_num_layers=4)).stage_layers == (3, 3, 4)


@given(
    pp=st.integers(1, 8),
    vpp=st.integers(1, 4),
    per_chunk=st.integers(1, 6),
)
def test_default_split_is_the_even_one(pp, vpp, per_chunk):
    """No flag: every chunk builds L/(p·v), as before this change (results bit-identical)."""
    L = pp * vpp * per_chunk
    split = pipeline_split(SplitRequest(L, pp, vpp))
    assert split.chunk_layers == ((per_chunk,) * vpp,) * pp
    assert [split.layer_offset(r, c) for c in range(vpp) for r in range(pp)] == list(range(0, L, per_chunk))


@given(
    pp=st.integers(1, 8),
    vpp=st.integers(1, 4),
    per_chunk=st.integers(1, 4),
    embedding=st.booleans(),
    loss=st.booleans(),
)
def test_account_for_splits_keep_every_layer_once(pp, vpp, per_chunk, embedding, loss):
    """(L + e + l) = p·v·k: every layer is built exactly once and offsets are contiguous."""
    L = pp * vpp * per_chunk - int(embedding) - int(loss)
    request = SplitRequest(L, pp, vpp, account_for_embedding=embedding, account_for_loss=loss)
    if embedding and loss and pp * vpp == 1 and per_chunk == 1:
        assert split_problems(request)  # one slot for both: Megatron's "Not enough layers"
        return
    split = pipeline_split(request)
    assert split.num_layers == L
    virtual = [(r, c) for c in range(vpp) for r in range(pp)]
    for (r, c), (r2, c2) in zip(virtual, virtual[1:]):
        assert split.layer_offset(r2, c2) == split.layer_offset(r, c) + split.chunk_layers[r][c]


def test_loader_keeps_the_default_rule_and_message():
    assert "model.num_layers: value 9: must be divisible by pp * vpp (2 * 1 = 2)" in _problems(_scenario(9))


def test_loader_counts_the_account_for_layers():
    """126 layers on pp 16 × vpp 8 is valid only with both flags (128 slots)."""
    flags = {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}
    data = _scenario(126, pp=16, vpp=8, **flags)
    data["training"]["global_batch_size"] = 16
    scenario = parse_scenario(data, "s.yaml")
    assert scenario.pipeline_split.stage_layers == (7,) + (8,) * 14 + (7,)
    data["parallel"]["account_for_loss_in_pipeline_split"] = False
    message = _problems(data)
    assert "model.num_layers: value 126: the split counts 126 + 1 for account_for_embedding" in message
    assert "= 127 layers, which must be divisible by pp * vpp (16 * 8 = 128)" in message
    assert "must be divisible by pp * vpp (16 * 8 = 128)" in _problems(
        _scenario(126, pp=16, vpp=8) | {"training": {"micro_batch_size": 1, "global_batch_size": 16}}
    )


@pytest.mark.parametrize(
    ("num_layers", "parallel", "expected"),
    [
        (
            12,
            {"pp": 4, "vpp": 2, "first_pipeline_num_layers": 3},
            "parallel.first_pipeline_num_layers: value 3: must be divisible by vpp (2)",
        ),
        (
            12,
            {"pp": 4, "vpp": 2, "last_pipeline_num_layers": 1},
            "parallel.last_pipeline_num_layers: value 1: must be divisible by vpp (2)",
        ),
        (
            11,
            {"pp": 4, "first_pipeline_num_layers": 3},
            "leaves 8 layers for the 3 middle stages, which must divide them evenly",
        ),
        (
            8,
            {"pp": 2, "first_pipeline_num_layers": 3, "last_pipeline_num_layers": 3},
            "leaves 2 layers for 0 middle stages",
        ),
        (
            4,
            {"pp": 2, "first_pipeline_num_layers": 3, "last_pipeline_num_layers": 3},
            "fewer than first_pipeline_num_layers + last_pipeline_num_layers (6)",
        ),
        (
            14,
            {"pp": 3, "vpp": 2, "first_pipeline_num_layers": 4},
            "parallel.vpp: value 2: must divide the 5 layers of each middle stage",
        ),
        (
            8,
            {"pp": 1, "first_pipeline_num_layers": 8},
            "parallel.first_pipeline_num_layers: value 8: needs pp > 1",
        ),
    ],
)
def test_loader_refuses_explicit_splits_megatron_refuses(num_layers, parallel, expected):
    data = _scenario(num_layers, **parallel)
    data["training"]["global_batch_size"] = 8 * parallel["pp"]
    assert expected in _problems(data)


def test_explicit_split_loads_and_is_used():
    data = _scenario(10, pp=3, first_pipeline_num_layers=2)
    data["training"]["global_batch_size"] = 6
    assert parse_scenario(data, "s.yaml").pipeline_split.stage_layers == (2, 4, 4)


def test_mixed_kinds_report_only_the_exclusion():
    data = _scenario(9, account_for_loss_in_pipeline_split=True, last_pipeline_num_layers=2)
    message = _problems(data)
    assert "cannot be combined" in message
    assert "model.num_layers" not in message
