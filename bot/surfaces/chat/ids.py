"""The IDs chat lines and buttons carry (executions, proposals, schedules, windows)."""

from __future__ import annotations

MAX_ID = 2**31 - 1  # IDs are INTEGER columns: PostgreSQL's hold no more (SQLite's 2**63 - 1)


def is_id(word: str) -> bool:
    """Whether ``word`` is an ID: ASCII digits (str.isdigit also takes "²", which int()
    refuses) of a number an ID column holds (a larger one fails the query, not "no such")."""
    return word.isascii() and word.isdigit() and len(word) <= 10 and int(word) <= MAX_ID
