"""What a console viewer may see, and what no page ever shows: ``visible`` (may this viewer
see the executions of this runbook) and ``masked`` (parameters, event data and text with
the values of secret-looking keys hidden; ``shown`` is the template filter over it). Every
page goes through both."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from bot.config import Config
from bot.store import listing
from bot.store.db import Connection
from bot.surfaces.console.identity import Viewer

MASK = "[hidden]"
# A key that names a secret: token, password, secret, credential, API or private key, ...
SECRET_KEY = re.compile(
    r"token|passw|passphrase|pwd|secret|credential|api[_-]?key|private[_-]?key|"
    r"access[_-]?key|(^|[_-])key$|authoriz|cookie|bearer|signing", re.IGNORECASE)
NOT_SECRET = frozenset({"fencing_token"})  # the engine's lock fencing number
# key=value or key: value in text (an operation line, a message); the value may be quoted
_ASSIGNED = re.compile(r"(?P<key>[A-Za-z_][\w.-]*)(?P<sep>=|:[ \t]*)"
                       r"(?P<value>\"[^\"\n]*\"|'[^'\n]*'|[^\s,;&]+)")
_FLAG = re.compile(r"(?P<key>--?[\w-]+)(?P<sep>[ \t]+)(?P<value>\"[^\"\n]*\"|'[^'\n]*'|[^\s-]\S*)")
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][\w+.-]*://[^/\s:@]+:)[^@\s/]+(?=@)", re.I)


def visible(viewer: Viewer, runbook: str, config: Config) -> bool:
    """Whether ``viewer`` may see the executions of ``runbook``: auditors see every one,
    others those of the runbooks they may request (today every requester may request
    every runbook: bot.service.Service.request)."""
    del runbook  # no runbook narrows its requesters yet
    return viewer.auditor or config.matches(viewer.name, config.requesters)



def runbooks_in_scope(conn: Connection, viewer: Viewer, config: Config) -> list[str] | None:
    """The runbooks whose executions ``viewer`` may see (``visible`` decides, runbook by
    runbook, among those the bot has recorded); None for every one (an auditor)."""
    if viewer.auditor:
        return None
    return [name for name in listing.runbook_names(conn) if visible(viewer, name, config)]

def secret_key(key: str) -> bool:
    return key not in NOT_SECRET and bool(SECRET_KEY.search(key.lstrip("-")))


def secret_values(params: Mapping[str, Any]) -> frozenset[str]:
    """The values of the secret-looking parameters of a request (at least 4 characters):
    ``masked`` hides them wherever else they appear (an operation line, a message)."""
    return frozenset(str(value) for key, value in params.items()
                     if secret_key(str(key)) and value is not None and len(str(value)) >= 4)


def secret_values_in(document: Any) -> frozenset[str]:
    """The secret values a parsed document (a runbook's YAML) holds: of secret-looking keys,
    and the ``default`` or ``value`` of a mapping under one (a parameter ``db_password``
    with a default), at least 4 characters; ``masked`` hides them wherever they appear."""
    found: set[str] = set()
    if isinstance(document, dict):
        for key, value in document.items():
            if isinstance(key, str) and secret_key(key):
                if isinstance(value, dict):
                    value = value.get("default", value.get("value"))
                if value is not None and not isinstance(value, dict | list):
                    found.add(str(value))
            found |= secret_values_in(value)
    elif isinstance(document, list):
        for item in document:
            found |= secret_values_in(item)
    return frozenset(text for text in found if len(text) >= 4)


def masked(value: Any, hidden: frozenset[str] = frozenset()) -> Any:
    """``value`` (a mapping, list or text, at any depth) with the value of every
    secret-looking key replaced by MASK, in text too (``password=...``, ``--token ...``,
    a URL's password), and every ``hidden`` value wherever it appears."""
    if isinstance(value, dict):
        return {key: MASK if _hidden(key, item) else masked(item, hidden)
                for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [masked(item, hidden) for item in value]
    if isinstance(value, str):
        return masked_text(value, hidden)
    return value


def shown(value: Any) -> str:
    """Any value as a page shows it (the template filter ``shown``): masked; mappings and
    lists as compact JSON; nothing as a dash."""
    value = masked(value)
    if isinstance(value, str):
        return value
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:g}"
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def masked_text(text: str, hidden: frozenset[str] = frozenset()) -> str:
    for secret in sorted(hidden, key=len, reverse=True):
        text = text.replace(secret, MASK)
    if not any(mark in text for mark in "=:-"):
        return text
    text = _URL_PASSWORD.sub(lambda m: m["head"] + MASK, text)
    for pattern in (_ASSIGNED, _FLAG):
        text = pattern.sub(lambda m: f"{m['key']}{m['sep']}{MASK}"
                           if secret_key(m["key"]) else m.group(0), text)
    return text


def _hidden(key: Any, item: Any) -> bool:
    return isinstance(key, str) and secret_key(key) and item not in (None, "")
