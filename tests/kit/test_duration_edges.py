"""Durations at their edges (kit.durations): zero and fractions as numbers, the exact message
for each kind of refusal (what a person reads to fix a runbook), and where a fraction of a
second stops being printed.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from kit.durations import format_duration, parse_duration

FORMS = "a duration is a number with a unit, like 90s, 30m, 2h or 1h30m"


@pytest.mark.parametrize(("number", "seconds"), [(0, 0.0), (0.5, 0.5), (0.0, 0.0)])
def test_zero_and_fractions_are_durations(number: float, seconds: float) -> None:
    assert parse_duration(number) == seconds


@pytest.mark.parametrize(("value", "message"), [
    (True, FORMS),
    (None, FORMS),
    ([1], FORMS),
    (math.inf, "a duration must be a finite number of seconds"),
    (-0.5, "a duration cannot be negative"),
])
def test_each_refusal_says_what_is_wrong(value: Any, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_duration(value)
    assert str(refused.value) == message


def test_text_that_is_no_duration_is_quoted_to_forty_characters() -> None:
    text = "x" * 39 + "yz"
    with pytest.raises(ValueError) as refused:
        parse_duration(text)
    assert str(refused.value) == (f'"{"x" * 39}y" is not a duration: write a number with a '
                                  "unit, like 90s, 30m, 2h or 1h30m")


def test_a_duration_too_long_is_quoted_to_forty_characters() -> None:
    with pytest.raises(ValueError) as refused:
        parse_duration("9" * 5000 + "d")
    assert str(refused.value) == f'"{"9" * 40}" is too long a duration'


@pytest.mark.parametrize(("seconds", "text"), [(59.5, "59.5s"), (60.5, "1m"), (61.5, "1m1s")])
def test_fractions_are_printed_below_a_minute_only(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
