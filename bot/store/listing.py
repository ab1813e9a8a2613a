"""The executions a filter selects (the console's, bot.surfaces.console.filters), among the
runbooks a viewer may see: one page of them in the chosen sort continued by a keyset cursor
(the last row's sort value and id, so a page never skips or repeats a row as rows are
added), all of them in batches (the downloads), and what a table shows beside each row:
the nodes (a hostlist) and the approvers. The console reads executions only through here."""

from __future__ import annotations

import base64
import binascii
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import ColumnElement, Select, bindparam, false, literal, select, true, tuple_
from sqlalchemy.engine import Connection

from bot.store.schema import (
    FINISHED_SORT,
    UNFINISHED,
    approvals,
    execution_nodes,
    executions,
    runbook_versions,
)
from kit import hostlist

c = executions.c
COLUMNS = (c.id, c.runbook, c.version, c.state, c.stage, c.requested_by, c.requested_at,
           c.finished_at, c.source, c.break_glass, c.checks_failed, c.error, c.change)


# Built once: every page runs these, and building a statement costs more than running it.
RUNBOOK_NAMES = select(runbook_versions.c.name).distinct().order_by(runbook_versions.c.name)
_NODES = select(execution_nodes.c.execution_id, execution_nodes.c.node).where(
    execution_nodes.c.execution_id.in_(bindparam("ids", expanding=True)))
_APPROVERS = select(approvals.c.execution_id, approvals.c.user).where(
    approvals.c.execution_id.in_(bindparam("ids", expanding=True)),
    approvals.c.decision == "approve").order_by(approvals.c.id)


class BadCursor(ValueError):
    """A page cursor this listing did not make, or one of another sort; the words say why."""


