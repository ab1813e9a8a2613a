"""Slurm hostlist expressions, in pure Python: ``gpu[01-04,07]`` <-> ``gpu01 gpu02 ...``.

Only names of ``[A-Za-z0-9._-]``, brackets, commas and ranges are accepted. ``size`` counts
the names of an expression from its ranges, without making any, and ``expand`` refuses an
expression whose size is over its ``limit`` (at most ``MAX_NAMES``) before making a name, so
``gpu[0-99999999]`` or ``gpu[0-9999,0-9999,...]`` is refused at once rather than eating
memory.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections.abc import Iterable

MAX_NAMES = 10_000
_MAX_DIGITS = 63  # a number in a range: no longer than a host name

_NAME_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")
_EXPR_CHARS = re.compile(r"^[A-Za-z0-9._\-\[\],]+$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TRAILING_DIGITS = re.compile(r"^(.*?)(\d+)$")
_Group = tuple[str, int]  # names sharing a prefix and the width of their numbers
_Range = tuple[int, int, int]  # width (of the lower bound, as written), low, high
_Piece = str | tuple[_Range, ...]  # literal text, or a bracket's ranges (no repeats)
_Part = tuple[_Piece, ...]


class TooMany(ValueError):
    """A hostlist naming more nodes than its caller allows: ``count`` over ``limit``."""

    def __init__(self, expression: str, count: int, limit: int) -> None:
        super().__init__(
            f"hostlist {_quoted(expression)} names {count:,} nodes, more than {limit:,}")
        self.expression = expression
        self.count = count
        self.limit = limit


def size(expression: str) -> int:
    """How many names ``expression`` gives, counted from its ranges without making them
    (``size("gpu[01-04,03-08],cpu1")`` is 9); ValueError for an invalid expression. A name
    written twice in one bracket or in two identical parts counts once; one that two
    different parts both give (``gpu[1-4],gpu4``) counts twice, so ``size`` is never under
    ``len(expand(expression))`` and equals it for any usual hostlist."""
    return sum(_count(part) for part in _parse(expression))


def expand(expression: str, limit: int = MAX_NAMES) -> list[str]:
    """All names of a hostlist expression, in order, without duplicates:
    ``expand("gpu[01-02],cpu7")`` gives ``["gpu01", "gpu02", "cpu7"]``. Zero padding is kept:
    the width of a range is the width of its lower bound, as in Slurm.

    ``TooMany`` (a ValueError naming the count and the limit) when the expression names
    more than ``limit`` nodes (never more than ``MAX_NAMES``): decided from the ranges when
    they give more than ``MAX_NAMES`` names, before any is made."""
    return list(_expanded(expression, limit))


def _expand(expression: str, limit: int) -> tuple[str, ...]:
    cap = min(limit, MAX_NAMES)
    parts = _parse(expression)
    listed = sum(_count(part) for part in parts)
    if listed > MAX_NAMES:
        raise TooMany(expression, listed, cap)
    names: list[str] = []
    seen: set[str] = set()
    for part in parts:
        for name in _names(part):
            if name not in seen:
                seen.add(name)
                names.append(name)
    if len(names) > cap:
        raise TooMany(expression, len(names), cap)
    return tuple(names)


def _quoted(text: str) -> str:
    """An expression (or a piece of it) for a message: quoted, and cut short when long."""
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _parse(expression: str) -> list[_Part]:
    """The parts of an expression, identical ones once, each as its literal pieces and its
    brackets' ranges (a number given twice in a bracket kept once, in first order)."""
    text = expression.strip()
    if not text:
        raise ValueError("empty hostlist: give node names like gpu07 or gpu[01-04,07]")
    if not _EXPR_CHARS.match(text):
        bad = sorted({c for c in text if not re.match(r"[A-Za-z0-9._\-\[\],]", c)})
        raise ValueError(
            f"hostlist {_quoted(expression)} contains {''.join(bad[:10])!r}: only letters, digits, "
            "'.', '_', '-', brackets, commas and ranges are allowed"
        )
    parts = dict.fromkeys(_split_top(text, expression))
    return [_parse_part(part, expression) for part in parts]


