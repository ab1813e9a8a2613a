"""Whose drain a Slurm node's reason is: the grammar of the reasons the bot writes.

Every reason the bot writes ends with its mark: ``(execution N)`` for a node it drained to
work on it, ``(execution N: failed check)`` for a node it left out because a check failed.
Another owner's reason (a person's, Slurm's, NHC's) is kept, the bot's joined after it with
`` ++ ``; its undo takes back only its own part. Only the bot's own health check may lift
a node health check's GPU drain (a prefix of ``slurm.health_check_drains``), as NHC would.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from adapters.slurm.backend import NodeInfo

PLACEHOLDER = "(execution <this execution>)"  # the mark, as plans show it
MAX_REASON = 200  # what the bot writes at most (Slurm keeps longer, people read less)
JOIN = " ++ "
KEPT = 80  # of another owner's reason at least, when ours is long
_MARK = re.compile(r"\s*\(execution (\d+)(: failed check)?\)$")


@dataclass(frozen=True)
class Part:
    """One owner's reason inside a node's reason."""

    text: str
    execution: int | None  # the bot's execution that wrote it; None: somebody else's
    failed_check: bool = False

    def said(self) -> str:
        """The reason without the bot's mark."""
        return _MARK.sub("", self.text)

    def owner(self) -> str:
        if self.execution is None:
            return "someone else (not the bot)"
        if self.failed_check:
            return f"the bot for a failed check (execution {self.execution})"
        return f"the bot (execution {self.execution})"


def mark(execution_id: int, failed_check: bool = False) -> str:
    return f"(execution {execution_id}{': failed check' if failed_check else ''})"


def marked(reason: str, execution_id: int, failed_check: bool = False) -> str:
    """``reason`` with the bot's mark, cut to fit MAX_REASON."""
    tail = " " + mark(execution_id, failed_check)
    return reason[:MAX_REASON - len(tail)].rstrip() + tail


def parts(reason: str) -> list[Part]:
    """The owners' parts of a node's reason, in the order they were written."""
    found = []
    for text in (reason.split(JOIN) if reason else []):
        match = _MARK.search(text)
        found.append(Part(text, int(match.group(1)), bool(match.group(2))) if match
                     else Part(text, None))
    return found


def _cut(reason: str, size: int) -> str:
    """``reason`` in ``size`` characters, a bot's mark at its end kept whole."""
    if len(reason) <= size:
        return reason
    match = _MARK.search(reason)
    tail = reason[match.start():] if match else ""
    return reason[:max(0, size - len(tail))].rstrip(" +") + tail


def joined(existing: str, ours: str) -> str:
    """Another owner's reason kept, ours after it, within MAX_REASON: the other's is cut
    first, but never below KEPT characters (a long verdict of ours would erase why the node
    was drained), then ours; a cut keeps the mark at the end of either whole."""
    head = existing.strip()
    if not head:
        return ours
    head = _cut(head, max(KEPT, MAX_REASON - len(JOIN) - len(ours)))
    return head + JOIN + _cut(ours, MAX_REASON - len(JOIN) - len(head))


def without(reason: str, execution_id: int) -> str:
    """The reason with this execution's parts taken out ("" when only they were there)."""
    return JOIN.join(p.text for p in parts(reason) if p.execution != execution_id)


def answered(part: Part, health_drains: Iterable[str]) -> bool:
    """Somebody else's part that a node health check wrote (one of ``health_drains``'
    prefixes): a health check of the bot that passes answers it."""
    return part.execution is None and any(
        prefix and part.text.startswith(prefix) for prefix in health_drains)


def blocking(reason: str, health_drains: Iterable[str] = ()) -> Part | None:
    """The first part that a return to service must not lift: somebody else's reason, or
    the bot's for a failed check. None when every part is a bot drain made to work on the
    node (which a check that passes answers), or, for a health check of the bot (which
    passes ``health_drains``), a node health check's drain it answers too."""
    if not reason.strip():
        return Part("(no reason given)", None)
    drains = tuple(health_drains)
    return next((p for p in parts(reason) if (p.execution is None or p.failed_check)
                 and not answered(p, drains)), None)


def held_by(reason: str) -> frozenset[int]:
    """The bot's executions a drain reason names: they hold the node out."""
    return frozenset(p.execution for p in parts(reason) if p.execution is not None)


def not_liftable(nodes: Iterable[NodeInfo],
                 health_drains: Iterable[str] = ()) -> dict[str, str]:
    """Drained nodes a return to service must leave (another owner's reason or the bot's
    for a failed check), with whose drain it is; ``health_drains``: see blocking()."""
    drains = tuple(health_drains)
    found = {}
    for node in nodes:
        stop = blocking(node.reason, drains) if "DRAIN" in node.flags else None
        if stop is not None:
            found[node.name] = f'drained by {stop.owner()}: "{stop.text}"'
    return found
