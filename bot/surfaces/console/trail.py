"""One execution's story from its audit events, for its page: the plans it had, each step's
attempts (do and undo) with durations, every check with its values and verdict, and who
steered it. Event data is masked (scope.masked) as it is read; nothing here writes."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bot.store import queries
from bot.store.db import Connection
from bot.store.words import Kind
from bot.surfaces.console import chainmarks
from bot.surfaces.console.scope import masked
from bot.surfaces.rendering import event_detail

STARTS: dict[str, str] = {Kind.STEP_STARTED: "do", Kind.UNDO_STARTED: "undo"}
ENDS: dict[str, str] = {Kind.STEP_FINISHED: "do", Kind.STEP_FAILED: "do",
                        Kind.UNDO_FINISHED: "undo", Kind.UNDO_FAILED: "undo"}
SKIPS: dict[str, str] = {Kind.STEP_SKIPPED: "do", Kind.UNDO_SKIPPED: "undo"}
PLAN_KINDS = frozenset({Kind.PLANNED, Kind.REPLANNED, Kind.APPROVAL_VOIDED,
                        Kind.APPROVAL_MISSING, Kind.PREAPPROVAL_VOIDED})
STEERING = frozenset({Kind.REQUESTED, Kind.STARTED, Kind.CANCEL_REQUESTED,
                      Kind.RESUME_REQUESTED, Kind.HELD, Kind.RESUMED, Kind.EXPIRED,
                      Kind.LOCK_TAKEN_OVER, Kind.LOCKS_LENT, Kind.LOCKS_RETURNED,
                      Kind.LOCKS_RELEASED, Kind.FINISHED})


@dataclass(frozen=True)
class Event:
    seq: int
    ts: str
    kind: str
    actor: str
    data: dict[str, Any]  # masked
    hash: str
    prev_hash: str
    mark: chainmarks.Mark
    detail: str  # one line, masked


@dataclass
class Attempt:
    """One attempt of a step (phase do) or of its undo, or a skip."""

    phase: str
    step: str
    attempt: int
    started: str
    action: str = ""
    operations: list[str] = field(default_factory=list)
    finished: str | None = None
    state: str = "running"  # running, succeeded, failed, skipped
    summary: str = ""
    error: str = ""
    changed: bool | None = None
    will_retry: bool = False
    seqs: list[int] = field(default_factory=list)

    @property
    def duration(self) -> str:
        return duration(self.started, self.finished) if self.finished else ""


@dataclass(frozen=True)
class Check:
    stage: str
    name: str
    kind: str
    spec: Any
    expect: Any
    value: Any
    passed: bool | None  # None: skipped
    detail: str
    ts: str
    seq: int


def events(conn: Connection, execution_id: int,
           hidden: frozenset[str] = frozenset()) -> list[Event]:
    """Every audit event of the execution, in chain order, each with its chain mark; data
    masked, ``hidden`` values too (scope.secret_values of its parameters)."""
    rows = queries.stored_events(conn, execution_id)
    checked = chainmarks.marks(conn, [dict(row) for row in rows])
    found = []
    for row in rows:
        data = masked(_data(row["data"]), hidden)
        found.append(Event(int(row["seq"]), str(row["ts"]), str(row["kind"]), str(row["actor"]),
                           data, str(row["hash"]), str(row["prev_hash"]),
                           checked[int(row["seq"])], _detail(row, data)))
    return found


def attempts(trail: Iterable[Event]) -> list[Attempt]:
    """Step attempts and skips in the order they started; an end without its start (an
    event lost or edited) still shows."""
    found: list[Attempt] = []
    under_way: dict[tuple[str, str, int], Attempt] = {}
    for event in trail:
        data, kind = event.data, event.kind
        phase = STARTS.get(kind) or ENDS.get(kind) or SKIPS.get(kind)
        if phase is None or "step" not in data:
            continue  # the undo's own start ({"reason"}) is shown beside the attempts
        key = (phase, str(data["step"]), _int(data.get("attempt")))
        if kind in ENDS and key in under_way:
            attempt = under_way.pop(key)
        else:
            attempt = Attempt(phase, key[1], key[2], event.ts)
            found.append(attempt)
        attempt.seqs.append(event.seq)
        if kind in STARTS:
            attempt.action = str(data.get("action", ""))
            attempt.operations = [str(op) for op in data.get("operations") or []]
            under_way[key] = attempt
        elif kind in ENDS:
            _end(attempt, event)
        else:
            attempt.finished, attempt.state = event.ts, "skipped"
            attempt.summary = str(data.get("why", ""))
    return found


def _end(attempt: Attempt, event: Event) -> None:
    data = event.data
    attempt.finished = event.ts
    attempt.state = str(data.get("state") or ("failed" if "error" in data else "succeeded"))
    attempt.summary = str(data.get("summary") or "")
    attempt.error = str(data.get("error") or "")
    attempt.changed = data.get("changed") if isinstance(data.get("changed"), bool) else None
    attempt.will_retry = bool(data.get("will_retry"))


def checks(trail: Iterable[Event]) -> list[Check]:
    found = []
    for event in trail:
        data = event.data
        if event.kind == Kind.CHECK_EVALUATED:
            found.append(Check(str(data.get("stage", "")), str(data.get("check", "")),
                               str(data.get("kind", "")), data.get("spec"), data.get("expect"),
                               data.get("value"), data.get("passed") is True,
                               str(data.get("detail", "")), event.ts, event.seq))
        elif event.kind == Kind.CHECK_SKIPPED:
            found.append(Check(str(data.get("stage", "")), str(data.get("check", "")), "", None,
                               None, None, None, str(data.get("why", "skipped")), event.ts,
                               event.seq))
    return found


def of_kinds(trail: Iterable[Event], kinds: Iterable[str]) -> list[Event]:
    wanted = set(kinds)
    return [event for event in trail if event.kind in wanted]


def undo_starts(trail: Iterable[Event]) -> list[Event]:
    """The undo's beginnings (why it undid), not its steps' attempts."""
    return [event for event in trail if event.kind == Kind.UNDO_STARTED
            and "step" not in event.data]


def duration(start: str, end: str) -> str:
    try:
        seconds = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except ValueError:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes // 60}h {minutes % 60:02d}m {rest:02d}s" if minutes >= 60 else (
        f"{minutes}m {rest:02d}s")


def _data(raw: Any) -> dict[str, Any]:
    """Stored event data; text that is not a JSON object (an edited event) is shown as is."""
    try:
        data = json.loads(raw)
    except (TypeError, ValueError):
        return {"stored data (not JSON)": str(raw)}
    return data if isinstance(data, dict) else {"stored data": data}


def _detail(row: Any, data: dict[str, Any]) -> str:
    try:
        return event_detail({**row, "data": data})
    except (KeyError, TypeError, ValueError, AttributeError):  # an edited event's odd shape
        return json.dumps(data, sort_keys=True, ensure_ascii=False, default=str)[:300]


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0
