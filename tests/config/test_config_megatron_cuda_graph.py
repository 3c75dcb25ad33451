"""`training.cuda_graph_impl` from and to Megatron-LM's CUDA-graph flags
(megatron/training/arguments.py::validate_args and transformer_config.py `cuda_graph_impl`)."""

import pytest

from simcluster.config import ConfigError
from simcluster.config.megatron_args import parse_megatron_args, to_megatron_args

BASE = (
    "pretrain_gpt.py --bf16 --num-layers 4 --hidden-size 1024 --num-attention-heads 16 "
    "--seq-length 1024 --micro-batch-size 1 --attention-backend flash --vocab-size 32000 "
)


def _imported(flags: str):
    return parse_megatron_args(BASE + flags, "h100-sxm5-80gb", "s")


@pytest.mark.parametrize(
    ("flags", "impl"),
    [
        ("", "none"),
        ("--cuda-graph-impl local", "local"),
        ("--cuda-graph-impl transformer_engine", "transformer_engine"),
        ("--cuda-graph-impl full_iteration", "full_iteration"),
        ("--enable-cuda-graph", "local"),  # deprecated spelling of local
        ("--external-cuda-graph", "transformer_engine"),  # deprecated spelling of transformer_engine
        ("--enable-cuda-graph --cuda-graph-scope full_iteration", "full_iteration"),  # migrated
        ("--cuda-graph-impl local --cuda-graph-modules full_iteration", "full_iteration"),
        ("--external-cuda-graph --cuda-graph-scope full", "transformer_engine"),  # whole layer
    ],
)
def test_every_spelling_imports_to_its_impl(flags, impl):
    imported = _imported(flags)
    assert imported.validated().training.cuda_graph_impl.value == impl
    assert not imported.unknown


def test_a_partial_capture_is_the_scope_key():
    """attn-only capture is training.cuda_graph_scope [attn]; a module the simulator has no
    layer for (mamba) is listed as not modelled and left out; export writes the scope back."""
    imported = _imported("--external-cuda-graph --cuda-graph-scope attn mamba")
    scenario = imported.validated()
    assert scenario.training.cuda_graph_impl.value == "transformer_engine"
    assert [s.value for s in scenario.training.cuda_graph_scope] == ["attn"]
    assert any(
        line.startswith("--cuda-graph-scope attn mamba: CUDA-graph capture of mamba")
        for line in imported.not_modelled
    )
    assert "--cuda-graph-modules attn" in to_megatron_args(scenario)
    again = _imported("--cuda-graph-impl local --cuda-graph-modules attn").validated()
    assert again.training.cuda_graph_scope == scenario.training.cuda_graph_scope


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--enable-cuda-graph --external-cuda-graph", "give one of them"),
        ("--cuda-graph-impl local --enable-cuda-graph", "give one of them"),
        ("--cuda-graph-impl graphs", "allowed: none, local, transformer_engine, full_iteration"),
    ],
)
def test_conflicting_or_unknown_flags_are_errors(flags, message):
    with pytest.raises(ConfigError, match=message):
        _imported(flags)


@pytest.mark.parametrize("impl", ["local", "transformer_engine", "full_iteration"])
def test_export_writes_the_current_flag_and_reads_back(impl):
    scenario = _imported(f"--cuda-graph-impl {impl}").validated()
    line = to_megatron_args(scenario)
    assert f"--cuda-graph-impl {impl}" in line
    assert parse_megatron_args(line, scenario.hardware, scenario.name).validated() == scenario
    plain = _imported("").validated()
    assert "cuda-graph" not in to_megatron_args(plain)
