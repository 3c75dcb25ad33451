"""Flash-attention rates in hardware profiles: present with sources on the modern GPUs,
absent on A100 (flash is then refused), all three tables or none, causal ratio <= 1."""

import pytest
import yaml

from simcluster.config import ConfigError
from simcluster.config.hardware import load_hardware, parse_hardware, profiles_dir

FLASH_KEYS = [
    "flash_attention_fwd_tflop_per_s",
    "flash_attention_bwd_tflop_per_s",
    "flash_attention_causal_efficiency",
]


def _data(stem: str) -> dict:
    return yaml.safe_load((profiles_dir() / f"{stem}.yaml").read_text())


@pytest.mark.parametrize("stem", ["h100-sxm5-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "gb200-nvl72"])
def test_modern_profiles_price_flash_attention_with_sources(stem):
    data = _data(stem)
    assert load_hardware(stem).compute.has_flash_attention
    for key in FLASH_KEYS:
        assert key in data["compute"]["sources"], f"{stem}: compute.{key} has no source"
    # below the bf16 peak: a kernel cannot beat the tensor cores
    peak = data["gpu"]["peak_bf16_tflop_per_s"]
    assert all(rate < peak for _, rate in data["compute"]["flash_attention_fwd_tflop_per_s"])


@pytest.mark.parametrize("stem", ["a100-sxm4-80gb", "a100-sxm4-80gb-public"])
def test_a100_profiles_have_no_flash_rates(stem):
    assert not load_hardware(stem).compute.has_flash_attention


def test_flash_tables_come_together():
    data = _data("h100-sxm5-80gb")
    del data["compute"]["flash_attention_bwd_tflop_per_s"]
    with pytest.raises(ConfigError, match="flash attention needs all three"):
        parse_hardware(data, "x.yaml")


def test_causal_efficiency_is_at_most_one():
    data = _data("h100-sxm5-80gb")
    data["compute"]["flash_attention_causal_efficiency"][0] = [512, 1.2]
    with pytest.raises(ConfigError, match="ratio <= 1"):
        parse_hardware(data, "x.yaml")


@pytest.mark.parametrize("stem", ["h100-sxm5-80gb", "h200-sxm-141gb"])
def test_hopper_profiles_price_flash_attention_2_below_their_default_kernels(stem):
    """FlashAttention-2 is slower than cuDNN's kernels on Hopper at every tabulated length
    (FlashAttention-3 paper, Fig. 5/6); each of its three tables has a source."""
    data = _data(stem)
    block = data["compute"]["flash_attn_2"]
    assert set(block["sources"]) == {"fwd_tflop_per_s", "bwd_tflop_per_s", "causal_efficiency"}
    rates = load_hardware(stem).compute
    assert rates.flash_attn_2 is not None
    for fa2, default in (
        (rates.flash_attn_2.fwd_tflop_per_s, rates.flash_attention_fwd_tflop_per_s),
        (rates.flash_attn_2.bwd_tflop_per_s, rates.flash_attention_bwd_tflop_per_s),
    ):
        assert [seq for seq, _ in fa2] == [seq for seq, _ in default or []]
        assert all(slow < fast for (_, slow), (_, fast) in zip(fa2, default or [], strict=True))


def test_flash_attention_2_causal_efficiency_is_at_most_one():
    data = _data("h100-sxm5-80gb")
    data["compute"]["flash_attn_2"]["causal_efficiency"][0] = [512, 1.1]
    with pytest.raises(ConfigError, match="causal_efficiency: value .*ratio <= 1"):
        parse_hardware(data, "x.yaml")
