"""Durations as people write them: ``90s``, ``30m``, ``2h``, ``1h30m``, ``1.5h``, ``1d``, ``1w``.

The one duration grammar of the bot and its adapters (runbooks, configuration, chat).
A number alone is seconds; text needs a unit, so ``"90"`` is refused (is it seconds?).
"""

from __future__ import annotations

import math
import re

_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d|w)")  # ASCII digits only
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_duration(text: str | int | float) -> float:
    """Seconds in ``text``; raises ValueError with the accepted forms."""
    if isinstance(text, bool):
        raise ValueError("a duration is a number with a unit, like 90s, 30m, 2h or 1h30m")
    if isinstance(text, int | float):
        if not math.isfinite(text):
            raise ValueError("a duration must be a finite number of seconds")
        if text < 0:
            raise ValueError("a duration cannot be negative")
        return float(text)
    if not isinstance(text, str):
        raise ValueError("a duration is a number with a unit, like 90s, 30m, 2h or 1h30m")
    raw = text.strip()
    pos, total = 0, 0.0
    for match in _PART.finditer(raw):
        if match.start() != pos:
            break
        try:
            total += float(match.group(1)) * _UNITS[match.group(2)]
        except (ValueError, OverflowError):  # more digits than a number can hold
            total = math.inf
        pos = match.end()
    if not raw or pos != len(raw):
        raise ValueError(
            f'"{text[:40]}" is not a duration: write a number with a unit, '
            "like 90s, 30m, 2h or 1h30m"
        )
    if not math.isfinite(total):
        raise ValueError(f'"{text[:40]}" is too long a duration')
    return total


def format_duration(seconds: float) -> str:
    """The shortest readable form: ``2h``, ``1h30m``, ``45s``, ``1.5s``."""
    if seconds < 60 and seconds != int(seconds):
        return f"{seconds:.1f}s"
    whole = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts) or "0s"
