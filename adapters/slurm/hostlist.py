"""Slurm hostlist expressions, in pure Python: ``gpu[01-04,07]`` <-> ``gpu01 gpu02 ...``.

Only names of ``[A-Za-z0-9._-]``, brackets, commas and ranges are accepted, and at most
``MAX_NAMES`` of them, so a typo like ``gpu[1-99999999]`` is refused rather than eating memory.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

MAX_NAMES = 10_000

_NAME_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")
_EXPR_CHARS = re.compile(r"^[A-Za-z0-9._\-\[\],]+$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TRAILING_DIGITS = re.compile(r"^(.*?)(\d+)$")
_Group = tuple[str, int]  # names sharing a prefix and the width of their numbers


def expand(expression: str) -> list[str]:
    """All names of a hostlist expression, in order, without duplicates:
    ``expand("gpu[01-02],cpu7")`` gives ``["gpu01", "gpu02", "cpu7"]``. Zero padding is kept:
    the width of a range is the width of its lower bound, as in Slurm."""
    text = expression.strip()
    if not text:
        raise ValueError("empty hostlist: give node names like gpu07 or gpu[01-04,07]")
    if not _EXPR_CHARS.match(text):
        bad = sorted({c for c in text if not re.match(r"[A-Za-z0-9._\-\[\],]", c)})
        raise ValueError(
            f"hostlist {expression!r} contains {''.join(bad)!r}: only letters, digits, "
            "'.', '_', '-', brackets, commas and ranges are allowed"
        )
    names: list[str] = []
    seen: set[str] = set()
    for part in _split_top(text, expression):
        for name in _expand_one(part, expression):
            if name not in seen:
                seen.add(name)
                names.append(name)
                if len(names) > MAX_NAMES:
                    raise ValueError(
                        f"hostlist {expression!r} expands to more than {MAX_NAMES} names"
                    )
    return names


def _split_top(text: str, expression: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current = ""
    for char in text:
        if char == "[":
            if depth:
                raise ValueError(f"hostlist {expression!r}: nested '[' is not allowed")
            depth = 1
        elif char == "]":
            if not depth:
                raise ValueError(f"hostlist {expression!r}: ']' without a matching '['")
            depth = 0
        if char == "," and not depth:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError(f"hostlist {expression!r}: '[' is never closed")
    parts.append(current)
    for part in parts:
        if not part:
            raise ValueError(f"hostlist {expression!r} has an empty name (two commas in a row?)")
    return parts


def _expand_one(part: str, expression: str) -> list[str]:
    # Split "rack[1-2]-gpu[01-02]" into literal and bracket pieces.
    pieces = re.split(r"(\[[^\]]*\])", part)
    choices: list[list[str]] = []
    total = 1
    for piece in pieces:
        if piece.startswith("["):
            values = _expand_range_list(piece[1:-1], expression)
            choices.append(values)
            total *= len(values)
            if total > MAX_NAMES:
                raise ValueError(
                    f"hostlist {expression!r} expands to more than {MAX_NAMES} names"
                )
        elif piece:
            choices.append([piece])
    names = ["".join(combo) for combo in itertools.product(*choices)]
    for name in names:
        if not _NAME_CHARS.match(name):
            raise ValueError(f"hostlist {expression!r}: {name!r} is not a valid node name")
    return names


def _expand_range_list(inner: str, expression: str) -> list[str]:
    if not inner:
        raise ValueError(f"hostlist {expression!r}: empty brackets '[]'")
    values: list[str] = []
    for item in inner.split(","):
        match = _RANGE.match(item)
        if not match:
            raise ValueError(
                f"hostlist {expression!r}: {item!r} is not a number or a range like 01-04"
            )
        low_text, high_text = match.group(1), match.group(2)
        low = int(low_text)
        high = int(high_text) if high_text is not None else low
        if high < low:
            raise ValueError(f"hostlist {expression!r}: range {item!r} runs backwards")
        if high - low + 1 > MAX_NAMES:
            raise ValueError(f"hostlist {expression!r} expands to more than {MAX_NAMES} names")
        width = len(low_text)
        values.extend(str(number).zfill(width) for number in range(low, high + 1))
    return values


def compress(names: Iterable[str]) -> str:
    """The shortest usual hostlist for ``names`` (sorted per prefix, duplicates dropped):
    ``["gpu01", "gpu02", "gpu04"]`` gives ``"gpu[01-02,04]"``."""
    order, groups = _group(_unique(names))
    parts = []
    for entry in order:
        if isinstance(entry, str):
            parts.append(entry)
            continue
        prefix, width = entry
        numbers = sorted(set(groups[entry]))
        if len(numbers) == 1:
            parts.append(prefix + str(numbers[0]).zfill(width))
        else:
            parts.append(f"{prefix}[{','.join(_ranges(numbers, width))}]")
    return ",".join(parts)


def _unique(names: Iterable[str]) -> list[str]:
    """The names in order without duplicates; ValueError for an invalid name or none."""
    unique: list[str] = []
    seen: set[str] = set()
    for name in names:
        if not _NAME_CHARS.match(name):
            raise ValueError(f"{name!r} is not a valid node name")
        if name not in seen:
            seen.add(name)
            unique.append(name)
    if not unique:
        raise ValueError("cannot compress an empty list of node names")
    return unique


def _group(names: list[str]) -> tuple[list[_Group | str], dict[_Group, list[int]]]:
    """Names by (prefix, width of the trailing number; 0: not zero-padded), in order of first
    appearance; a name without a trailing number stands alone (a str in the order)."""
    split: list[tuple[str, str | None]] = []
    padded_widths: dict[str, set[int]] = {}
    for name in names:
        match = _TRAILING_DIGITS.match(name)
        if match is None:
            split.append((name, None))
            continue
        prefix, digits = match.group(1), match.group(2)
        split.append((prefix, digits))
        if len(digits) > 1 and digits.startswith("0"):
            padded_widths.setdefault(prefix, set()).add(len(digits))
    groups: dict[_Group, list[int]] = {}
    order: list[_Group | str] = []
    for prefix, digits in split:
        if digits is None:
            order.append(prefix)
            continue
        padded = len(digits) > 1 and digits.startswith("0")
        width = len(digits) if padded or len(digits) in padded_widths.get(prefix, set()) else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(digits))
    return order, groups


def _ranges(numbers: list[int], width: int) -> list[str]:
    """Sorted numbers as ranges: [1, 2, 3, 5] -> ["1-3", "5"] (zero-padded to ``width``)."""
    ranges: list[str] = []
    start = previous = numbers[0]
    for number in [*numbers[1:], None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        low, high = str(start).zfill(width), str(previous).zfill(width)
        ranges.append(low if start == previous else f"{low}-{high}")
        if number is not None:
            start = previous = number
    return ranges
