"""Small PromQL helpers with no dependencies: escaping, selectors, expectations, series names.

A value put into a query (a node name from a chat message, a label from an alert) goes in
through template.py (``build``, a runbook's query template), which escapes it with
``escape_label_value`` and proves the query's structure; nothing here talks to Prometheus.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def escape_label_value(value: str) -> str:
    """``value`` escaped for a double-quoted PromQL (or Alertmanager matcher) string:
    without it a value like ``gpu07"} or vector(1) #`` would change the query.

    Backslash, double quote and newline are escaped (``\\\\``, ``\\"``, ``\\n``); the
    result goes between double quotes: ``f'node="{escape_label_value(node)}"'``.
    """
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def check_label_name(name: str) -> str:
    """``name`` if it is a valid label name, else ValueError (names are never escaped)."""
    if not _LABEL_NAME.match(name):
        raise ValueError(f"{name!r} is not a label name (letters, digits and _, "
                         "not starting with a digit)")
    return name


def label_matcher(name: str, value: str, op: str = "=") -> str:
    """One matcher, e.g. ``hostname="gpu07"``; ``op`` is one of = != =~ !~."""
    if op not in ("=", "!=", "=~", "!~"):
        raise ValueError(f"{op!r} is not a label matcher operator (=, !=, =~, !~)")
    return f'{check_label_name(name)}{op}"{escape_label_value(value)}"'


def selector(metric: str, labels: Mapping[str, str] | None = None) -> str:
    """``metric{a="x",b="y"}`` with every value escaped (equality matchers)."""
    if not _METRIC_NAME.match(metric):
        raise ValueError(f"{metric!r} is not a metric name")
    inner = ",".join(label_matcher(name, value) for name, value in (labels or {}).items())
    return f"{metric}{{{inner}}}" if inner else metric


def series_text(labels: Mapping[str, str]) -> str:
    """A series named by every one of its labels: ``name{a="x", b="y"}`` (values escaped,
    labels sorted); ``{...}`` when it has no metric name, ``{}`` when it has no label."""
    name = labels.get("__name__", "")
    shown = name if _METRIC_NAME.match(name) else ""
    inner = ", ".join(f'{k}="{escape_label_value(str(v))}"' for k, v in sorted(labels.items())
                      if not (shown and k == "__name__"))
    return f"{shown}{{{inner}}}"


def format_value(value: float) -> str:
    """A sample value as Prometheus writes it: ``79``, ``0.5``, ``NaN``, ``+Inf``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.15g}"


_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<=": operator.le, ">=": operator.ge,
    "<": operator.lt, ">": operator.gt,
}
_EXPECT = re.compile(r"^\s*(==|!=|<=|>=|<|>)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


@dataclass(frozen=True)
class Expectation:
    """The ``expect:`` of a check or of ``prom.wait``, a comparison against a constant such
    as ``== 0``, ``< 5`` or ``>= 1e3``: ``Expectation.parse("< 5")(3.0) is True``. NaN
    satisfies nothing."""

    op: str
    threshold: float

    @classmethod
    def parse(cls, text: str) -> Expectation:
        match = _EXPECT.match(text)
        if not match:
            raise ValueError(f"{text!r} is not an expectation: write an operator and a number, "
                             "like == 0, != 0, < 5, <= 5, > 1 or >= 1")
        return cls(match.group(1), float(match.group(2)))

    def __call__(self, value: float) -> bool:
        if math.isnan(value):
            return False
        return _OPERATORS[self.op](value, self.threshold)

    def __str__(self) -> str:
        return f"{self.op} {self.threshold:g}"
