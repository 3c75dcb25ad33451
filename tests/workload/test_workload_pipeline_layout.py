"""`parallel.pipeline_layout` in the workload: each chunk builds the layers its virtual stage
names, the MTP layers (and their parameters, word-embedding copy and tied reduction) sit on
the stage the layout names, and a layout equal to a split the other keys give changes nothing."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcluster.config import load_hardware
from simcluster.config.scenario import parse_scenario
from simcluster.simulation import run_simulation
from simcluster.workload.embedding import output_ops
from simcluster.workload.model import build_workload
from simcluster.workload.mtp import mtp_extra_ops, mtp_head_ops, mtp_stage_ops, with_mtp
from tests.workload.test_mla_layer import SMALL as MLA_SMALL
from tests.workload.test_mla_layer import _data

HW = load_hardware("h100-sxm5-80gb")

# test_mla_layer's small DeepSeek-V3-shaped model (MLA, MoE after one dense layer, one MTP
# layer, untied output) on four pipeline stages
SMALL = MLA_SMALL | {"parallel.pp": 4}
STANDALONE = "Ett|ttt|tm|L"  # rank 2 runs the MTP layer, rank 3 only the loss
COLOCATED = "Ett|ttt|t|mL"  # the same decoder layers, MTP with the loss


def _scenario(**changes):
    return parse_scenario(_data(**changes), "s.yaml")


def _small(**changes):
    return _scenario(**(SMALL | changes))


def _result(scenario) -> dict:
    result = run_simulation(scenario, HW).result.to_json_dict()
    result.pop("scenario", None)
    return result


def test_even_layout_gives_the_default_results():
    """pp 2: "Ettt|tttmL" is Megatron's even split (3 layers a stage, MTP and loss last):
    the same workload and the same results, ==."""
    plain = _small(**{"parallel.pp": 2, "parallel.dp": 8})
    layout = _small(**{"parallel.pp": 2, "parallel.dp": 8, "parallel.pipeline_layout": "Ettt|tttmL"})
    assert layout.pipeline_split == plain.pipeline_split
    assert _fields(build_workload(layout)) == _fields(build_workload(plain))
    assert _result(layout) == _result(plain)


def test_even_layout_with_vpp_on_a_dense_model():
    """A dense model (no MTP), pp 2 vpp 2: "Ett|tt|tt|ttL" is the default 2 layers a chunk."""
    changes = {
        "model.moe": None,
        "model.mla": None,
        "model.mtp_num_layers": 0,
        "parallel.ep": None,
        "parallel.etp": None,
    }
    changes |= {"parallel.pp": 2, "parallel.vpp": 2, "parallel.dp": 8, "model.num_layers": 8}
    plain = _small(**changes)
    layout = _small(**changes, **{"parallel.pipeline_layout": "Ett|tt|tt|ttL"})
    assert _result(layout) == _result(plain)


def _fields(workload):
    """A workload's fields after its scenario (which differs only in the layout key)."""
    return (workload.layer_config, workload.layer, workload.stages, workload.p2p_bytes, workload.layer_kind)


def test_layout_equal_to_first_and_last_stage_sizes():
    """pp 3, first 1, last 1: the middle stage holds 4 layers; "Et|tttt|tmL" says the same."""
    keys = _small(
        **{"parallel.pp": 3, "parallel.first_pipeline_num_layers": 1, "parallel.last_pipeline_num_layers": 1}
    )
    layout = _small(**{"parallel.pp": 3, "parallel.pipeline_layout": "Et|tttt|tmL"})
    assert layout.pipeline_split == keys.pipeline_split
    assert _result(layout) == _result(keys)


