"""Connecting to the database (``connect`` makes ``db``, a SQLAlchemy Engine) and bringing
its schema up to date.

It makes the handle and migrates; it queries none of the bot's own tables.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Connection and Engine re-exported: the surfaces name the types from here, never sqlalchemy
from sqlalchemy import Connection as Connection
from sqlalchemy import Engine as Engine
from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from bot.config import DB_URL_ENV, database_url_problem, default_database_url
from bot.store.revision import HEAD_REVISION as HEAD_REVISION  # a new migration moves it

MIGRATIONS = Path(__file__).parent / "migrations"
_PG_MIGRATE_LOCK = 0x6772_6D67  # advisory lock key: one replica migrates at a time
READ_ONLY_OPTION = "bot_read_only"
# conn.execution_options(**READ_ONLY) before its first statement: a connection that only
# reads (SQLite begins it deferred; PostgreSQL reads without locks anyway)
READ_ONLY = {READ_ONLY_OPTION: True}


class DatabaseError(Exception):
    """The database cannot be reached or prepared; the message says which and why."""


def shown_url(url: str) -> str:
    """The database URL as it may be printed: the password hidden."""
    return make_url(url).render_as_string(hide_password=True)


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def connect(url: str, *, migrate: bool = True, create: bool = True) -> Engine:
    """An Engine for ``url`` with the schema at the head revision. A URL the bot does not
    support (its scheme, or a driver that is not installed) is a DatabaseError naming the
    supported ones, never a traceback.

    With ``create=False`` (what the bot's commands pass: the configuration's
    ``database.create``) a database that is not there (no SQLite file, or no bot schema in
    it or in the PostgreSQL database) is a DatabaseError naming ``runbook db init``: a
    mistyped URL never starts a new, empty audit log. A SQLite file's folder is never made.
    """
    engine = _engine(url)
    if not create:
        _refuse_missing(engine)
    if migrate:
        upgrade(engine)
    return engine


def init(url: str) -> bool:
    """``runbook db init``: the database at the head revision, made if it is not there;
    True when it was made (or had no bot schema yet)."""
    engine = _engine(url)
    try:
        made = _revision_or_none(engine) is None
        upgrade(engine)
    finally:
        engine.dispose()
    return made


def _refuse_missing(engine: Engine) -> None:
    if _revision_or_none(engine) is not None:
        return
    engine.dispose()
    where = engine.url.render_as_string(hide_password=True)
    database = engine.url.database
    what = (f"there is no database {where}" if engine.url.get_backend_name() == "sqlite"
            and database and not Path(database).exists() else
            f"the database {where} holds no bot schema (it was never initialised)")
    raise DatabaseError(f"{what}: `runbook db init` creates it (or `database: {{create: "
                        "true}` in the configuration); the bot does not create one by itself, "
                        "so that a mistyped URL cannot start a new, empty audit log")


def _revision_or_none(engine: Engine) -> str | None:
    """The schema revision, None when there is no database or no schema in it yet. A SQLite
    file is read read-only: looking must not turn a stranger's file into a database."""
    database = engine.url.database
    try:
        if engine.url.get_backend_name() == "sqlite" and database and database != ":memory:":
            return _sqlite_revision(Path(database))
        return current_revision(engine)
    except Exception as exc:  # any driver error: say which database and why
        raise DatabaseError(f"cannot open the database "
                            f"{engine.url.render_as_string(hide_password=True)}: {exc}") from exc


def _sqlite_revision(path: Path) -> str | None:
    if not path.exists() or path.stat().st_size == 0:
        return None  # connecting would make it a database
    with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True,
                                 timeout=30)) as conn:
        try:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise
    return None if row is None else str(row[0])


def _engine(url: str) -> Engine:
    problem = database_url_problem(url)
    if problem is None:
        try:
            parsed = make_url(url)
        except ArgumentError:
            problem = "not a database URL: sqlite:///PATH or postgresql://USER@HOST/DATABASE"
    if problem is not None:
        raise DatabaseError(f"the database URL (database_url or {DB_URL_ENV}): {problem}")
    try:
        if parsed.get_backend_name() == "sqlite":
            engine = _sqlite_engine(url)
        else:
            if parsed.drivername == "postgresql":  # psycopg 3 rather than psycopg2
                url = str(parsed.set(drivername="postgresql+psycopg").render_as_string(False))
            engine = create_engine(url, pool_pre_ping=True)
    except ImportError as exc:
        raise DatabaseError(
            f"the database driver for {parsed.drivername}:// is not installed ({exc.name}): "
            "install the bot with its postgres extra (pip install 'gpu-runbook-bot[postgres]')"
        ) from None
    return engine


def _sqlite_engine(url: str) -> Engine:
    """SQLite (the default) gets WAL and ``BEGIN IMMEDIATE`` so that writers from several
    processes (an engine, a person approving from another terminal) serialise instead of
    failing with "database is locked"; PostgreSQL serialises the audit chain with an
    advisory lock instead (bot.store.audit)."""
    database = make_url(url).database
    if database and database != ":memory:" and not Path(database).parent.is_dir():
        if url == default_database_url():  # db init makes the bot's own state folder
            raise DatabaseError(f"there is no database {url} yet: `runbook db init` creates "
                                "it (the only command that does)")
        raise DatabaseError(f"the folder {Path(database).parent} of the database {url} does "
                            "not exist: the bot never creates a database's folder (a mistyped "
                            "path would start a new audit log); create it, then `runbook db "
                            "init`")
    engine = create_engine(url, connect_args={"timeout": 30})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # let BEGIN below be ours
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # a connection that only reads (READ_ONLY) takes a snapshot and no writer lock, so
        # that a long read (a streamed export) never holds the engine's writes back
        read_only = conn.get_execution_options().get(READ_ONLY_OPTION)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        if not inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def upgrade(engine: Engine) -> None:
    """Run Alembic migrations up to head when the database is behind: the check is one
    query, so commands stay quick to start."""
    try:
        if current_revision(engine) == HEAD_REVISION:
            return
        from alembic import command
        from alembic.config import Config as AlembicConfig

        config = AlembicConfig()
        config.set_main_option("script_location", str(MIGRATIONS))
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                # Replicas starting together on a new database: one migrates, the others
                # wait here, then find the schema at head and change nothing.
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                             {"key": _PG_MIGRATE_LOCK})
            config.attributes["connection"] = conn
            command.upgrade(config, "head")
    except Exception as exc:  # any driver error: say which database and why
        if isinstance(exc, DatabaseError):
            raise
        raise DatabaseError(
            f"cannot prepare the database {engine.url.render_as_string(hide_password=True)}: "
            f"{exc}"
        ) from exc
