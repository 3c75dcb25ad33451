"""Hardware profiles: every number carries a source; units are converted once."""

import pytest
import yaml

from simcluster.config import ConfigError
from simcluster.config.hardware import known_profiles, load_hardware, parse_hardware, profiles_dir


@pytest.mark.parametrize("stem", known_profiles())
def test_shipped_profiles_load(stem):
    """Each shipped profile validates (which includes a source for every number)."""
    profile = load_hardware(stem)
    assert profile.peak_flop_per_s() > 1e14


def test_a100_units_are_si():
    """312 TFLOP/s and 2,039 GB/s become FLOP/s and bytes/s."""
    a100 = load_hardware("a100-sxm4-80gb")
    assert a100.peak_flop_per_s() == 312e12
    assert a100.memory_bandwidth_bytes_per_s == 2039e9
    assert a100.memory_bytes == 80e9


def test_a_number_without_source_is_rejected():
    """Deleting one source makes the profile invalid, naming the field."""
    data = yaml.safe_load((profiles_dir() / "a100-sxm4-80gb.yaml").read_text())
    del data["gpu"]["sources"]["memory_gb"]
    with pytest.raises(ConfigError) as caught:
        parse_hardware(data, "edited.yaml")
    assert "memory_gb" in str(caught.value) and "gpu" in str(caught.value)