def test_standalone_mtp_stage_runs_the_mtp_layer_and_the_loss_stage_its_logits():
    """Rank 2 runs one decoder layer, the MTP layer (a MoE layer's segment) and the MTP
    embedding / norms / eh_proj; rank 3 no layer, the output layer and the MTP depth's logits
    and loss. Together they run exactly the ops the colocated MTP runs on one stage."""
    scenario = _small(**{"parallel.pipeline_layout": STANDALONE})
    work = build_workload(scenario)
    cfg, vocab = work.layer_config, scenario.model.vocab_size
    mtp_chunk, loss_chunk = work.stages[2].chunks[0], work.stages[3].chunks[0]
    assert [seg.num_layers for seg in mtp_chunk.segments] == [1, 1]
    assert all(seg.kind.moe is not None for seg in mtp_chunk.segments)
    assert mtp_chunk.output == mtp_stage_ops(cfg, vocab, 1)
    assert loss_chunk.num_layers == 0
    assert loss_chunk.output == with_mtp(output_ops(cfg, vocab), mtp_head_ops(cfg, vocab, 1))
    assert [stage.chunks[0].num_layers for stage in work.stages] == [2, 3, 2, 0]
    assert work.stages[0].chunks[0].embedding is not None
    assert all(stage.chunks[0].embedding is None for stage in work.stages[1:])
    # the colocated MTP's extra ops, split between the two stages
    split = mtp_stage_ops(cfg, vocab, 1).forward + mtp_head_ops(cfg, vocab, 1).forward
    assert Counter(split) == Counter(mtp_extra_ops(cfg, vocab, 1).forward)
    split_b = mtp_stage_ops(cfg, vocab, 1).backward + mtp_head_ops(cfg, vocab, 1).backward
    assert Counter(split_b) == Counter(mtp_extra_ops(cfg, vocab, 1).backward)


def test_standalone_mtp_moves_its_parameters_and_word_embedding_copy():
    """Untied output (DeepSeek-V3): colocated, rank 3 holds the output weight and the MTP's
    word-embedding copy; standalone, rank 2 holds the copy and the MTP layer, rank 3 the output
    weight alone. The model's parameters are the same; the tied reduction joins rank 0 with the
    MTP rank (Megatron: the MTP stage's embedding is tied to the first stage's)."""
    standalone = build_workload(_small(**{"parallel.pipeline_layout": STANDALONE}))
    colocated = build_workload(_small(**{"parallel.pipeline_layout": COLOCATED}))
    assert sum(s.num_params for s in standalone.stages) == pytest.approx(
        sum(s.num_params for s in colocated.stages)
    )
    moved = standalone.stages[2].num_params - colocated.stages[2].num_params
    assert moved > 0
    assert colocated.stages[3].num_params - standalone.stages[3].num_params == pytest.approx(moved)
    assert standalone.stages[0].num_params == colocated.stages[0].num_params
    assert [s.embedding_grad_bytes > 0 for s in standalone.stages] == [True, False, True, False]
    assert [s.embedding_grad_bytes > 0 for s in colocated.stages] == [True, False, False, True]
    assert standalone.stages[2].static.weight_bytes > colocated.stages[2].static.weight_bytes


def test_standalone_mtp_stage_keeps_its_activations():
    """Rank 2's chunk stores its decoder layer's and the MTP layer's activations plus the MTP
    embedding / eh_proj inputs; rank 3's only the output layer's and MTP logits'."""
    scenario = _small(**{"parallel.pipeline_layout": STANDALONE})
    work = build_workload(scenario)
    mtp_chunk, loss_chunk = work.stages[2].chunks[0], work.stages[3].chunks[0]
    layers = sum(seg.num_layers * seg.layer.saved_bytes for seg in mtp_chunk.segments)
    assert mtp_chunk.saved_bytes == layers + mtp_chunk.output.saved_bytes
    assert loss_chunk.saved_bytes == loss_chunk.output.saved_bytes
    result = run_simulation(scenario, HW).result
    assert result.iteration_time_s > 0


