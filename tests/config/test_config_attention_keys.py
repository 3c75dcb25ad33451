"""`model.kv_channels`, `model.mla`, `model.mtp_num_layers`, `model.window_size` /
`window_attn_skip_freq` and `training.recompute_modules`: their defaults keep every
scenario as it was, Megatron-core's rules give one clear error each, and a key the
simulator does not price yet is refused by name rather than priced as if it were unset."""

from __future__ import annotations

import copy

import pytest
import yaml

from simcluster.config import ConfigError, parse_scenario
from simcluster.config.moe_choices import RecomputeModule
from simcluster.config.scenario import load_scenario, unpriced_keys
from tests.paths import ROOT

QWEN = ROOT / "tests" / "data" / "moe" / "qwen3-30b-a3b-head-dim-64.yaml"
DENSE = ROOT / "scenarios" / "modern" / "llama3-8b-h100.yaml"
MLA = {
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_head_dim": 128,
    "qk_pos_emb_head_dim": 64,
    "v_head_dim": 128,
}


def _data(path=DENSE):
    return yaml.safe_load(path.read_text())


def _problems(data) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_scenario(data, "bad.yaml")
    assert "bad.yaml" in str(caught.value)
    return caught.value.problems


def test_defaults_leave_every_shipped_scenario_as_it_was():
    """A scenario that does not write a key gets its default (the Qwen3 and gpt-oss
    scenarios of issue 18 write kv_channels and the windows; DeepSeek-V3 MLA and MTP)."""
    attention_variants = {"deepseek-v3-h100"}  # shipped with MLA and MTP (docs/moe.md)
    for path in sorted((ROOT / "scenarios").rglob("*.yaml")):
        if path.stem in attention_variants:
            continue
        written = _data(path)["model"]
        m, tr = load_scenario(path).model, load_scenario(path).training
        assert m.mla is None and m.mtp_num_layers == 0
        assert tr.recompute_modules is None
        if "kv_channels" not in written:
            assert m.kv_channels is None and m.head_dim == m.hidden_size // m.num_attention_heads
        if "window_size" not in written:
            assert m.window_size is None and m.window_attn_skip_freq is None


def test_kv_channels_is_priced_at_any_value():
    data = _data()
    m = data["model"]
    m["kv_channels"] = m["hidden_size"] // m["num_attention_heads"]
    assert unpriced_keys(parse_scenario(copy.deepcopy(data), "ok.yaml")) == []
    m["kv_channels"] = 2 * m["kv_channels"]
    assert unpriced_keys(parse_scenario(copy.deepcopy(data), "ok.yaml")) == []
    assert parse_scenario(data, "ok.yaml").model.head_dim == 256


def test_mla_with_gqa_groups_is_an_error():
    data = _data()  # Llama 3 8B: 32 heads, 8 query groups
    data["model"]["mla"] = dict(MLA)
    problems = _problems(data)
    assert any("model.num_query_groups=8" in p and "model.mla" in p for p in problems), problems


def test_mla_without_groups_loads_and_is_priced():
    data = _data()
    del data["model"]["num_query_groups"]
    data["model"]["mla"] = dict(MLA)
    data["parallel"]["cp"] = 1  # MLA's core has no context-parallel ring yet (refused)
    assert unpriced_keys(parse_scenario(copy.deepcopy(data), "ok.yaml")) == []
    data["model"]["mla"]["kv_lora_rank"] = 0
    assert any("kv_lora_rank" in p for p in _problems(data))


def test_window_is_priced_and_refused_with_context_parallelism():
    """Windows load and are priced; with cp > 1 one error: TE's p2p ring has no window."""
    data = _data()  # Llama 3 8B with cp 2
    data["model"].update(window_size=128, window_attn_skip_freq=2)
    data["parallel"].update(cp=1)
    assert unpriced_keys(parse_scenario(copy.deepcopy(data), "ok.yaml")) == []
    data["parallel"].update(cp=2)
    problems = _problems(data)
    expected = "model.window_size: value 128: not allowed with parallel.cp > 1"
    assert any(p.startswith(expected) for p in problems), problems


