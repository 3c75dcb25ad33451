"""Reading YAML: aliases have a budget, keys are unique, errors never echo a huge value."""

import tracemalloc

import pytest

from simcluster.config import ConfigError, load_scenario
from simcluster.config.files import MAX_DEPTH, MAX_EXPANDED_NODES, parse_yaml_text, read_yaml

LAUGHS = "\n".join(
    [f'a0: &a0 ["{"lol" * 3}"]'] + [f"a{n}: &a{n} [{', '.join([f'*a{n - 1}'] * 10)}]" for n in range(1, 10)]
)  # expands to 10⁹ strings in 10 short lines


def test_alias_bomb_is_refused_fast(tmp_path):
    """The billion-laughs document is measured, not expanded: refused while allocating under
    10 MB (expanding it takes GB). Memory, not wall time: CI machines differ in speed."""
    path = tmp_path / "bomb.yaml"
    path.write_text(LAUGHS)
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as caught:
            read_yaml(path)
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak_bytes < 10e6
    message = str(caught.value)
    assert "bomb.yaml" in message and f"{MAX_EXPANDED_NODES:,}" in message and len(message) < 400


def test_alias_bomb_through_a_scenario_hardware_field(tmp_path):
    """`hardware:` pointing at a bomb is refused the same way, naming the profile file."""
    (tmp_path / "bomb.yaml").write_text(LAUGHS)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "hardware: bomb.yaml\nmodel: {num_layers: 2, hidden_size: 64, num_attention_heads: 2, seq_length: 8,"
        " vocab_size: 64}\nparallel: {tp: 1, pp: 1}\ntraining: {micro_batch_size: 1, global_batch_size: 1}\n"
    )
    from simcluster.config import load_scenario_and_hardware

    with pytest.raises(ConfigError, match="bomb.yaml"):
        load_scenario_and_hardware(scenario)


def test_small_aliases_still_work():
    """Aliases and merge keys within the budget load as before."""
    data = parse_yaml_text("base: &b {x: 1}\nother:\n  <<: *b\n  y: 2\nlist: [*b, *b]\n", "f.yaml")
    assert data["other"] == {"x": 1, "y": 2} and data["list"] == [{"x": 1}, {"x": 1}]


def test_recursive_alias_is_refused():
    with pytest.raises(ConfigError, match="recursive alias"):
        parse_yaml_text("a: &a [*a]\n", "f.yaml")


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 999, 1_001, 10_000])
@pytest.mark.parametrize("opening", ["[", "{a: "])
def test_deep_nesting_is_refused_with_our_message(levels, opening):
    """Too deep is our refusal with our message at every depth: just past our limit, and past
    libyaml's own 1,000-level limit (PyYAML 6.0.4), which must not answer first."""
    closing = "]" if opening == "[" else "}"
    with pytest.raises(ConfigError, match=f"nested deeper than {MAX_DEPTH} levels"):
        parse_yaml_text(opening * levels + closing * levels, "f.yaml")


def test_nesting_at_the_limit_loads():
    data = parse_yaml_text("[" * MAX_DEPTH + "]" * MAX_DEPTH, "f.yaml")
    for _ in range(MAX_DEPTH - 1):
        (data,) = data
    assert data == []


def test_deep_block_style_nesting_is_refused():
    """Indented (block) mappings count the same as flow ones."""
    text = (
        "".join(f"{'  ' * level}k{level}:\n" for level in range(MAX_DEPTH + 1))
        + "  " * (MAX_DEPTH + 1)
        + "v\n"
    )
    with pytest.raises(ConfigError, match="deeper than"):
        parse_yaml_text(text, "f.yaml")


def test_duplicate_key_is_an_error(tmp_path):
    """`tp: 2` then `tp: 4` names the key and the line instead of silently taking 4."""
    path = tmp_path / "dup.yaml"
    path.write_text(
        "hardware: a100-sxm4-80gb\nmodel: {num_layers: 2, hidden_size: 64, num_attention_heads: 2,"
        " seq_length: 8, vocab_size: 64}\nparallel:\n  tp: 2\n  tp: 4\n  pp: 1\n"
        "training: {micro_batch_size: 1, global_batch_size: 1}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_scenario(path)
    assert "dup.yaml" in str(caught.value) and "'tp' appears twice" in str(caught.value)
    assert "line 5" in str(caught.value)


def test_a_huge_value_is_cut_in_the_error(tmp_path):
    """A megabyte-long unknown key value is quoted cut short."""
    path = tmp_path / "huge.yaml"
    path.write_text("hardware: a100-sxm4-80gb\nbogus: " + "x" * 1_000_000 + "\n")
    with pytest.raises(ConfigError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert len(message) < 2_000 and "bogus" in message and "x" * 200 not in message


def test_oversized_file_is_refused_before_parsing(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * 5_000_000)
    with pytest.raises(ConfigError, match="limited to"):
        read_yaml(path)


def test_binary_file_is_one_error(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="bin.yaml"):
        read_yaml(path)
