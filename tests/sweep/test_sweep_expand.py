"""Expansion: product() over the axes, filtered by the scenario loader's own rules."""

from __future__ import annotations

from sweep_cases import SMALL_AXES, SMALL_NUM_VALID

from simcluster.sweep import config_id, expand, load_sweep_spec


def test_small_spec_counts(write_sweep):
    """32 combinations: 18 valid; sp with tp = 1 and vpp > 1 with pp = 1 are filtered."""
    expansion = expand(load_sweep_spec(write_sweep()))
    assert expansion.num_combinations == 32
    assert len(expansion.configs) == SMALL_NUM_VALID
    assert len(expansion.invalid) == 14
    assert expansion.invalid_by_field() == {"parallel.sequence_parallel": 8, "parallel.vpp": 8}
    assert not any(c.layout["sequence_parallel"] and c.layout["tp"] == 1 for c in expansion.configs)
    assert not any(c.layout["vpp"] > 1 and c.layout["pp"] == 1 for c in expansion.configs)


def test_dp_follows_from_num_gpus_and_must_divide(write_sweep):
    """dp = 4 / (tp · pp); tp · pp = 8 does not divide 4 GPUs and is filtered."""
    expansion = expand(load_sweep_spec(write_sweep({"tp": [1, 2, 4], "pp": [1, 2]})))
    layouts = {(c.layout["tp"], c.layout["pp"], c.layout["dp"]) for c in expansion.configs}
    assert layouts == {(1, 1, 4), (1, 2, 2), (2, 1, 2), (2, 2, 1), (4, 1, 1)}
    assert expansion.invalid_by_field() == {"num_gpus": 1}
    assert all(c.scenario.num_gpus == 4 for c in expansion.configs)


def test_loader_rules_filter_with_their_reasons(write_sweep):
    """micro_batch_size 3 does not divide the global batch 8: the loader's message is kept."""
    expansion = expand(load_sweep_spec(write_sweep({"tp": [1], "micro_batch_size": [1, 3]})))
    assert [c.layout["micro_batch_size"] for c in expansion.configs] == [1]
    (key, problems), *_ = expansion.invalid
    assert "micro_batch_size=3" in key
    assert problems[0].startswith("training.global_batch_size: value 8: must be a multiple of")


def test_unnamed_axes_keep_the_base_values(write_sweep):
    """Only tp is swept: every other field is the base scenario's."""
    (config, *_) = expand(load_sweep_spec(write_sweep({"tp": [2]}))).configs
    assert config.scenario.training.global_batch_size == 8
    assert config.layout == {
        "tp": 2, "pp": 1, "dp": 2, "vpp": 1, "micro_batch_size": 1, "global_batch_size": 8,
        "sequence_parallel": False, "recompute": "none", "schedule": "1f1b", "dtype": "bf16",
        "overlap_grad_reduce": False, "use_distributed_optimizer": False,
        "seq_length": 1024, "hardware": "gpu.yaml", "ep": 1, "etp": None, "model": "tiny",
    }  # fmt: skip


def test_config_id_is_the_full_layout_in_a_fixed_order(write_sweep):
    """The id names every layout field, so the same layout from another spec has the same id."""
    a = expand(load_sweep_spec(write_sweep({"tp": [2], "recompute": ["none"]}))).configs[0]
    b = expand(load_sweep_spec(write_sweep({"recompute": ["none"], "tp": [2], "pp": [1]}))).configs[0]
    assert a.config_id == b.config_id == config_id(a.layout)
    assert a.config_id.startswith("tp=2,pp=1,dp=2,vpp=1,micro_batch_size=1,")
    assert "sequence_parallel=false" in a.config_id
    assert set(SMALL_AXES) <= {part.split("=")[0] for part in a.config_id.split(",")}
