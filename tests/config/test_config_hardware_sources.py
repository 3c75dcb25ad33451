"""Every number in a shipped hardware profile has a source: the loader checks the scalar
fields (`config.hardware._Section`), this checks the tables too (busbw sweeps, GEMM points,
flash-attention rates, GEMM tiles), so a table added without its `sources:` entry fails."""

import pytest

from simcluster.config.files import read_yaml
from tests.paths import ROOT

PROFILES = sorted((ROOT / "hwprofiles").glob("*.yaml"))


def _has_number(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    if isinstance(value, dict):
        return any(_has_number(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_number(item) for item in value)
    return False


def _unsourced(section: dict, prefix: str) -> list[str]:
    """Keys holding numbers with no entry in the section's `sources`; a nested block with a
    `sources:` of its own (e.g. compute.flash_attn_2) is checked against that instead."""
    missing = []
    for key, value in section.items():
        if key == "sources" or not _has_number(value):
            continue
        if isinstance(value, dict) and "sources" in value:
            missing += _unsourced(value, f"{prefix}.{key}")
        elif key not in section.get("sources", {}):
            missing.append(f"{prefix}.{key}")
    return missing


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_every_number_and_table_of_a_shipped_profile_has_a_source(path):
    data = read_yaml(path)
    sections = ("gpu", "compute", "network")
    missing = [name for section in sections for name in _unsourced(data[section], section)]
    assert missing == [], f"{path.name}: no `sources:` entry for {missing}"


def test_a_nested_block_needs_its_own_sources():
    data = read_yaml(ROOT / "hwprofiles" / "h100-sxm5-80gb.yaml")
    assert _unsourced(data["compute"], "compute") == []
    del data["compute"]["flash_attn_2"]["sources"]["bwd_tflop_per_s"]
    assert _unsourced(data["compute"], "compute") == ["compute.flash_attn_2.bwd_tflop_per_s"]


def test_the_check_sees_a_table_without_a_source():
    """The walk finds numbers inside nested tables (it is not vacuous)."""
    data = read_yaml(ROOT / "hwprofiles" / "h100-sxm5-80gb.yaml")
    assert _has_number(data["compute"]["gemm_tiles"])
    assert _has_number(data["network"]["nvlink_allreduce_busbw"])
    assert not _has_number({"name": "H100", "flag": True})
