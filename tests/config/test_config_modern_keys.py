"""Issue 11's scenario contract: the new keys default to today's layer, follow Megatron-core's
rules, and are refused (not silently ignored) while the simulator does not price them."""

import pytest

from simcluster.config import parse_scenario
from simcluster.config.scenario import NOT_MODELLED_YET
from tests.config.scenario_cases import BASE
from tests.config.scenario_cases import refusal as _problems
from tests.config.scenario_cases import with_changes as _with


def test_defaults_describe_the_papers_layer():
    """Leaving every new key out gives MHA, GeLU, LayerNorm, learned positions, tied
    embeddings, no cp, even pipeline splits, unfused attention, no overlaps."""
    scenario = parse_scenario(BASE, "s.yaml")
    m, par, tr = scenario.model, scenario.parallel, scenario.training
    assert m.query_groups == 8
    assert (m.activation.value, m.normalization.value, m.position_embedding.value) == (
        "gelu",
        "layernorm",
        "learned",
    )
    assert not m.untie_embeddings_and_output_weights
    assert par.cp == 1 and par.first_pipeline_num_layers is None
    assert tr.attention_backend.value == "unfused"
    assert not tr.overlap_param_gather and not tr.tp_comm_overlap
    assert scenario.num_gpus == 2 * 2 * 1


def test_query_groups_must_divide_the_heads():
    assert "model.num_query_groups: value 3: must divide num_attention_heads (8)" in _problems(
        _with("model", num_query_groups=3)
    )


def test_tp_must_divide_the_query_groups_as_megatron_core_asserts():
    message = _problems(_with("model", num_query_groups=1))
    assert "parallel.tp: value 2: must divide num_query_groups (1)" in message
    assert "Megatron-core" in message


def test_context_parallel_needs_two_chunks_per_rank():
    message = _problems(_with("model", seq_length=130) | {"parallel": {"tp": 2, "pp": 2, "cp": 2}})
    assert "model.seq_length: value 130: must be divisible by 2 * cp (4)" in message


def test_overlaps_need_their_prerequisites():
    assert "training.tp_comm_overlap: value True: needs parallel.sequence_parallel" in _problems(
        _with("training", tp_comm_overlap=True)
    )
    message = _problems(_with("training", overlap_param_gather=True))
    assert "needs training.use_distributed_optimizer" in message


def test_tp_comm_overlap_is_a_no_op_at_tp_1():
    """NeMo's MegatronCommOverlapCallback turns TP comm overlap off below TP 2, so a recipe's
    default switch loads at tp = 1 (there is nothing to overlap); at tp 2 without SP it is
    still refused, as Megatron asserts."""
    data = _with("parallel", tp=1, dp=4) | {"training": {**BASE["training"], "tp_comm_overlap": True}}
    scenario = parse_scenario(data, "s.yaml")
    assert scenario.training.tp_comm_overlap and not scenario.tp_comm_overlap_active


def test_uneven_split_flags_do_not_combine():
    data = _with("parallel", account_for_loss_in_pipeline_split=True, last_pipeline_num_layers=2)
    assert "cannot be combined" in _problems(data)


@pytest.mark.parametrize("key", sorted(NOT_MODELLED_YET))
def test_a_key_not_priced_yet_is_refused_by_name(key):
    """No key is accepted and then ignored: until its pricing lands, a non-default value of a
    key listed in NOT_MODELLED_YET is one clear error naming it."""
    values = {
        "model.num_query_groups": 2,
        "model.activation": "swiglu",
        "model.normalization": "rmsnorm",
        "model.position_embedding": "rope",
        "model.untie_embeddings_and_output_weights": True,
        "parallel.cp": 2,
        "parallel.account_for_embedding_in_pipeline_split": True,
        "parallel.account_for_loss_in_pipeline_split": True,
        "parallel.first_pipeline_num_layers": 4,
        "parallel.last_pipeline_num_layers": 4,
        "training.dtype": "fp8",
        "training.attention_backend": "flash",
        "training.overlap_param_gather": True,
        "training.tp_comm_overlap": True,
    }
    # what a key needs beside it to pass Megatron's own rules
    companions: dict[str, tuple[str, dict]] = {
    }
    section, field = key.split(".")
    data = _with(section, **{field: values[key]})
    if key in companions:
        data[companions[key][0]].update(companions[key][1])
    data["parallel"]["sequence_parallel"] = True
    data["training"]["use_distributed_optimizer"] = True
    assert f"{key}: value" in _problems(data)
    assert "not modelled" in _problems(data)


def test_every_key_of_the_contract_is_priced_now():
    """cp, the uneven splits, FP8 and both overlaps (issue 11), kv_channels, MLA, MTP,
    windows and recompute_modules (issue 18) have landed: nothing is refused as not modelled
    (the parametrized refusal test above has no key left to check)."""
    assert NOT_MODELLED_YET == {}
    data = _with("parallel", cp=2, sequence_parallel=True)
    data["training"].update(
        dtype="fp8",
        attention_backend="flash",
        tp_comm_overlap=True,
        use_distributed_optimizer=True,
        overlap_grad_reduce=True,
        overlap_param_gather=True,
    )
    scenario = parse_scenario(data, "s.yaml")
    assert scenario.parallel.cp == 2 and scenario.training.dtype.value == "fp8"
    assert scenario.training.tp_comm_overlap and scenario.training.overlap_param_gather


def test_the_documented_contract_block_lists_every_scenario_key_with_its_default():
    """docs/scenario.md's commented scenario block is the contract users read: it names every
    key of every section (issue 11's parallel keys were missing from it), and each optional key
    it shows with a value equal to the key's default where the comment says it is optional."""
    import yaml

    from simcluster.config.scenario import ModelSpec, ParallelSpec, Scenario, TrainingSpec
    from tests.paths import ROOT

    text = (ROOT / "docs" / "scenario.md").read_text(encoding="utf-8")
    start = text.index("## The file, with comments")
    opening = text.index("```yaml", start) + len("```yaml")
    block = text[opening : text.index("```", opening)]
    shown = yaml.safe_load(block)
    assert set(shown) == set(Scenario.model_fields)
    for section, model in (("model", ModelSpec), ("parallel", ParallelSpec), ("training", TrainingSpec)):
        assert set(shown[section]) == set(model.model_fields), section
    for key in ParallelSpec.model_fields:
        if key not in ("tp", "pp", "vpp", "sequence_parallel"):  # the example's own layout
            assert shown["parallel"][key] == ParallelSpec.model_fields[key].default, key
