"""Helpers of the executions table's tests: a database seeded with varied executions written
straight into the tables (ties in time, unfinished ones, hostlists, denials), the same rows
as a Python model that filters and sorts them independently of the SQL, and a client of the
console's real ASGI application with an identity (the proxy header from 127.0.0.1)."""

from __future__ import annotations

import asyncio
import random
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, func, select
from starlette.applications import Starlette
from starlette.routing import Mount

from bot.service import Service
from bot.store import audit, db
from bot.store.schema import (
    UNFINISHED,
    approvals,
    audit_events,
    execution_nodes,
    executions,
    runbook_versions,
)
from bot.store.words import Kind
from bot.surfaces.console.filters import Filter, Sort
from bot.surfaces.console.pages import console
from tests import postgres

RUNBOOKS = ("drain", "resume", "swap")
USERS = ("alice", "bob", "carol", "dave")
SOURCES = ("cli", "chat", "alert", "schedule", "window")
STATES = ("succeeded", "failed", "running", "awaiting_approval", "cancelled")
NODES = tuple(f"gpu{n:02d}" for n in range(1, 9))
START = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
CONSOLE = {"proxy": {"trusted": ["127.0.0.1"]}, "auditors": ["user:carol"]}


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Row:
    id: int
    runbook: str
    version: str
    state: str
    requested_by: str
    requested_at: str
    finished_at: str | None
    source: str
    break_glass: bool
    checks_failed: int
    nodes: frozenset[str]
    approvers: frozenset[str]
    change: str | None = None  # the request's change reference (change=REF)


def seeded_database(request: Any, folder: Path) -> tuple[str, list[Row]]:
    """A database of each kind (``request.param``: sqlite or postgres) seeded once, for the
    tests of a module that only read it."""
    if request.param == "sqlite":
        url = f"sqlite:///{folder / 'seeded.db'}"
    else:
        server = request.getfixturevalue("postgres_server")
        url = postgres.fresh_database(server.url, f"seeded_{secrets.token_hex(6)}")
    engine = db.connect(url)
    try:
        return url, seed(engine)
    finally:
        engine.dispose()


def seed(engine: Engine, count: int = 60, seed_value: int = 7) -> list[Row]:
    """``count`` executions (three at each time: ties), their nodes and decisions, one
    audit event each; returns them as the model sees them."""
    rng = random.Random(seed_value)
    rows = [_row(rng, i + 1) for i in range(count)]
    with engine.begin() as conn:
        for name in RUNBOOKS:
            conn.execute(runbook_versions.insert().values(
                name=name, version="1.0.0", content_hash="0" * 64, source="", first_seen=""))
        for row in rows:
            _insert(conn, row, rng)
    return rows


def _row(rng: random.Random, number: int) -> Row:
    state = rng.choice(STATES)
    requested = START + timedelta(minutes=(number - 1) // 3)
    finished = None if state in ("running", "awaiting_approval") else stamp(
        requested + timedelta(seconds=rng.randint(1, 5000)))
    return Row(number, rng.choice(RUNBOOKS), rng.choice(("1.0.0", "1.1.0")), state,
               rng.choice(USERS), stamp(requested), finished, rng.choice(SOURCES),
               rng.random() < 0.2, rng.choice((0, 0, 0, 1, 2)),
               frozenset(rng.sample(NODES, rng.randint(0, 3))),
               frozenset(rng.sample(USERS, rng.randint(0, 2))),
               # from the number, not the generator: the other columns stay as they were
               f"CHG{1000 + number % 3}" if number % 4 == 0 else None)


def _insert(conn: Any, row: Row, rng: random.Random) -> None:
    conn.execute(executions.insert().values(
        id=row.id, runbook=row.runbook, version=row.version, content_hash="0" * 64,
        params='{"reason":"seeded","token":"s3cret"}', requested_by=row.requested_by,
        requested_at=row.requested_at, state=row.state, stage="steps", plan="{}",
        plan_hash="1" * 64, approvals_required=1, resume="restart", cancel_requested=False,
        resume_requested=False, fencing_token=0, finished_at=row.finished_at,
        source=row.source, break_glass=row.break_glass, checks_failed=row.checks_failed,
        change=row.change))
    for node in sorted(row.nodes):
        conn.execute(execution_nodes.insert().values(node=node, execution_id=row.id))
    for user in sorted(row.approvers):
        conn.execute(approvals.insert().values(execution_id=row.id, user=user,
                                               decision="approve", plan_hash="1" * 64, at=""))
    denier = rng.choice([u for u in USERS if u not in row.approvers])
    conn.execute(approvals.insert().values(execution_id=row.id, user=denier, decision="deny",
                                           plan_hash="2" * 64, at=""))
    audit.append(conn, Kind.REQUESTED, row.requested_by,
                 {"runbook": row.runbook, "source": row.source}, row.id)


def expected(rows: list[Row], flt: Filter, sort: Sort,
             allowed: tuple[str, ...] | None = None) -> list[int]:
    """The ids ``flt`` selects among ``rows``, in the sort's order: the model of the SQL."""
    def keep(row: Row) -> bool:
        return all((
            allowed is None or row.runbook in allowed,
            not flt.runbook or row.runbook == flt.runbook,
            not flt.version or row.version == flt.version,
            not flt.requester or row.requested_by == flt.requester,
            not flt.approver or flt.approver in row.approvers,
            not flt.source or row.source == flt.source,
            not flt.change or row.change == flt.change,
            not flt.states or row.state in flt.states,
            not flt.since_at or row.requested_at >= flt.since_at,
            not flt.until_at or row.requested_at < flt.until_at,
            flt.break_glass == "any" or row.break_glass == (flt.break_glass == "yes"),
            flt.failed_checks == "any" or (row.checks_failed > 0) == (
                flt.failed_checks == "yes"),
            not flt.nodes or bool(row.nodes & set(flt.nodes)),
        ))

    def key(row: Row) -> tuple[str, int]:
        value = getattr(row, sort.column)
        return (UNFINISHED if value is None else value), row.id

    return [row.id for row in sorted(filter(keep, rows), key=key, reverse=sort.descending)]


class Client:
    """GETs through the console's real application, mounted at /ui as ``runbook serve``
    mounts it, from 127.0.0.1 with the proxy's X-Forwarded-User."""

    def __init__(self, bot: Service) -> None:
        self.app = Starlette(routes=[Mount("/ui", app=console(bot))])

    def get(self, url: str, user: str | None = "carol") -> httpx.Response:
        headers = {"X-Forwarded-User": user} if user else {}

        async def fetch() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app, client=("127.0.0.1", 40000))
            async with httpx.AsyncClient(transport=transport, base_url="http://console") as web:
                return await web.get(url, headers=headers)

        return asyncio.run(fetch())


def snapshot(engine: Engine) -> tuple[Any, ...]:
    """What a read must not change: the log's length and head, and every execution's row
    version and state."""
    with engine.connect() as conn:
        return (conn.execute(select(func.count()).select_from(audit_events)).scalar(),
                audit.last(conn),
                tuple(conn.execute(select(executions.c.id, executions.c.row_version,
                                          executions.c.state).order_by(executions.c.id))))
