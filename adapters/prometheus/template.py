"""The one rule for every value put into a PromQL query the bot sends.

A value goes where its template puts it, and only between double quotes (escaped as a label
value by ``place``, here and nowhere else) or as one number or duration. ``seal`` proves it
on the finished text: each value lies inside one string or is one number, and the query's
tokens are those of the template with harmless values. Code builds with ``build``; runbook
templates (checks, query arguments of steps) are rendered with ``place`` as Jinja's finalize.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from string import Template
from typing import Any

from adapters.prometheus.promql import escape_label_value

OPEN, CLOSE = "\ue000", "\ue001"  # private-use marks around each value while it is checked
# Field(json_schema_extra=QUERY): this argument is a PromQL template (see query_arguments)
QUERY: dict[str, Any] = {"promql": True}
_TOKEN = re.compile(r"""
    (?P<space>\s+) | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*") | (?P<other_string>'(?:[^'\\\n]|\\.)*'|`[^`]*`)
  | (?P<scalar>(?:\d+(?:ms|[smhdwy]))+|0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
  | (?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>==|!=|=~|!~|<=|>=|.)
""", re.VERBOSE | re.DOTALL)


class QueryShapeError(ValueError):
    """A value would change the query's structure (or cannot be placed at all)."""


Token = tuple[str, int, int]  # kind, start, end


def tokens(query: str) -> list[Token]:
    """PromQL's tokens, as far as structure goes: strings, scalars, names, operators."""
    found = []
    for match in _TOKEN.finditer(query):
        kind = str(match.lastgroup)
        found.append((kind, match.start(), match.end()))
    return found


def place(value: Any) -> str:
    """``value`` as it goes into a query: escaped as a label value and marked for ``seal``."""
    text = value if isinstance(value, str) else str(value)
    if OPEN in text or CLOSE in text:
        raise QueryShapeError(f"{text!r} holds a character reserved for query templates")
    return OPEN + escape_label_value(text) + CLOSE


def _unmark(marked: str) -> tuple[str, list[tuple[int, int]]]:
    text: list[str] = []
    spans: list[tuple[int, int]] = []
    start: int | None = None
    for char in marked:
        if char == OPEN and start is None:
            start = len(text)
        elif char == CLOSE and start is not None:
            spans.append((start, len(text)))
            start = None
        elif char in (OPEN, CLOSE):
            raise QueryShapeError("the query template holds a reserved character")
        else:
            text.append(char)
    if start is not None:
        raise QueryShapeError("the query template holds a reserved character")
    return "".join(text), spans


def _in_place(text: str, found: Sequence[Token], start: int, end: int) -> bool:
    """Inside one double-quoted string, or exactly one number or duration."""
    return any((kind == "string" and a < start and end < b)
               or (kind == "scalar" and (a, b) == (start, end)) for kind, a, b in found)


def _neutral(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """The text with every value replaced by ``0``: the template's own structure."""
    parts, last = [], 0
    for start, end in spans:
        parts += [text[last:start], "0"]
        last = end
    return "".join([*parts, text[last:]])


def _outside(text: str, found: Sequence[Token], spans: Sequence[tuple[int, int]]) -> list[str]:
    """Each token with its text, values' tokens by kind only."""
    return [kind if any((a < e and s < b) or (s == e and a <= s < b) for s, e in spans)
            else f"{kind}:{text[a:b]}" for kind, a, b in found]


def seal(marked: str) -> str:
    """The query from ``place``-marked text, once every value is proven to be in its place
    and the structure unchanged; else QueryShapeError naming the value."""
    text, spans = _unmark(marked)
    found = tokens(text)
    for start, end in spans:
        if not _in_place(text, found, start, end):
            raise QueryShapeError(
                f"the value {text[start:end]!r} would change the query {text!r}: a value goes "
                'between double quotes (label="{{ value }}") or is one number or duration')
    neutral = _neutral(text, spans)
    shifted, last, at = [], 0, 0  # the spans as they lie in the neutral text
    for start, end in spans:
        at += start - last
        shifted.append((at, at + 1))
        at, last = at + 1, end
    if _outside(text, found, spans) != _outside(neutral, tokens(neutral), shifted):
        raise QueryShapeError(f"a value changes the structure of the query {text!r}")
    return text


def build(template: str, **values: Any) -> str:
    """A query from code: ``build('up{instance="$node"}', node=name)``; each ``$name`` is
    a value placed by ``place`` and the result sealed."""
    if OPEN in template or CLOSE in template:
        raise QueryShapeError("the query template holds a reserved character")
    return seal(Template(template).substitute({k: place(v) for k, v in values.items()}))


def query_arguments(model: type[Any]) -> tuple[str, ...]:
    """The arguments of an action's ``Arguments`` model that are PromQL templates."""
    return tuple(name for name, field in getattr(model, "model_fields", {}).items()
                 if isinstance(field.json_schema_extra, dict)
                 and field.json_schema_extra.get("promql"))
