"""Reading configuration files: one place that turns missing files and bad YAML into
ConfigErrors naming the file.

Scenario files, sweep specs and hardware profiles come from users and from the internet, so
the reader bounds the work a file can ask for before anything is built from it:
- at most `MAX_FILE_BYTES` of text (the largest shipped or calibrated profile is ~100 kB);
- nesting is limited to `MAX_DEPTH` levels, checked on the event stream before any node is
  composed, so the limit and its message are ours whatever the YAML library refuses itself
  (libyaml since PyYAML 6.0.4 stops at 1,000 levels with a message of its own);
- aliases may repeat nodes, but the document expanded must stay under `MAX_EXPANDED_NODES`
  nodes and `MAX_DEPTH` levels ("billion laughs": nine lines that expand to 10⁹ nodes
  would otherwise take minutes and gigabytes in the validators); recursive aliases are
  refused;
- a key given twice in one mapping is an error (YAML says keys are unique; PyYAML would
  silently keep the last one, so `tp: 2` then `tp: 4` ran with 4).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from simcluster.config.errors import ConfigError, cut, shorten

MAX_FILE_BYTES = 4_000_000
MAX_EXPANDED_NODES = 100_000
MAX_DEPTH = 64
_DEEPER = f"nested deeper than {MAX_DEPTH} levels"

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # type: ignore[assignment]


class _DuplicateKey(Exception):
    def __init__(self, key: object, line: int) -> None:
        super().__init__(f"key {shorten(key)} appears twice in one mapping (again on line {line}); keep one")


class _UniqueKeyLoader(_Loader):  # type: ignore[misc, valid-type]
    """Safe loader whose mappings refuse repeated keys."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable key: the base constructor reports it
                break
            if duplicate:
                raise _DuplicateKey(key, key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def expanded_size(root: Node) -> int:
    """Nodes in the document with every alias expanded, computed once per distinct node
    (so a bomb is measured, not expanded); raises ValueError past the budget, past
    `MAX_DEPTH`, or on a recursive alias."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    # Iterative post-order walk: a deep document must not exhaust Python's stack here.
    stack: list[tuple[Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            total = 1 + sum(sizes[id(child)] for child in _children(node))
            if total > MAX_EXPANDED_NODES:
                raise ValueError(
                    f"the document expands (aliases included) to more than {MAX_EXPANDED_NODES:,} "
                    "values; write it out, or use fewer aliases"
                )
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise ValueError("an alias refers to a mapping or list that contains it (recursive alias)")
        if depth > MAX_DEPTH:
            raise ValueError(_DEEPER)
        on_path.add(key)
        stack.append((node, depth, True))
        for child in _children(node):
            if isinstance(child, ScalarNode):
                sizes[id(child)] = 1
            else:
                stack.append((child, depth + 1, False))
    return sizes.get(id(root), 1)


def _deepest_within_limit(events: yaml.SafeLoader) -> None:
    depth = 0
    try:
        while events.check_event():
            event = events.get_event()
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ValueError(_DEEPER)
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
    finally:
        events.dispose()


def check_nesting(text: str) -> None:
    """Raise ValueError once the YAML events open more than `MAX_DEPTH` collections, before the
    composer's recursion can be reached. libyaml looks ahead over a run of `[` and refuses past
    its own 1,000 levels before the first event; on any refusal of the fast reader the pure-Python
    one (no depth limit, no recursion) reads the events again, so a too-deep document gets our
    message and any other error is left for the loader to report."""
    try:
        _deepest_within_limit(_Loader(text))
    except yaml.YAMLError:
        if _Loader is yaml.SafeLoader:
            return
        try:
            _deepest_within_limit(yaml.SafeLoader(text))
        except yaml.YAMLError:
            return


def parse_yaml_text(text: str, source: str | Path) -> Any:
    """YAML text -> Python data under the bounds above; any problem is one ConfigError."""
    loader = _UniqueKeyLoader(text)
    try:
        check_nesting(text)
        node = loader.get_single_node()
        if node is None:
            return None
        expanded_size(node)
        return loader.construct_document(node)
    except yaml.YAMLError as error:
        raise ConfigError(source, [f"not valid YAML: {cut(str(error), 400)}"]) from None
    except (_DuplicateKey, ValueError) as error:
        raise ConfigError(source, [f"(YAML): {error}"]) from None
    except RecursionError:
        raise ConfigError(source, [f"(YAML): {_DEEPER}"]) from None
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(path, ["file not found"])
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ConfigError(
            path, [f"(file): {size:,} bytes; configuration files are limited to {MAX_FILE_BYTES:,} bytes"]
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(path, [f"(file): cannot be read as UTF-8 text: {cut(str(error), 200)}"]) from None
    return parse_yaml_text(text, path)
