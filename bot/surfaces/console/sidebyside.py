"""Two texts side by side, line against line (difflib): the rows of a two-column diff, each
marked removed, added, changed or same in words as well as by the page's colours. In a block
of changed lines, a line faces the most similar one across (as ``difflib.ndiff`` pairs)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

SIMILAR = 0.5  # lines at least this alike face each other as one changed line
MAX_PAIRING = 60  # a changed block longer than this on a side is not paired line by line


@dataclass(frozen=True)
class Row:
    old_number: int | None  # None: no line on that side
    old: str
    new_number: int | None
    new: str
    change: str  # same, removed, added, changed

    @property
    def old_marker(self) -> str:
        return "−" if self.change in ("removed", "changed") else ""

    @property
    def new_marker(self) -> str:
        return "+" if self.change in ("added", "changed") else ""


def rows(old_text: str, new_text: str) -> list[Row]:
    old, new = old_text.splitlines(), new_text.splitlines()
    found: list[Row] = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            found += [Row(i + 1, old[i], j + 1, new[j], "same")
                      for i, j in zip(range(i1, i2), range(j1, j2), strict=True)]
        else:
            found += _block(old, new, i1, i2, j1, j2)
    return found


def _block(old: list[str], new: list[str], i1: int, i2: int, j1: int, j2: int) -> list[Row]:
    """Removed lines old[i1:i2] against added lines new[j1:j2]: the most similar pair faces
    each other as a changed line, and the lines before and after it are paired the same
    way; lines alike to none stand alone."""
    if i1 == i2 or j1 == j2 or (i2 - i1) * (j2 - j1) > MAX_PAIRING ** 2:
        return ([Row(i + 1, old[i], None, "", "removed") for i in range(i1, i2)]
                + [Row(None, "", j + 1, new[j], "added") for j in range(j1, j2)])
    best, at = SIMILAR, (-1, -1)
    matcher = difflib.SequenceMatcher(autojunk=False)
    for j in range(j1, j2):
        matcher.set_seq2(new[j])
        for i in range(i1, i2):
            matcher.set_seq1(old[i])
            if matcher.real_quick_ratio() > best and matcher.quick_ratio() > best and (
                    ratio := matcher.ratio()) > best:
                best, at = ratio, (i, j)
    i, j = at
    if i < 0:
        return _block(old, new, i1, i2, j2, j2) + _block(old, new, i2, i2, j1, j2)
    return [*_block(old, new, i1, i, j1, j), Row(i + 1, old[i], j + 1, new[j], "changed"),
            *_block(old, new, i + 1, i2, j + 1, j2)]