def test_window_skip_frequency_needs_a_window():
    data = _data()
    data["model"]["window_attn_skip_freq"] = 2
    problems = _problems(data)
    assert any(
        p.startswith("model.window_attn_skip_freq: value 2: needs model.window_size") for p in problems
    )


@pytest.mark.parametrize(
    ("recompute", "modules", "expected"),
    [
        ("none", ["core_attn"], "needs training.recompute: selective"),
        ("full", ["mlp"], "needs training.recompute: selective"),
        ("selective", ["moe_act"], "'moe_act' needs model.moe"),
        ("selective", ["mla_up_proj"], "'mla_up_proj' needs model.mla"),
        ("selective", ["gdn_norm_out"], "recompute_modules"),
    ],
)
def test_recompute_modules_rules(recompute, modules, expected):
    data = _data()
    data["training"]["recompute"] = recompute
    data["training"]["recompute_modules"] = modules
    problems = _problems(data)
    assert any(expected in p for p in problems), problems


def test_recompute_modules_core_attn_is_selective_as_today():
    data = _data()
    data["training"]["recompute"] = "selective"
    data["training"]["recompute_modules"] = ["core_attn"]
    scenario = parse_scenario(data, "ok.yaml")
    assert scenario.training.recompute_modules == [RecomputeModule.CORE_ATTN]
    assert unpriced_keys(scenario) == []


def test_every_recompute_module_but_mla_up_proj_is_priced():
    """core_attn, mlp, layernorm (dense); moe_act, moe, shared_experts (MoE) load and are
    priced: no key is left unpriced."""
    for path, modules in (
        (DENSE, ["core_attn", "mlp", "layernorm"]),
        (QWEN, ["core_attn", "moe_act", "moe", "shared_experts", "layernorm", "mlp"]),
    ):
        data = _data(path)
        data["training"]["recompute"] = "selective"
        data["training"]["recompute_modules"] = modules
        scenario = parse_scenario(data, "ok.yaml")
        assert scenario.training.recompute_modules == [RecomputeModule(m) for m in modules]
        assert unpriced_keys(scenario) == []


def test_mla_up_proj_is_priced_with_mla():
    """mla_up_proj re-runs MLA's up projections (workload/mla_layer.py prices them): with
    model.mla it loads and nothing is refused; without MLA it stays an error (above)."""
    data = _data()
    del data["model"]["num_query_groups"]
    data["model"]["mla"] = dict(MLA)
    data["training"]["attention_backend"] = "flash"
    data["parallel"]["cp"] = 1  # no MLA ring yet
    data["parallel"]["dp"] *= 2
    data["training"]["recompute"] = "selective"
    data["training"]["recompute_modules"] = ["core_attn", "mla_up_proj"]
    scenario = parse_scenario(data, "ok.yaml")
    assert RecomputeModule.MLA_UP_PROJ in scenario.training.recompute_modules
    assert unpriced_keys(scenario) == []


def test_moe_act_needs_grouped_gemm():
    """Megatron-core: "moe_act in recompute_modules is only supported with moe_grouped_gemm"."""
    data = _data(QWEN)
    data["training"].update(recompute="selective", recompute_modules=["moe_act"], moe_grouped_gemm=False)
    (problem,) = _problems(data)
    assert problem.startswith("training.recompute_modules: 'moe_act' needs training.moe_grouped_gemm")


@pytest.mark.parametrize(("recipe", "refused"), [("delayed", True), ("tensorwise", False)])
def test_layernorm_recompute_with_fp8_needs_a_recipe_other_than_delayed(recipe, refused):
    """Megatron-core: "Delayed scaling does not support moe_act and layernorm recompute for fp8"."""
    data = _data()
    data["training"].update(
        recompute="selective", recompute_modules=["layernorm"], dtype="fp8", fp8_recipe=recipe
    )
    if refused:
        (problem,) = _problems(data)
        assert "'layernorm' with training.dtype fp8" in problem and "delayed" in problem
    else:
        assert parse_scenario(data, "ok.yaml").training.fp8_recipe.value == recipe
