"""Small PromQL helpers with no dependencies: escaping, selectors, expectations, durations.

``escape_label_value`` is what templates must use to put a value (a node name from a
chat message, a label from an alert) inside a double-quoted PromQL string: without it a
value like ``gpu07"} or vector(1) #`` would change the query. Alertmanager's matcher
syntax (``filter=node="gpu07"``) uses the same quoting, so its adapter uses it too.

``Expectation`` is the ``expect:`` of a check or of ``prom.wait``: a comparison such as
``== 0``, ``< 5`` or ``>= 1e3`` applied to a value. NaN satisfies nothing.

``series_text`` names a series by its whole label set, the way PromQL writes it:
``DCGM_FI_DEV_XID_ERRORS{Hostname="gpu01", gpu="3", instance="a:9400"}``.
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
    """``value`` escaped for a double-quoted PromQL (or Alertmanager matcher) string.

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
    """A comparison against a constant: ``Expectation.parse("< 5")(3.0) is True``."""

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


_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_seconds(value: str | float) -> float:
    """Seconds in a number or a duration like ``90s``, ``30m``, ``2h``, ``1h30m``, ``1d``."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or like 90s, 30m, 2h, 1h30m")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        raw, pos, seconds = value.strip(), 0, 0.0
        for match in _PART.finditer(raw):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if not raw or pos != len(raw):
            raise ValueError(f"{value[:40]!r} is not a duration: write a number of seconds "
                             "or a number with a unit, like 90s, 30m, 2h or 1h30m")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError("a duration must be a finite, non-negative number of seconds")
    return seconds


def format_seconds(seconds: float) -> str:
    """``2h``, ``1h30m``, ``45s``, ``1.5s``."""
    if seconds < 60 and seconds != int(seconds):
        return f"{seconds:.1f}s"
    whole, parts = int(seconds), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts) or "0s"
