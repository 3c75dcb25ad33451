"""What a scenario reads back as from its own Megatron-LM line (`to_megatron_args`, then
`parse_megatron_args`), for the round-trip tests."""

from __future__ import annotations

from simcluster.config.scenario import Scenario


def as_read_back(scenario: Scenario) -> Scenario:
    """`scenario` as its Megatron line states it. Megatron builds the dense linears', the
    router's and the experts' biases from one `add_bias_linear` (`--disable-bias-linear`), so
    a MoE scenario with the dense biases beside bias-free experts (the MoE scenarios written
    before `model.add_bias_linear`: every key at its default but `model.moe`) has no line of
    its own: it exports `--disable-bias-linear`, as the Mixtral, Qwen3 and DeepSeek recipes
    pass it, and reads back with `add_bias_linear` false. Every other scenario reads back
    unchanged."""
    m = scenario.model
    if m.moe is None or not m.add_bias_linear or m.moe.expert_bias:
        return scenario
    return scenario.model_copy(update={"model": m.model_copy(update={"add_bias_linear": False})})
