"""Fuzzing the loaders (issue 8 §4): scenario files, sweep specs and hardware profiles, as
random structures, types, sizes and unicode, and as random edits of valid files. Every
input gives a result or one ConfigError (exit 2 through the CLI) with a bounded message,
never another exception, never more than a few seconds."""

import copy
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from simcluster.cli import app
from simcluster.config import ConfigError
from simcluster.config.files import parse_yaml_text, read_yaml
from simcluster.config.hardware import load_hardware, parse_hardware
from simcluster.config.scenario import parse_scenario
from simcluster.sweep.spec import parse_sweep_spec
from tests.paths import ROOT

# No wall-clock bound per input (CI machines differ in speed): what an input can make the
# loaders do is bounded by their work limits (file size, alias expansion, depth, pipeline
# tasks), each tested by the memory it may take in test_config_files / test_config_limits.
FOLDER = Path(tempfile.mkdtemp(prefix="simcluster-fuzz-"))
SCENARIO = read_yaml(ROOT / "scenarios" / "paper" / "gpt3-175b-sp-selective.yaml")
PROFILE = read_yaml(ROOT / "hwprofiles" / "a100-sxm4-80gb.yaml")
(FOLDER / "base.yaml").write_text(yaml.safe_dump(SCENARIO))
SPEC = {
    "base": "base.yaml",
    "num_gpus": 64,
    "axes": {"tp": [1, 2, 4, 8], "pp": "auto", "recompute": ["none"]},
}

numbers = st.one_of(
    st.integers(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 2**31, 2**31 - 1, 10**12, 1e308, 1e-320, 0.5, 1.0]),
)
leaves = st.one_of(
    st.none(), st.booleans(), numbers, st.text(max_size=20), st.text(min_size=1000, max_size=3000)
)
structures = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=6), st.dictionaries(st.text(max_size=12), children, max_size=6)
    ),
    max_leaves=40,
)


def _paths(node, prefix=()):
    """Every key path into a nested dict / list document."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _paths(value, (*prefix, index))


@st.composite
def edits_of(draw, document):
    """A valid document with one to three random edits: a value replaced by anything, a key
    deleted, or an unknown key added."""
    data = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(_paths(data))))
        if not path:
            continue
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(structures)
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(max_size=12))] = draw(structures)
    return data


def _bounded(load, *args):
    """`load(*args)` returns or raises one ConfigError with a bounded message."""
    try:
        load(*args)
    except ConfigError as error:
        assert error.problems and all(isinstance(problem, str) for problem in error.problems)
        assert len(str(error)) < 20_000


def _scenario_and_profile(data):
    scenario = parse_scenario(data, "fuzz.yaml")
    load_hardware(scenario.hardware, relative_to=FOLDER)


# Example counts keep the five fuzz tests near half a minute on the shared 2-core machine.
FUZZ = settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(st.one_of(structures, edits_of(SCENARIO)))
def test_scenario_loader(data):
    _bounded(_scenario_and_profile, data)


@FUZZ
@given(st.one_of(structures, edits_of(PROFILE)))
def test_profile_loader(data):
    _bounded(parse_hardware, data, "fuzz-profile.yaml")


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.one_of(structures, edits_of(SPEC)))
def test_sweep_spec_loader(data):
    _bounded(parse_sweep_spec, data, FOLDER / "fuzz-spec.yaml")


YAML_PIECES = ["a:", " b", "- ", "&x ", "*x", "[", "]", "{", "}", ",", "\n", "  ", "!!str", "'", "1", "é"]
yaml_texts = st.one_of(
    st.text(max_size=300),
    st.lists(st.sampled_from(YAML_PIECES), max_size=60).map("".join),
    structures.map(lambda data: yaml.safe_dump(data, allow_unicode=True)),
)


@FUZZ
@given(yaml_texts)
def test_yaml_text(text):
    """Any text: data or one ConfigError (bad YAML, duplicate key, alias budget, depth)."""
    _bounded(parse_yaml_text, text, "fuzz.yaml")


runner = CliRunner()


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.one_of(yaml_texts, structures.map(lambda data: yaml.safe_dump(data, allow_unicode=True))))
def test_cli_run_exits_0_or_2_without_traceback(text):
    """Through the CLI a random file ends in exit 2 with `error:` (or runs), never a traceback."""
    path = FOLDER / "cli-fuzz.yaml"
    path.write_text(text, encoding="utf-8")
    result = runner.invoke(app, ["run", str(path), "--json"])
    assert result.exit_code in (0, 2), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    if result.exit_code == 2:
        assert "error:" in result.stderr and "Traceback" not in result.output
