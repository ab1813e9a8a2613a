"""The chat grammar's words: a line split as a shell would (quotes kept together), ``key=value``
assignments, and a window's ``runbooks="NAME k=v; NAME k=v"`` list.

Every surface that reads typed words (Slack, ``runbook chat``, the command line) reads them
here; what the words mean is checked below (bot.runbooks.params validates the values).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

from bot.runbooks.params import ParamError
from kit.errors import Refused

MAX_VALUE = 4096  # no parameter value is longer; max_length narrows it further
KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,40}$")


def split_words(text: str) -> list[str]:
    """Split a chat line like ``run drain-node reason="XID 79"`` into words."""
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise ParamError([f"cannot read the command: {exc} (check the quotes)"]) from exc


def parse_assignments(words: Iterable[str]) -> dict[str, str]:
    """``["node=gpu07", "reason=XID 79"]`` -> mapping; every word must be key=value."""
    values: dict[str, str] = {}
    problems: list[str] = []
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            problems.append(f'"{_short(word)}" is not key=value (for example node=gpu07)')
        elif not KEY.fullmatch(key):
            problems.append(f'"{_short(key)}" is not a parameter name')
        elif key in values:
            problems.append(f"{key} is given twice")
        elif len(value) > MAX_VALUE:
            problems.append(f"{key}: the value is {len(value)} characters; at most {MAX_VALUE}")
        else:
            values[key] = value
    if problems:
        raise ParamError(problems)
    return values


def runbook_list(text: str) -> list[tuple[str, dict[str, str]]]:
    """``"drain-node node=gpu04 reason=x; resume-node node=gpu04"`` -> [(name, params)]."""
    found: list[tuple[str, dict[str, str]]] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        try:
            words = split_words(part)
            found.append((words[0], parse_assignments(words[1:])))
        except ParamError as exc:
            raise Refused(f'runbooks: "{part[:80]}": {exc}') from None
    return found


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"
