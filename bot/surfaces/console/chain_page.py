"""GET /ui/chain, for auditors only: the audit chain's head, its last verifications (each a
``chain_verified`` event: they survive restarts and are audited themselves), the checkpoint
file against the log, and the archives, each with the audit_archived event that proves it.
POST /ui/chain/verify runs bot.store.audit.verify now, records the result, and sends the
browser back to the page (303)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from starlette.responses import RedirectResponse, Response

from bot.service import Service
from bot.store import audit, checkpoints, queries
from bot.store.db import Connection
from bot.store.words import Kind
from bot.surfaces.console.app import PREFIX, SECURITY_HEADERS, Ask, PageRoute

SHOWN_VERIFICATIONS = 10
_VERIFYING = threading.Lock()  # one walk of the chain at a time (a double click runs one)


@dataclass(frozen=True)
class CheckpointState:
    file: str  # "" when none is configured
    note: str  # what is known, in words
    count: int = 0
    last: checkpoints.Checkpoint | None = None
    problems: list[str] = field(default_factory=list)


def chain(ask: Ask) -> Response:
    if not ask.viewer.auditor:
        return _refused(ask)
    with ask.service.db.connect() as conn:
        head = audit.last(conn)
        start = audit.start(conn)
        start_problem = audit.start_problem(conn)
        verifications = queries.verifications(conn, SHOWN_VERIFICATIONS)
        archives = _archives(conn)
    return ask.page("chain.html", head=head, start=start, start_problem=start_problem,
                    verifications=verifications, archives=archives,
                    checkpoint=checkpoint_state(ask.service), running=_VERIFYING.locked())


def _archives(conn: Connection) -> list[dict[str, Any]]:
    """The archives, newest first, each with the audit_archived event in the log that records
    exactly it (``record``: its position and who made it), or None: a row alone proves
    nothing, so who it names is not shown as who made it."""
    records = audit.records(conn)
    found = []
    for row in queries.archives(conn):
        record = next(({"seq": seq, "actor": actor} for seq, actor, data in records
                       if all(data.get(name) == row[name] for name in audit.ARCHIVE_FIELDS)),
                      None)
        found.append({**row, "record": record})
    return found


def verify_now(ask: Ask) -> Response:
    """Walk the whole chain now (slow on a big log: a worker thread of the server waits for
    it) and record who ran it and what it found, as an audit event."""
    if not ask.viewer.auditor:
        return _refused(ask)
    if not _VERIFYING.acquire(blocking=False):  # the page says one is running
        return RedirectResponse(f"{PREFIX}/chain", 303, headers=SECURITY_HEADERS)
    try:
        verdict = audit.verify(ask.service.db)
        with ask.service.db.begin() as conn:
            audit.append(conn, Kind.CHAIN_VERIFIED, ask.viewer.name, {
                "ok": verdict.ok, "checked": verdict.events, "head": verdict.head,
                "problem": verdict.problem, "problem_seq": verdict.seq, "by": ask.viewer.name,
                "surface": "console"})
    finally:
        _VERIFYING.release()
    return RedirectResponse(f"{PREFIX}/chain", 303, headers=SECURITY_HEADERS)


def checkpoint_state(service: Service) -> CheckpointState:
    """The checkpoint file (audit.checkpoint_file) compared with the log now."""
    path = service.config.audit.checkpoint_file
    if path is None:
        return CheckpointState("", "no checkpoint file is configured (audit.checkpoint_file): "
                                   "a cut or rewritten tail of the log would not show")
    if not path.exists():
        return CheckpointState(str(path), "no checkpoint has been written to it yet")
    try:
        points = checkpoints.read(path)
        count, problems = checkpoints.check(service.db, path)
    except checkpoints.CheckpointError as exc:
        return CheckpointState(str(path), "", problems=[str(exc)])
    note = "the log agrees with every checkpoint" if not problems else ""
    return CheckpointState(str(path), note, count, points[-1] if points else None, problems)


def _refused(ask: Ask) -> Response:
    return ask.console.error(403, "the audit chain is for auditors (console.auditors)",
                             ask.viewer)


ROUTES: list[PageRoute] = [("/chain", chain, ("GET",)),
                           ("/chain/verify", verify_now, ("POST",))]
