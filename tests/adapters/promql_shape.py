"""A PromQL structure for tests, written apart from the bot's own lexer: the query's tokens
with each double-quoted string replaced by ``"…"`` (selectors, label names, matchers,
operators, functions, numbers), and the values those strings hold, unescaped."""

from __future__ import annotations

import json
import re

# Values the bot must keep inside their label value, whatever they hold.
HOSTILE = [
    'gpu01"}) or vector(0) or max(up{job="x',  # the issue's: a wait satisfied at once
    '"}) or vector(1) or x{a="',
    'a"} or vector(1) #',
    'gpu01\\',  # a trailing backslash would escape the closing quote
    '\\"} or vector(1) or {a="\\',
    "line\nbreak\"}\nor vector(1)",
    "{", "}", "} or {", '=~".*', "=~", 'a", b="c', "'", "`", "#", "$node", "${x}", "$",
    "{{ 7*7 }}", "",
]
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\w+|==|!=|=~|!~|<=|>=|\S', re.DOTALL)


def structure(query: str) -> list[str]:
    """Every token of ``query``; a double-quoted string is ``"…"`` whatever it holds."""
    return ['"…"' if token.startswith('"') else token for token in _TOKEN.findall(query)]


def values(query: str) -> list[str]:
    """What the double-quoted strings of ``query`` hold, as Prometheus reads them."""
    return [json.loads(token) for token in _TOKEN.findall(query) if token.startswith('"')]
