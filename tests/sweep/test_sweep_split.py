"""pp / vpp in a sweep follow the pipeline split rules of the base's split flags (the same
`split_values` plan searches), and dp leaves room for the base's context parallelism."""

from __future__ import annotations

import yaml
from sweep_cases import TINY_SCENARIO

from simcluster.config.pipeline_split import SplitRequest, split_problems
from simcluster.sweep import expand, load_sweep_spec

FLAGS = {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}


def _spec(tmp_path, axes, num_gpus=16384, layers=126, **parallel):
    """A 126-layer base (Llama 3 405B's depth, tiny width) on `num_gpus` GPUs."""
    base = {
        **TINY_SCENARIO,
        "hardware": "h100-sxm5-80gb",
        "name": "deep",
        "model": {**TINY_SCENARIO["model"], "num_layers": layers},
        "parallel": {"tp": 1, "pp": 1, **parallel},
        "training": {"micro_batch_size": 1, "global_batch_size": 4096},
    }
    (tmp_path / "deep.yaml").write_text(yaml.safe_dump(base))
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": "deep.yaml", "num_gpus": num_gpus, "axes": axes}))
    return path


def test_auto_gives_the_uneven_split_values_with_the_account_for_flags(tmp_path):
    """(126 + 2) layers over pp · vpp: auto pp are the powers of two up to 64 (pp ≤ the layers),
    vpp 1, 2, 4, 8; pp 16 × vpp 8 is a valid configuration. Without the flags auto keeps the
    divisors of 126 (16 and 8 absent)."""
    spec = load_sweep_spec(_spec(tmp_path, {"tp": [8], "pp": "auto", "vpp": "auto"}, **FLAGS))
    assert spec.axes["pp"] == (1, 2, 4, 8, 16, 32, 64) and spec.axes["vpp"] == (1, 2, 4, 8)
    layouts = {(c.layout["pp"], c.layout["vpp"]) for c in expand(spec).configs}
    assert (16, 8) in layouts and (64, 2) in layouts
    for pp, vpp in layouts:
        request = SplitRequest(126, pp, vpp, account_for_embedding=True, account_for_loss=True)
        assert not split_problems(request)
    even = load_sweep_spec(_spec(tmp_path, {"pp": "auto", "vpp": "auto"}))
    assert even.axes["pp"] == (1, 2) and even.axes["vpp"] == (1, 2, 3, 6, 7)  # divisors of 126 and 16,384


def test_listed_values_the_split_refuses_are_invalid_with_the_rule(tmp_path):
    """pp [16, 32] × vpp [8]: with the flags 16 × 8 is valid and 32 × 8 (128 not divisible by
    256) is invalid, naming the counted layers; without the flags 16 × 8 is invalid too."""
    expansion = expand(load_sweep_spec(_spec(tmp_path, {"tp": [8], "pp": [16, 32], "vpp": [8]}, **FLAGS)))
    assert [(c.layout["pp"], c.layout["vpp"]) for c in expansion.configs] == [(16, 8)]
    (key, problems), *_ = expansion.invalid
    assert "pp=32" in key
    assert any("126 + 1 for account_for_embedding" in p and "= 128 layers" in p for p in problems)
    plain = expand(load_sweep_spec(_spec(tmp_path, {"tp": [8], "pp": [16], "vpp": [8]})))
    assert not plain.configs
    reasons = [problem for _, problems in plain.invalid for problem in problems]
    assert any("must be divisible by pp * vpp (16 * 8 = 128)" in problem for problem in reasons)


def test_dp_divides_by_the_bases_context_parallelism(tmp_path):
    """A base with cp 2 (flash attention) on 16 GPUs: dp = 16 / (tp · 2 · pp), every scenario
    uses exactly 16 GPUs, and tp · cp · pp that does not divide 16 is invalid, naming cp."""
    path = _spec(tmp_path, {"tp": [1, 2, 3], "pp": [1]}, num_gpus=16, layers=8, cp=2)
    data = yaml.safe_load((tmp_path / "deep.yaml").read_text())
    data["training"].update(attention_backend="flash", global_batch_size=64)
    (tmp_path / "deep.yaml").write_text(yaml.safe_dump(data))
    expansion = expand(load_sweep_spec(path))
    assert [(c.layout["tp"], c.layout["dp"]) for c in expansion.configs] == [(1, 8), (2, 4)]
    assert all(c.scenario.num_gpus == 16 and c.scenario.parallel.cp == 2 for c in expansion.configs)
    ((key, problems),) = expansion.invalid
    assert "tp=3" in key
    assert problems == ("num_gpus: value 16: not divisible by tp * cp * pp (3 * 2 * 1 = 6)",)
