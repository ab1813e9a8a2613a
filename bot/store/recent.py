"""The recent executions that locked each of some nodes (the node view), in ONE query for all
of them, through SQLAlchemy or, for a SQLite file already at the head revision, through the
standard library's sqlite3 alone: ``runbook node`` then starts without importing SQLAlchemy.

Same rows as ``bot.execution.executions.find(conn, node=...)`` (``execution_nodes``), newest
first, without reading the plans.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.store.revision import HEAD_REVISION

CHUNK = 500  # nodes per query: SQLite allows only so many bound parameters
COLUMNS = ("node", "id", "runbook", "state", "requested_at", "requested_by", "params")
_RANKED = """
SELECT node, id, runbook, state, requested_at, requested_by, params FROM (
  SELECT en.node AS node, e.id AS id, e.runbook AS runbook, e.state AS state,
         e.requested_at AS requested_at, e.requested_by AS requested_by, e.params AS params,
         ROW_NUMBER() OVER (PARTITION BY en.node ORDER BY e.id DESC) AS ranked
  FROM execution_nodes en JOIN executions e ON e.id = en.execution_id
  WHERE en.node IN ({names})
) recent WHERE ranked <= :per_node ORDER BY node, id DESC
"""


@dataclass(frozen=True)
class SqliteFile:
    """A SQLite database file whose schema is at the head revision (``quick_sqlite``)."""

    path: Path


def quick_sqlite(url: str) -> SqliteFile | None:
    """The file of a ``sqlite:///FILE`` URL when it exists and is at the head revision;
    None for anything else (another database, a query string, a file to create or migrate:
    bot.store.db.connect does those)."""
    scheme, sep, rest = url.partition(":///")
    if not sep or scheme not in ("sqlite", "sqlite+pysqlite") or "?" in rest or not rest:
        return None
    path = Path(rest)
    if not path.is_file():
        return None
    try:
        with _open(path) as conn:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return None
    return SqliteFile(path) if row is not None and row[0] == HEAD_REVISION else None


def by_node(db: Any, nodes: Sequence[str], per_node: int) -> list[dict[str, Any]]:
    """Rows (``COLUMNS``) of the last ``per_node`` executions of each node, by node then
    newest first. ``db``: a SqliteFile or a SQLAlchemy Engine."""
    found: list[dict[str, Any]] = []
    for start in range(0, len(nodes), CHUNK):
        chunk = nodes[start:start + CHUNK]
        sql = _RANKED.format(names=", ".join(f":n{i}" for i in range(len(chunk))))
        params: dict[str, Any] = {f"n{i}": name for i, name in enumerate(chunk)}
        params["per_node"] = per_node
        found += _rows(db, sql, params)
    return found


def _rows(db: Any, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    if isinstance(db, SqliteFile):
        with _open(db.path) as conn:  # sqlite3 takes the same :name parameters
            return [dict(zip(COLUMNS, row, strict=True)) for row in conn.execute(sql, params)]
    from sqlalchemy import text

    with db.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(text(sql), params)]



def _open(path: Path) -> closing[sqlite3.Connection]:
    """A sqlite3 connection that waits for a writer as long as the bot's engine does."""
    return closing(sqlite3.connect(path, timeout=30, isolation_level=None))