@pytest.mark.parametrize(
    ("pp", "vpp", "dp", "layout", "mtp_stage"),
    [
        # Megatron-LM's DeepSeek-V3 test layout: MTP alone on rank 6's last chunk
        (8, 4, 64, "Et*3|(tt|)*29,m|L", (6, 3)),
        # Megatron-Bridge DeepSeek-V3 (pp, vp) = (4, 4): MTP with the loss
        (4, 4, 32, "Et*4|(t*4|)*14,tmL", (3, 3)),
    ],
)
def test_deepseek_v3_recipe_layouts(pp, vpp, dp, layout, mtp_stage):
    """The published layouts load on the shipped DeepSeek-V3 model and put the embedding on
    rank 0's first chunk, the MTP layer where the layout says and the loss on the last chunk of
    the last rank."""
    scenario = _scenario(
        **{
            "parallel.pp": pp,
            "parallel.vpp": vpp,
            "parallel.dp": dp,
            "parallel.first_pipeline_num_layers": None,
            "parallel.last_pipeline_num_layers": None,
            "parallel.pipeline_layout": layout,
            "training.global_batch_size": 8 * dp,
        }
    )
    work = build_workload(scenario)
    chunks = {(s.stage, c.chunk): c for s in work.stages for c in s.chunks}
    assert [key for key, c in chunks.items() if c.embedding is not None] == [(0, 0)]
    decoder_layers = sum(c.num_layers for c in chunks.values())
    assert decoder_layers == 61 + 1  # the MTP layer's transformer layer is a segment of its chunk
    mtp_rank, mtp_chunk = mtp_stage
    with_mtp_segment = [key for key, c in chunks.items() if any(seg.num_layers for seg in c.segments) and (
        c.num_layers > scenario.pipeline_split.chunk_layers[key[0]][key[1]])]  # fmt: skip
    assert with_mtp_segment == [mtp_stage]
    last = chunks[pp - 1, vpp - 1]
    assert last.output is not None and any(op.name.startswith("mtp0.") for op in last.output.forward)
    outputs = [key for key, c in chunks.items() if c.output is not None]
    assert outputs == sorted({mtp_stage, (pp - 1, vpp - 1)})
    assert any(op.name == "mtp0.mtp.eh_proj" for op in chunks[mtp_rank, mtp_chunk].output.forward)


def test_mtp_on_rank_zero_needs_no_embedding_copy_or_tied_reduction():
    """pp 2 without vpp, "Etttttt m|L" (Megatron accepts m in rank 0's last chunk): rank 0
    already holds the word embedding the MTP layer reads, so no copy and, the output layer being
    untied, no tied all-reduce anywhere; rank 1 runs the loss and the MTP logits alone."""
    scenario = _small(**{"parallel.pp": 2, "parallel.dp": 8, "parallel.pipeline_layout": "Et*6m|L"})
    work = build_workload(scenario)
    assert [c.num_layers for s in work.stages for c in s.chunks] == [7, 0]
    assert all(s.embedding_grad_bytes == 0 for s in work.stages)
    colocated = build_workload(
        _small(**{"parallel.pp": 2, "parallel.dp": 8, "parallel.pipeline_layout": "Et*6|mL"})
    )
    word_copy = 1024 * 512 / 2  # padded vocab (1024 already a multiple of 128 · tp) × h / tp
    total = sum(s.num_params for s in work.stages)
    assert sum(s.num_params for s in colocated.stages) - total == pytest.approx(word_copy)


def _layout_text(counts: list[int]) -> str:
    stages = [f"t*{n}" if n > 1 else "t" * n for n in counts]
    stages[0] = "E" + stages[0]
    stages[-1] += "L"
    return "|".join(stages)


@settings(max_examples=25, deadline=None)
@given(
    pp=st.sampled_from([2, 4]),
    vpp=st.sampled_from([1, 2]),
    cuts=st.lists(st.integers(0, 24), min_size=7, max_size=7),
)
def test_any_layout_moves_layers_without_changing_the_model(pp, vpp, cuts):
    """A dense model of 24 layers spread over pp·vpp stages at random (empty stages allowed):
    each chunk builds what its stage names, and the parameters summed over the stages are the
    default split's (layers move, none appears or vanishes)."""
    stages = pp * vpp
    bounds = sorted(cuts[: stages - 1])
    counts = [b - a for a, b in zip([0, *bounds], [*bounds, 24], strict=True)]
    changes = {"model.moe": None, "model.mla": None, "model.mtp_num_layers": 0, "parallel.ep": None}
    changes |= {"parallel.etp": None, "model.num_layers": 24, "parallel.pp": pp, "parallel.vpp": vpp}
    changes |= {"parallel.dp": 8 // pp, "training.global_batch_size": 16}
    plain = build_workload(_small(**changes))
    layout = build_workload(_small(**changes, **{"parallel.pipeline_layout": _layout_text(counts)}))
    built = [layout.stages[k % pp].chunks[k // pp].num_layers for k in range(stages)]
    assert built == counts
    assert sum(s.num_params for s in layout.stages) == pytest.approx(sum(s.num_params for s in plain.stages))
