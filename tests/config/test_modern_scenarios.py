"""scenarios/modern/: Llama 3 8B / 70B / 405B, Nemotron-4 340B and GPT-3 175B FP8 on H100.

Each file either loads, or is refused only because it sets keys the simulator does not price
yet (`NOT_MODELLED_YET`), with that message; every other rule holds. As keys get priced the
refusals shrink, and once none is left every file must load and name a known profile.
"""

from __future__ import annotations

import re

import pytest

from simcluster.config import ConfigError, load_scenario
from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import NOT_MODELLED_YET, NOT_MODELLED_YET_MESSAGE, unpriced_keys
from tests.paths import ROOT

MODERN = sorted((ROOT / "scenarios" / "modern").glob("*.yaml"))
REFUSAL = re.compile(
    rf"^(?P<key>[a-z_]+\.[a-z_0-9]+): value .*: {NOT_MODELLED_YET_MESSAGE}; leave it at its default$"
)


def test_the_five_modern_scenarios_are_shipped():
    assert [p.stem for p in MODERN] == [
        "gpt3-175b-h100-fp8",
        "llama3-405b-h100-16k",
        "llama3-70b-h100",
        "llama3-8b-h100",
        "nemotron4-340b-h100-fp8",
    ]


@pytest.mark.parametrize("path", MODERN, ids=lambda p: p.stem)
def test_loads_or_is_refused_only_for_keys_not_priced_yet(path):
    """Every rule but the refusal holds; the refusal names exactly the unpriced keys set."""
    scenario = load_scenario(path, refuse_unpriced=False)
    load_hardware(scenario.hardware, relative_to=path.parent)
    expected = unpriced_keys(scenario)
    try:
        load_scenario(path)
    except ConfigError as error:
        matches = [REFUSAL.match(problem) for problem in error.problems]
        assert all(matches), error.problems
        refused = [m["key"] for m in matches if m]
        assert refused == expected and set(refused) <= set(NOT_MODELLED_YET)
    else:
        assert expected == []


def test_llama3_405b_has_metas_published_layout():
    """Llama 3 paper Table 4: TP 8, CP 1, PP 16, DP 128 on 16,384 GPUs at sequence 8,192;
    126 layers with the embedding and loss counted as layers: 1 layer per chunk at vpp 8."""
    s = load_scenario(ROOT / "scenarios" / "modern" / "llama3-405b-h100-16k.yaml", refuse_unpriced=False)
    par = s.parallel
    assert (par.tp, par.cp, par.pp, par.dp, s.num_gpus) == (8, 1, 16, 128, 16384)
    assert s.model.seq_length == 8192 and s.model.num_layers == 126
    assert par.account_for_embedding_in_pipeline_split and par.account_for_loss_in_pipeline_split
    assert (s.model.num_layers + 2) // (par.pp * par.vpp) == 1
    assert s.training.global_batch_size * s.model.seq_length == 2048 * 8192  # 16M tokens


@pytest.mark.parametrize("path", MODERN, ids=lambda p: p.stem)
def test_recipe_defaults(path):
    """SP when tp > 1 (with TP comm overlap), flash attention, the distributed optimizer with
    both overlaps, no recompute; the vocabulary padded as Megatron pads it (128 · tp)."""
    s = load_scenario(path, refuse_unpriced=False)
    par, tr = s.parallel, s.training
    assert par.sequence_parallel == (par.tp > 1) == tr.tp_comm_overlap
    assert tr.attention_backend.value == "flash" and tr.recompute.value == "none"
    assert tr.use_distributed_optimizer and tr.overlap_grad_reduce and tr.overlap_param_gather
    assert s.model.vocab_size % (128 * par.tp) == 0
