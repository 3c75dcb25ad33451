"""What each FP8 scaling recipe (`training.fp8_recipe`) costs: current scaling's amax work
is priced op by op, and only delayed scaling reduces the amaxes once per pass."""

import pytest
import yaml

from simcluster.config import ConfigError, parse_scenario
from simcluster.config.choices import Dtype
from simcluster.config.hardware import load_hardware
from simcluster.config.scenario import require_hardware_fits
from simcluster.costs.chunk import op_time_s, price_layer_ops
from simcluster.costs.network import GroupPlacement
from simcluster.simulation import amax_group, run_simulation
from simcluster.workload.layer import layer_ops
from simcluster.workload.layer_config import LayerConfig
from simcluster.workload.ops import OpKind

H100 = load_hardware("h100-sxm5-80gb")
TP2 = GroupPlacement(num_ranks=2, ranks_per_node=8)
LAYER = {
    "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 4096, "micro_batch_size": 1,
    "ffn_hidden_size": 14336, "num_query_groups": 8, "activation": "swiglu", "normalization": "rmsnorm",
    "position_embedding": "rope", "attention_backend": "flash", "hidden_dropout": 0.0,
    "attention_dropout": 0.0, "dtype": "fp8", "tp": 2, "sequence_parallel": True,
}  # fmt: skip


@pytest.mark.parametrize("userbuffers", [False, True])
def test_current_scaling_costs_exactly_its_added_ops(userbuffers):
    """Tensorwise minus delayed = the amax and scale kernels (compute) plus the blocking TP
    amax all-reduces (comm), with or without TE userbuffers: the GEMMs, casts and overlaps
    of the delayed layer are priced as before."""
    delayed = layer_ops(LayerConfig(**LAYER))
    current = layer_ops(LayerConfig(**LAYER, fp8_recipe="tensorwise"))
    for part in ("forward", "backward"):
        added = [op for op in getattr(current, part) if op not in getattr(delayed, part)]
        kernels = sum(op_time_s(op, H100, TP2, Dtype.FP8) for op in added if op.kind is OpKind.ELEMENTWISE)
        reduces = sum(op_time_s(op, H100, TP2, Dtype.FP8) for op in added if op.kind is OpKind.COLLECTIVE)
        assert kernels > 0 and reduces > 0
        before = getattr(price_layer_ops(delayed, H100, TP2, Dtype.FP8, tp_comm_overlap=userbuffers), part)
        after = getattr(price_layer_ops(current, H100, TP2, Dtype.FP8, tp_comm_overlap=userbuffers), part)
        assert after.compute_s - before.compute_s == pytest.approx(kernels)
        assert after.comm_s - before.comm_s == pytest.approx(reduces)


LLAMA3_8B = {
    "hardware": "h100-sxm5-80gb",
    "model": {
        "num_layers": 4, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 8192,
        "vocab_size": 128256, "ffn_hidden_size": 14336, "num_query_groups": 8, "activation": "swiglu",
        "normalization": "rmsnorm", "position_embedding": "rope",
        "untie_embeddings_and_output_weights": True, "hidden_dropout": 0.0, "attention_dropout": 0.0,
    },
    "parallel": {"tp": 2, "pp": 1, "dp": 4, "sequence_parallel": True},
    "training": {
        "micro_batch_size": 1, "global_batch_size": 16, "attention_backend": "flash", "dtype": "fp8",
        "use_distributed_optimizer": True,
    },
}  # fmt: skip


def _scenario(hardware="h100-sxm5-80gb", **training):
    data = yaml.safe_load(yaml.safe_dump(LLAMA3_8B))
    data["hardware"] = hardware
    data["training"].update(training)
    return parse_scenario(data, "recipe.yaml")


def test_only_delayed_scaling_reduces_amaxes_once_per_pass():
    """Delayed scaling all-reduces every amax over TP×DP×CP at the end of each autocast pass;
    current scaling and MXFP8 take each scale from the tensor itself (no such reduction),
    and bf16 has no amax at all."""
    assert amax_group(_scenario(), H100) is not None
    assert amax_group(_scenario(fp8_recipe="tensorwise"), H100) is None
    assert amax_group(_scenario(fp8_recipe="mxfp8"), load_hardware("b200-sxm-180gb")) is None
    assert amax_group(_scenario(dtype="bf16"), H100) is None


def test_recipes_run_end_to_end_and_current_scaling_is_the_slower_on_hopper():
    delayed = run_simulation(_scenario(), H100).result.iteration_time_s
    current = run_simulation(_scenario(fp8_recipe="tensorwise"), H100).result.iteration_time_s
    assert current > delayed
    b200 = load_hardware("b200-sxm-180gb")
    mx = run_simulation(_scenario("b200-sxm-180gb", fp8_recipe="mxfp8"), b200).result
    assert mx.iteration_time_s > 0


def test_recipe_errors_name_the_key_and_what_is_allowed():
    """MXFP8 needs Blackwell's block-scaled tensor cores (TE `check_mxfp8_support`); any
    recipe other than the default needs dtype fp8; an unknown recipe lists the choices."""
    with pytest.raises(
        ConfigError, match="fp8_recipe: value mxfp8: .*'h100-sxm5-80gb'.*allowed here: delayed"
    ):
        require_hardware_fits(_scenario(fp8_recipe="mxfp8"), H100)
    with pytest.raises(ConfigError, match="fp8_recipe: value tensorwise: needs training.dtype fp8"):
        _scenario(dtype="bf16", fp8_recipe="tensorwise")
    with pytest.raises(ConfigError, match="'delayed', 'tensorwise' or 'mxfp8'"):
        _scenario(fp8_recipe="blockwise")
