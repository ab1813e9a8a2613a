"""Durations (kit.durations): the forms people write, the errors for anything else, and the
shortest readable form for printing.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from kit.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("1d", 86400),
     ("250ms", 0.25), (" 5m ", 300), ("0s", 0), (45, 45), (1.5, 1.5),
     ("1.5h", 5400), ("0.5s", 0.5), ("1w", 604800), ("2w3d", 1468800)],
)
def test_parse(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "value",
    ["", "5", "90", "2 hours", "1h 30m", "h", "-5m", ".5h", "1.h", "5x", "inf", "\u0663m", "1e3s",
     True, -1, math.inf, math.nan,
     "1" + "0" * 400 + "s", "9" * 5000 + "d", None, [1]],
)
def test_refused(value: Any) -> None:  # Any: some are not even of a type it accepts
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(7200, "2h"), (5400, "1h30m"), (45, "45s"), (1.5, "1.5s"), (0, "0s"), (90061, "1d1h1m1s")],
)
def test_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("text", ["2h", "1h30m", "45s", "1d1h1m1s"])
def test_round_trip(text: str) -> None:
    assert format_duration(parse_duration(text)) == text