class Filter(Protocol):
    """What selects executions (bot.surfaces.console.filters.Filter is one): equal fields,
    states, a time range, break-glass and failed checks (any, yes, no), nodes."""

    @property
    def runbook(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def requester(self) -> str: ...
    @property
    def approver(self) -> str: ...
    @property
    def change(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def states(self) -> tuple[str, ...]: ...
    @property
    def since_at(self) -> str: ...
    @property
    def until_at(self) -> str: ...
    @property
    def break_glass(self) -> str: ...
    @property
    def failed_checks(self) -> str: ...
    @property
    def nodes(self) -> tuple[str, ...]: ...


class Sort(Protocol):
    """Their order (bot.surfaces.console.filters.Sort is one)."""

    @property
    def key(self) -> str: ...
    @property
    def descending(self) -> bool: ...
    @property
    def column(self) -> str: ...
    @property
    def order(self) -> str: ...


def runbook_names(conn: Connection) -> list[str]:
    """Every runbook the bot has recorded a version of."""
    return list(conn.execute(RUNBOOK_NAMES).scalars())


def matching(flt: Filter, allowed: Sequence[str] | None,
             columns: Iterable[Any] = COLUMNS) -> Select[Any]:
    """The executions ``flt`` selects among the runbooks ``allowed`` (None: all)."""
    query = select(*columns)
    if allowed is not None:
        query = query.where(scope_clause(allowed))
    equal = {"runbook": c.runbook, "version": c.version, "requester": c.requested_by,
             "source": c.source, "change": c.change}
    for name, column in equal.items():
        if getattr(flt, name):
            query = query.where(column == getattr(flt, name))
    if flt.states:
        query = query.where(c.state.in_(flt.states))
    if flt.since_at:
        query = query.where(c.requested_at >= flt.since_at)
    if flt.until_at:
        query = query.where(c.requested_at < flt.until_at)
    if flt.break_glass != "any":
        query = query.where(c.break_glass == (flt.break_glass == "yes"))
    if flt.failed_checks != "any":
        query = query.where(c.checks_failed > 0 if flt.failed_checks == "yes"
                            else c.checks_failed == 0)
    if flt.nodes:
        query = query.where(c.id.in_(select(execution_nodes.c.execution_id)
                                     .where(execution_nodes.c.node.in_(flt.nodes))))
    if flt.approver:
        query = query.where(c.id.in_(select(approvals.c.execution_id).where(
            approvals.c.user == flt.approver, approvals.c.decision == "approve")))
    return query


def sort_key(sort: Sort) -> ColumnElement[Any]:
    """The sort's column; for the finished time, an execution still under way sorts after
    every finished one (it will finish later), the same on every database (NULLs do not),
    by the expression ix_executions_finished indexes."""
    return FINISHED_SORT if sort.key == "finished" else c[sort.column]


def ordered(query: Select[Any], sort: Sort, reverse: bool = False) -> Select[Any]:
    """``query`` in the sort's order (``reverse``: backwards), ties broken by id."""
    key = sort_key(sort)
    descending = sort.descending != reverse
    return query.order_by(*((key.desc(), c.id.desc()) if descending else (key, c.id)))


@dataclass(frozen=True)
class Page:
    rows: list[dict[str, Any]]
    before: str | None  # the cursor of the page before this one, if there is one
    after: str | None  # the cursor of the page after it


def page(conn: Connection, flt: Filter, sort: Sort, allowed: Sequence[str] | None,
         size: int, *, after: str = "", before: str = "") -> Page:
    """One page of matching executions: the first, the one after ``after`` or the one
    before ``before`` (cursors of this sort; BadCursor for another's)."""
    if after and before:
        raise BadCursor("give after or before, not both")
    cursor = _decode(after or before, sort) if (after or before) else None
    backwards = bool(before)
    query = ordered(matching(flt, allowed), sort, reverse=backwards)
    if cursor is not None:
        position = tuple_(sort_key(sort), c.id)
        mark = tuple_(literal(cursor[0]), literal(cursor[1]))
        query = query.where(position < mark if sort.descending != backwards else position > mark)
    rows = [dict(row._mapping) for row in conn.execute(query.limit(size + 1))]
    more = len(rows) > size
    rows = rows[:size]
    if backwards:
        rows.reverse()
    if not rows:
        return Page([], None, None)
    first, last = _encode(sort, rows[0]), _encode(sort, rows[-1])
    if backwards:
        return Page(rows, first if more else None, last)
    return Page(rows, first if cursor is not None else None, last if more else None)


def decorate(conn: Connection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with ``nodes`` (a hostlist, "" for none) and ``approvers`` (in the order
    they approved), read for the rows given in two queries."""
    ids = [row["id"] for row in rows]
    nodes: defaultdict[int, list[str]] = defaultdict(list)
    approvers: defaultdict[int, list[str]] = defaultdict(list)
    if ids:
        for execution_id, node in conn.execute(_NODES, {"ids": ids}):
            nodes[execution_id].append(node)
        for execution_id, user in conn.execute(_APPROVERS, {"ids": ids}):
            if user not in approvers[execution_id]:
                approvers[execution_id].append(user)
    return [{**row, "nodes": _hostlist(nodes[row["id"]]),
             "approvers": approvers[row["id"]]} for row in rows]


def _hostlist(names: list[str]) -> str:
    if len(names) < 2:  # most executions touch one node: nothing to compress
        return names[0] if names else ""
    try:
        return hostlist.compress(names)
    except ValueError:  # a name a hostlist cannot hold: list them as they are
        return ",".join(sorted(names))


def _encode(sort: Sort, row: dict[str, Any]) -> str:
    value = row[sort.column]
    if sort.key == "finished" and value is None:
        value = UNFINISHED
    raw = json.dumps([sort.key, sort.order, value, row["id"]], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode(cursor: str, sort: Sort) -> tuple[str, int]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key, order, value, last_id = json.loads(raw)
    except (binascii.Error, ValueError, TypeError):
        raise BadCursor("the page cursor is not one this console made; start again from "
                        "the first page") from None
    if not isinstance(value, str) or not isinstance(last_id, int) or isinstance(last_id, bool):
        raise BadCursor("the page cursor is not one this console made; start again from "
                        "the first page")
    if (key, order) != (sort.key, sort.order):
        raise BadCursor(f"the page cursor belongs to another sort ({key} {order}, not "
                        f"{sort.key} {sort.order}): start again from the first page")
    return value, last_id


def scope_clause(allowed: Sequence[str] | None) -> ColumnElement[bool]:
    """The viewer's scope alone, as a condition on executions."""
    if allowed is None:
        return true()
    return c.runbook.in_(allowed) if allowed else false()


def params_of(conn: Connection, execution_id: int) -> dict[str, Any]:
    """The parameters an execution was requested with ({} when there is no such row)."""
    text = conn.execute(select(c.params).where(c.id == execution_id)).scalar()
    return dict(json.loads(text)) if text else {}


def batches(conn: Connection, flt: Filter, sort: Sort, allowed: Sequence[str] | None,
            size: int) -> Iterator[list[dict[str, Any]]]:
    """Every matching execution in the sort's order, with its parameters, ``size`` rows at a
    time, each batch decorated; read as they are used (a server-side cursor on PostgreSQL)."""
    query = ordered(matching(flt, allowed, (*COLUMNS, c.params)), sort)
    result = conn.execute(query.execution_options(stream_results=True, yield_per=size))
    for batch in result.partitions(size):
        yield decorate(conn, [dict(row._mapping) for row in batch])


def ids_matching(flt: Filter, allowed: Sequence[str] | None) -> Select[Any]:
    """The IDs of the matching executions, as a query to select their audit events by
    (bot.store.audit.events' ``executions_of``)."""
    return matching(flt, allowed, (c.id,))


def ids_of_change(change: str) -> Select[Any]:
    """The IDs of the executions requested with this change reference, as a query like
    ``ids_matching`` (``runbook audit export --change``)."""
    return select(c.id).where(c.change == change.strip())