def _split_top(text: str, expression: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(text):
        if char == "[":
            if depth:
                raise ValueError(f"hostlist {_quoted(expression)}: nested '[' is not allowed")
            depth = 1
        elif char == "]":
            if not depth:
                raise ValueError(f"hostlist {_quoted(expression)}: ']' without a matching '['")
            depth = 0
        elif char == "," and not depth:
            parts.append(text[start:index])
            start = index + 1
    if depth:
        raise ValueError(f"hostlist {_quoted(expression)}: '[' is never closed")
    parts.append(text[start:])
    for part in parts:
        if not part:
            raise ValueError(
                f"hostlist {_quoted(expression)} has an empty name (two commas in a row?)")
    return parts


def _parse_part(part: str, expression: str) -> _Part:
    # Split "rack[1-2]-gpu[01-02]" into literal and bracket pieces.
    pieces: list[_Piece] = []
    for piece in re.split(r"(\[[^\]]*\])", part):
        if piece.startswith("["):
            pieces.append(_parse_ranges(piece[1:-1], expression))
        elif piece:
            pieces.append(piece)
    return tuple(pieces)


def _parse_ranges(inner: str, expression: str) -> tuple[_Range, ...]:
    """A bracket's ranges in order, each keeping only the numbers no earlier range of the
    same width gave: ``0-9999,0-9999`` is one range, not twenty thousand numbers."""
    if not inner:
        raise ValueError(f"hostlist {_quoted(expression)}: empty brackets '[]'")
    ranges: list[_Range] = []
    covered: dict[int, list[tuple[int, int]]] = {}  # width -> sorted, disjoint (low, high)
    for item in inner.split(","):
        match = _RANGE.match(item)
        if not match:
            raise ValueError(
                f"hostlist {_quoted(expression)}: {_quoted(item)} is not a number or a range "
                "like 01-04"
            )
        low_text, high_text = match.group(1), match.group(2) or match.group(1)
        if max(len(low_text), len(high_text)) > _MAX_DIGITS:
            raise ValueError(
                f"hostlist {_quoted(expression)}: {_quoted(item)} has a number of more than "
                f"{_MAX_DIGITS} digits")
        low, high = int(low_text), int(high_text)
        if high < low:
            raise ValueError(
                f"hostlist {_quoted(expression)}: range {_quoted(item)} runs backwards")
        for width, a, b in _by_spelling(len(low_text), low, high):
            ranges.extend((width, x, y) for x, y in _add(covered.setdefault(width, []), a, b))
    return tuple(ranges)


def _by_spelling(width: int, low: int, high: int) -> list[tuple[int, int, int]]:
    """``low..high`` zero-padded to ``width``, split where the padding stops: from
    10**(width-1) on a number is spelled as it is, as in any other width (``0-10`` and
    ``10`` both name gpu10), so that part is counted with the unpadded ones (width 1)."""
    natural = 10 ** (width - 1)
    pieces = [(width, low, min(high, natural - 1))] if width > 1 and low < natural else []
    if high >= natural or width == 1:
        pieces.append((1, max(low, natural) if width > 1 else low, high))
    return pieces


def _add(covered: list[tuple[int, int]], low: int, high: int) -> list[tuple[int, int]]:
    """The pieces of ``low..high`` not yet in ``covered``, which then covers it all."""
    first = bisect.bisect_left(covered, (low, low))
    if first and covered[first - 1][1] >= low - 1:
        first -= 1
    last = first
    fresh: list[tuple[int, int]] = []
    cursor = low
    while last < len(covered) and covered[last][0] <= high + 1:
        start, end = covered[last]
        if start > cursor:
            fresh.append((cursor, start - 1))
        cursor = max(cursor, end + 1)
        last += 1
    if cursor <= high:
        fresh.append((cursor, high))
    merged = covered[first:last]
    covered[first:last] = [(min([low, *(s for s, _ in merged)]),
                            max([high, *(e for _, e in merged)]))]
    return fresh


def _count(part: _Part) -> int:
    total = 1
    for piece in part:
        if not isinstance(piece, str):
            total *= sum(high - low + 1 for _, low, high in piece)
    return total


def _names(part: _Part) -> Iterable[str]:
    choices = [[piece] if isinstance(piece, str) else
               [str(number).zfill(width) for width, low, high in piece
                for number in range(low, high + 1)]
               for piece in part]
    return ("".join(combo) for combo in itertools.product(*choices))


def compress(names: Iterable[str]) -> str:
    """The shortest usual hostlist for ``names`` (sorted per prefix, duplicates dropped):
    ``["gpu01", "gpu02", "gpu04"]`` gives ``"gpu[01-02,04]"``."""
    return _compressed(tuple(names))


def _compress(names: tuple[str, ...]) -> str:
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


# The last results, kept: one run plans, checks and renders the same fleet's hostlist many
# times (each step's pool filter, each check). Pure functions of hashable arguments; an
# error is raised again each time (lru_cache keeps only results), and expand hands out a
# new list each call. At most 32 of each: under 20 MB even were each of MAX_NAMES names.
_expanded = functools.lru_cache(maxsize=32)(_expand)
_compressed = functools.lru_cache(maxsize=32)(_compress)
