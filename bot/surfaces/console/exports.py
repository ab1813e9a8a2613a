"""Downloads of exactly what the executions page's filter selects: the executions
(/ui/executions.csv, .jsonl) and their audit events (/ui/events.jsonl, .csv, in the format
of ``runbook audit export``, secrets hidden; ``scope=all``: the whole log in a time range as
stored, for auditors). They stream: read with a server-side cursor, sent as they come."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from starlette.responses import Response, StreamingResponse

from bot.store import audit, listing
from bot.store.db import READ_ONLY, Connection, Engine
from bot.surfaces.console import filters, scope
from bot.surfaces.console.app import SECURITY_HEADERS, Ask, BadRequest, PageRoute
from bot.surfaces.console.filters import Filter
from kit.canonical import canonical

BATCH = 1000  # executions read at a time (with their nodes and approvers)
PIECE = 65536  # characters sent at a time
FIELDS = ("id", "runbook", "version", "state", "stage", "requested_by", "requested_at",
          "finished_at", "source", "break_glass", "checks_failed", "nodes", "approvers",
          "error", "params", "change")
MEDIA = {"csv": "text/csv; charset=utf-8", "jsonl": "application/jsonl; charset=utf-8"}


def executions_export(fmt: str) -> Callable[[Ask], Response]:
    def handler(ask: Ask) -> Response:
        flt, sort, _ = filters.parse(ask.query.multi_items(), extra=("sort", "order"))
        with ask.service.db.connect() as conn:
            allowed = scope.runbooks_in_scope(conn, ask.viewer, ask.service.config)

        def produce(conn: Connection) -> Iterator[str]:
            return _pieces(_execution_lines(listing.batches(conn, flt, sort, allowed, BATCH),
                                            fmt))

        return _download(ask.service.db, produce, _filename("executions", flt, fmt), fmt)

    return handler


def events_export(fmt: str) -> Callable[[Ask], Response]:
    def handler(ask: Ask) -> Response:
        flt, _, rest = filters.parse(ask.query.multi_items(), extra=("scope",))
        whole = _whole_log(ask, flt, rest.get("scope", "executions"))
        with ask.service.db.connect() as conn:
            allowed = scope.runbooks_in_scope(conn, ask.viewer, ask.service.config)
        among = None if whole else listing.ids_matching(flt, allowed)

        def produce(conn: Connection) -> Iterator[str]:
            rows = (audit.events(conn, since=flt.since_at or None, until=flt.until_at or None)
                    if whole else _masked(conn, audit.events(conn, executions_of=among)))
            if fmt == "csv" and not whole:  # the whole log stays as stored: it proves itself
                rows = ({**row, "actor": _cell(row["actor"]), "kind": _cell(row["kind"])}
                        for row in rows)
            return (piece for piece, _ in audit.lines(rows, fmt))

        name = _filename("audit-events" if whole else "events", flt, fmt)
        return _download(ask.service.db, produce, name, fmt)

    return handler


def _masked(conn: Connection, rows: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Events masked as every page shows them: the values of secret-looking keys in their
    data, and the execution's secret parameter values wherever they appear (an operation
    line, an error, a reason); only the whole log (scope=all, for auditors) is as stored."""
    hidden_of: dict[Any, frozenset[str]] = {}
    for row in rows:
        execution_id = row.get("execution_id")
        if execution_id not in hidden_of:
            hidden_of[execution_id] = _hidden_values(conn, execution_id)
        yield {**row, "data": scope.masked(row["data"], hidden_of[execution_id])}


def _hidden_values(conn: Connection, execution_id: Any) -> frozenset[str]:
    """The secret parameter values of an execution (scope.secret_values), else none."""
    if execution_id is None:
        return frozenset()
    return scope.secret_values(listing.params_of(conn, int(execution_id)))


def _whole_log(ask: Ask, flt: Filter, scope_word: str) -> bool:
    """``scope=all``: every event in the time range, as ``runbook audit export`` gives it;
    otherwise the events of the filtered executions (their time range: when requested)."""
    if scope_word not in ("executions", "all"):
        raise BadRequest(f"scope {scope_word[:60]!r} is not executions or all")
    if scope_word == "executions":
        return False
    if not ask.viewer.auditor:
        raise BadRequest("scope=all (every event of the log) is for auditors; without it you "
                         "get the events of the executions you may see")
    if not flt.only_time():
        raise BadRequest("scope=all takes only since and until (it is the whole log in a time "
                         "range); drop the other filters, or drop scope=all")
    return True


def _execution_lines(batches: Iterator[list[dict[str, Any]]], fmt: str) -> Iterator[str]:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=FIELDS) if fmt == "csv" else None
    if writer is not None:
        writer.writeheader()
        yield _drain(buffer)
    for batch in batches:
        for row in batch:
            record = {name: row[name] for name in FIELDS}
            record["break_glass"] = bool(record["break_glass"])
            raw = json.loads(record["params"])
            hidden = scope.secret_values(raw)
            record["params"] = scope.masked(raw, hidden)
            record["error"] = scope.masked(record["error"], hidden)
            if writer is None:
                yield canonical(record) + "\n"
                continue
            writer.writerow({name: _cell(value) for name, value in {
                **record, "approvers": " ".join(record["approvers"]),
                "params": canonical(record["params"])}.items()})
            yield _drain(buffer)


def _cell(value: Any) -> Any:
    """A text cell a spreadsheet would take for a formula (=, +, -, @, a tab or a carriage
    return first) gets a leading apostrophe: opening the file runs nothing (OWASP's advice
    on CSV injection), in executions.csv and a requester's events.csv. The whole log
    (scope=all, for auditors) stays as stored, as `runbook audit export` writes it."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def _drain(buffer: io.StringIO) -> str:
    text = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    return text


def _pieces(lines: Iterator[str]) -> Iterator[str]:
    """Lines gathered into pieces of about PIECE characters: fewer, larger writes."""
    gathered: list[str] = []
    size = 0
    for line in lines:
        gathered.append(line)
        size += len(line)
        if size >= PIECE:
            yield "".join(gathered)
            gathered, size = [], 0
    if gathered:
        yield "".join(gathered)


def stream(db: Engine, produce: Callable[[Connection], Iterator[str]]) -> Iterator[bytes]:
    """The pieces ``produce`` makes, read only as the client takes them, on a read-only
    connection (on SQLite: no writer lock) held until the last one or until the client
    goes away."""
    with db.connect() as conn:
        conn.execution_options(**READ_ONLY)
        for piece in produce(conn):
            yield piece.encode()


def _download(db: Engine, produce: Callable[[Connection], Iterator[str]], name: str,
              fmt: str) -> Response:
    headers = {**SECURITY_HEADERS, "Content-Disposition": f'attachment; filename="{name}"'}
    return StreamingResponse(stream(db, produce), media_type=MEDIA[fmt], headers=headers)


def _filename(what: str, flt: Filter, fmt: str) -> str:
    """``executions_runbook-drain-node_state-failed.csv``: the filter, in a safe name."""
    words = [f"{name}-{value}" for name, value in flt.params()] or ["all"]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", "_".join([what, *words])).strip("-")
    return f"{stem[:150]}.{fmt}"


ROUTES: list[PageRoute] = [
    ("/executions.csv", executions_export("csv"), ("GET",)),
    ("/executions.jsonl", executions_export("jsonl"), ("GET",)),
    ("/events.jsonl", events_export("jsonl"), ("GET",)),
    ("/events.csv", events_export("csv"), ("GET",)),
]
