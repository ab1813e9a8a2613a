"""The executions the console lists: a filter read from the page's URL, and one page of
matching executions in a stable order, continued by an opaque cursor."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.engine import Connection

from bot.store.schema import executions
from bot.store.words import State
from bot.surfaces.console.app import BadRequest

FIELDS = ("runbook", "version", "requester", "state", "since", "until")


@dataclass(frozen=True)
class Filter:
    """What the viewer asked for; empty means any. Built by ``parse`` only."""

    values: Mapping[str, str]

    def get(self, name: str) -> str:
        return self.values.get(name, "")

    def query_string(self, **changes: str) -> str:
        from urllib.parse import urlencode

        merged = {**self.values, **changes}
        return urlencode({k: v for k, v in merged.items() if v})


def parse(query: Mapping[str, str]) -> Filter:
    """The filter from a URL's query; BadRequest names a value the page cannot use."""
    values = {name: query.get(name, "").strip() for name in FIELDS if query.get(name, "").strip()}
    for name, value in values.items():
        if len(value) > 200:
            raise BadRequest(f"{name}: at most 200 characters")
    state = values.get("state")
    if state and state not in {s.value for s in State}:
        raise BadRequest(f"state {state!r} is not one of: {', '.join(s.value for s in State)}")
    return Filter(values)


@dataclass(frozen=True)
class Page:
    rows: list[dict[str, Any]]
    next_cursor: str | None


def select_filtered(flt: Filter) -> Select[Any]:
    query = select(executions)
    c = executions.c
    if flt.get("runbook"):
        query = query.where(c.runbook == flt.get("runbook"))
    if flt.get("version"):
        query = query.where(c.version == flt.get("version"))
    if flt.get("requester"):
        query = query.where(c.requested_by == flt.get("requester"))
    if flt.get("state"):
        query = query.where(c.state == flt.get("state"))
    if flt.get("since"):
        query = query.where(c.requested_at >= flt.get("since"))
    if flt.get("until"):
        query = query.where(c.requested_at < flt.get("until"))
    return query


def page(conn: Connection, flt: Filter, cursor: str | None, size: int) -> Page:
    query = select_filtered(flt).order_by(executions.c.id.desc()).limit(size + 1)
    if cursor:
        query = query.where(executions.c.id < _decode(cursor))
    rows = [dict(row._mapping) for row in conn.execute(query)]
    more = len(rows) > size
    rows = rows[:size]
    return Page(rows, _encode(rows[-1]["id"]) if more and rows else None)


def _encode(last_id: int) -> str:
    return base64.urlsafe_b64encode(json.dumps([last_id]).encode()).decode().rstrip("=")


def _decode(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        (last_id,) = json.loads(raw)
    except (binascii.Error, ValueError, TypeError):
        raise BadRequest("the page cursor is not one this console made; start again from "
                         "the first page") from None
    if not isinstance(last_id, int):
        raise BadRequest("the page cursor is not one this console made")
    return last_id
