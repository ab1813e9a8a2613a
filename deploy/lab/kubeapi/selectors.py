"""Label selectors (string and LabelSelector objects) and the field selectors kubectl uses."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .errors import ApiError, Obj, bad_request

Matcher = Callable[[Obj], bool]
# One requirement: key, then =, ==, !=, in (...), notin (...), or nothing / a leading !.
_SET = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9_.-]*)|"
                  r"\s+(in|notin)\s*\(([^)]*)\))?\s*$")


def _split_requirements(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p for p in parts if p.strip()]


def label_matcher(text: str | None) -> Callable[[dict[str, str]], bool]:
    if not text:
        return lambda labels: True
    checks: list[Callable[[dict[str, str]], bool]] = []
    for req in _split_requirements(text):
        m = _SET.match(req)
        if not m:
            raise bad_request(f"unable to parse requirement: {req!r}")
        neg, key, op, value, setop, values = m.groups()
        checks.append(_requirement(key, neg == "!", op, value, setop, values))
    return lambda labels: all(check(labels) for check in checks)


def _requirement(key: str, negated: bool, op: str | None, value: str | None,
                 setop: str | None, values: str | None) -> Callable[[dict[str, str]], bool]:
    if op in ("=", "=="):
        return lambda labels: labels.get(key) == value
    if op == "!=":
        return lambda labels: labels.get(key) != value
    if setop:
        allowed = {v.strip() for v in (values or "").split(",") if v.strip()}
        if setop == "in":
            return lambda labels: labels.get(key) in allowed
        return lambda labels: labels.get(key) not in allowed
    if negated:
        return lambda labels: key not in labels
    return lambda labels: key in labels


def selector_matches(selector: Obj | None, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector; an empty selector matches everything (as in a PDB)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    return all(_expression(expr, labels) for expr in selector.get("matchExpressions") or [])


def _expression(expr: Obj, labels: dict[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator"), expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    return op == "DoesNotExist" and key not in labels


def _field_value(obj: Obj, path: str) -> Any:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


# Field paths the real server supports per kind (others answer 400).
FIELDS = {
    "*": {"metadata.name", "metadata.namespace"},
    "Pod": {"spec.nodeName", "status.phase", "spec.restartPolicy", "spec.schedulerName",
            "spec.serviceAccountName", "status.podIP", "status.nominatedNodeName"},
    "Node": {"spec.unschedulable"},
}


def narrowing(label_text: str | None, field_text: str | None) -> tuple[
        tuple[tuple[str, str], ...], str | None]:
    """The equality requirements the store's indexes answer: label key=value pairs and a
    field selector's spec.nodeName=NODE (not an empty one: unscheduled pods are not in the
    node index). Parsed after the matchers, which refuse a malformed selector."""
    pairs = []
    for req in _split_requirements(label_text or ""):
        m = _SET.match(req)
        if m and m.group(1) == "" and m.group(3) in ("=", "=="):
            pairs.append((m.group(2), m.group(4) or ""))
    node = None
    for req in _split_requirements(field_text or ""):
        m = re.match(r"^\s*spec\.nodeName\s*(==|=)\s*(.*?)\s*$", req)
        if m and m.group(2):
            node = m.group(2)
    return tuple(pairs), node


def field_matcher(text: str | None, kind: str) -> Matcher:
    if not text:
        return lambda obj: True
    checks: list[Matcher] = []
    allowed = FIELDS["*"] | FIELDS.get(kind, set())
    for req in _split_requirements(text):
        m = re.match(r"^\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*$", req)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{req}'")
        path, op, value = m.groups()
        if path not in allowed:
            raise ApiError(400, "BadRequest",
                           f'field label not supported: {path}')
        if op == "!=":
            checks.append(lambda obj, p=path, v=value: _field_value(obj, p) != v)
        else:
            checks.append(lambda obj, p=path, v=value: _field_value(obj, p) == v)
    return lambda obj: all(check(obj) for check in checks)
