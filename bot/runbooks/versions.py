"""Runbook versions: the first content seen for a name+version is the only one accepted.

Changing a runbook means bumping its version; the old content stays in the
database so ``runbook diff`` can show what changed between any two versions.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from sqlalchemy import Connection, select, text

from bot.runbooks.loading import LoadedRunbook
from bot.store import audit
from bot.store.db import now_iso
from bot.store.schema import runbook_versions
from bot.store.words import Kind

_PG_VERSIONS_LOCK = 0x6772_7276  # advisory lock key: serialises recording on PostgreSQL


class VersionConflict(Exception):
    """Same name and version, different content."""


@dataclass(frozen=True)
class Version:
    name: str
    version: str
    content_hash: str
    first_seen: str
    source: str


def record(conn: Connection, loaded: LoadedRunbook, actor: str) -> None:
    """Record name+version on first sight; refuse other content under a known version."""
    rb = loaded.runbook
    if conn.dialect.name == "postgresql":
        # Replicas starting together record the same versions: one at a time, or the
        # second insert of a name+version fails with a duplicate key.
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_VERSIONS_LOCK})
    row = conn.execute(
        select(runbook_versions.c.content_hash, runbook_versions.c.first_seen).where(
            runbook_versions.c.name == rb.name, runbook_versions.c.version == rb.version
        )
    ).first()
    if row is None:
        conn.execute(runbook_versions.insert().values(
            name=rb.name, version=rb.version, content_hash=loaded.content_hash,
            source=loaded.source, first_seen=now_iso(),
        ))
        audit.append(conn, Kind.RUNBOOK_VERSION_RECORDED, actor, {
            "runbook": rb.name, "version": rb.version, "content_hash": loaded.content_hash,
            "path": loaded.path.name,
        })
    elif row.content_hash != loaded.content_hash:
        raise VersionConflict(
            f"{loaded.path}: {rb.name} {rb.version} was first seen on {row.first_seen} with "
            f"content sha256 {row.content_hash[:12]}…; this file has {loaded.content_hash[:12]}…. "
            "Bump the version when you change a runbook."
        )


def listing(conn: Connection, name: str) -> list[Version]:
    rows = conn.execute(
        select(runbook_versions).where(runbook_versions.c.name == name)
        .order_by(runbook_versions.c.first_seen)
    )
    return [Version(**dict(row._mapping)) for row in rows]


def pair(conn: Connection, name: str, old: str, new: str) -> tuple[Version, Version]:
    """The two recorded versions to compare; KeyError saying which was never seen."""
    known = {v.version: v for v in listing(conn, name)}
    for wanted in (old, new):
        if wanted not in known:
            seen = ", ".join(known) or "none"
            raise KeyError(f"{name} {wanted} has never been seen (known versions: {seen})")
    return known[old], known[new]


def before(conn: Connection, name: str, version: str) -> Version | None:
    """The version first seen just before ``version`` (None: it is the first, or unknown)."""
    found = listing(conn, name)
    place = next((i for i, v in enumerate(found) if v.version == version), None)
    return found[place - 1] if place else None


def diff(conn: Connection, name: str, old: str, new: str) -> str:
    first, second = pair(conn, name, old, new)
    lines = difflib.unified_diff(
        first.source.splitlines(keepends=True),
        second.source.splitlines(keepends=True),
        fromfile=f"{name} {old}", tofile=f"{name} {new}",
    )
    return "".join(lines)
