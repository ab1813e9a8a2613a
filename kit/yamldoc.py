"""YAML files read with the line of every value, so that a problem reads
``FILE:LINE: path: what is wrong`` (runbooks and the configuration alike). Only YAML's safe
subset; a key twice in one mapping, an alias that contains itself, or a file too large or
nested too deeply is refused, naming its line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

Loc = tuple[str | int, ...]  # where a value is: keys and list indexes from the top
MAX_NODES = 50_000  # YAML nodes in one file, aliases expanded
MAX_DEPTH = 64  # nesting of mappings and lists


class YamlProblem(Exception):
    """A file that is not a YAML document this module reads; ``problems`` name file and line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def parse(source: str, path: Path) -> tuple[Any, dict[Loc, int]]:
    """The document (None when the file holds none) and the line of each value. libyaml
    parses (about ten times faster); a file it refuses is parsed again in Python, whose errors
    name the line and the problem."""
    fast = getattr(yaml, "CSafeLoader", None)
    if fast is not None:
        try:
            return _parse_with(fast, source, path)
        except (YamlProblem, yaml.YAMLError):
            pass
    return _parse_with(yaml.SafeLoader, source, path)


def _parse_with(loader_class: Any, source: str, path: Path) -> tuple[Any, dict[Loc, int]]:
    try:
        loader = loader_class(source)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow
        line = source.count("\n", 0, exc.position) + 1
        raise YamlProblem(
            [f"{path}:{line}: not valid YAML: character #x{exc.character:04x} is not allowed"]
        ) from exc
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        lines: dict[Loc, int] = {}
        _walk(node, (), lines, path, set(), [0])
        return loader.construct_document(node), lines
    except RecursionError as exc:
        raise YamlProblem([f"{path}: the YAML is nested too deeply"]) from exc
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        raise YamlProblem([f"{path}:{line}: not valid YAML: {exc.problem}"]) from exc
    except yaml.YAMLError as exc:
        raise YamlProblem([f"{path}: not valid YAML: {exc}"]) from exc
    finally:
        loader.dispose()


def _walk(node: yaml.Node, at: Loc, lines: dict[Loc, int], path: Path, ancestors: set[int],
          count: list[int]) -> None:
    count[0] += 1
    if count[0] > MAX_NODES:
        raise YamlProblem([f"{path}: too large (more than {MAX_NODES} YAML values with aliases)"])
    if len(at) > MAX_DEPTH:
        line = node.start_mark.line + 1
        raise YamlProblem([f"{path}:{line}: nested more than {MAX_DEPTH} levels deep"])
    if id(node) in ancestors:
        line = node.start_mark.line + 1
        raise YamlProblem([f"{path}:{line}: an alias refers to a value that contains it"])
    lines.setdefault(at, node.start_mark.line + 1)
    if not isinstance(node, yaml.MappingNode | yaml.SequenceNode):
        return
    ancestors = ancestors | {id(node)}
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if key in seen:
                line = key_node.start_mark.line + 1
                raise YamlProblem([f'{path}:{line}: "{key}" appears twice in the same mapping'])
            seen.add(key)
            lines[(*at, key)] = key_node.start_mark.line + 1
            _walk(value_node, (*at, key), lines, path, ancestors, count)
    else:
        for index, item in enumerate(node.value):
            _walk(item, (*at, index), lines, path, ancestors, count)


@dataclass(frozen=True)
class Locator:
    """Turns a place in the document and a message into ``FILE:LINE: path: message`` (the
    line of the nearest value above the place when the place itself is not in the file)."""

    path: Path
    lines: dict[Loc, int]

    def at(self, loc: Loc, message: str) -> str:
        probe = tuple(loc)
        while probe and probe not in self.lines:
            probe = probe[:-1]
        line = self.lines.get(probe)
        field = dotted(loc)
        prefix = f"{self.path}:{line}" if line else str(self.path)
        return f"{prefix}: {field}: {message}" if field else f"{prefix}: {message}"


def dotted(loc: Loc) -> str:
    """``steps[2].with.node``: keys joined by dots, list indexes in brackets."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text
