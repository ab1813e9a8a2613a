"""The Alembic migrations against bot/store/schema.py: a database migrated to head has
exactly the tables, columns and indexes schema.py declares; and revision 0010 fills the
console's columns (source, break-glass, failed checks, nodes) of executions made before it
exactly as the bot fills them for new ones."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config as AlembicConfig
from alembic.migration import MigrationContext
from sqlalchemy import Engine, MetaData, select, text

from bot.execution.engine import Engine as RunEngine
from bot.store import db
from bot.store.schema import execution_nodes, executions, metadata
from tests import postgres
from tests.bot import fakes
from tests.bot.execution.test_engine import record, runbook
from tests.conftest import BotFactory

COPIED = ("runbook_versions", "executions", "approvals", "step_states", "audit_events")
NEW = ("id", "source", "break_glass", "checks_failed")


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


# SQLite cannot reflect an expression index (ix_executions_finished): compared by its SQL
@pytest.mark.filterwarnings("ignore:Skipped unsupported reflection of expression-based index")
@pytest.mark.filterwarnings("ignore:autogenerate skipping metadata-specified expression-based")
def test_the_migrations_give_the_schema_of_schema_py(db_url: str) -> None:
    engine = db.connect(db_url)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        if conn.dialect.name == "sqlite":
            found = conn.execute(text("SELECT sql FROM sqlite_master WHERE name = "
                                      "'ix_executions_finished'")).scalar()
            assert "coalesce(finished_at, '9999-12-31T23:59:59.999999Z'), id" in str(found)


def migrate_to(engine: Engine, revision: str) -> None:
    config = AlembicConfig()
    config.set_main_option("script_location", str(db.MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def another_database(db_url: str, tmp_path: Path) -> str:
    if db_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'old.db'}"
    base = db_url.rsplit("/", 1)[0] + "/postgres"
    return postgres.fresh_database(base, f"t_{secrets.token_hex(6)}")


def test_revision_0010_fills_executions_made_before_it(make_bot: BotFactory, db_url: str,
                                                       tmp_path: Path) -> None:
    """Executions made by the bot (at head) are copied, in the columns revision 0009 has,
    into a database at 0009; upgrading it must give the columns and nodes the bot wrote."""
    bot = make_bot({"demo": runbook([record("a", "a")], pre_checks=[
        {"name": "gpu idle", "promql": "max(DCGM_FI_DEV_GPU_UTIL)", "expect": "< 5"}]),
        "fleet": runbook([record("a", "a")], name="fleet", risk="medium", locks=[],
                         params={"nodes": {"type": "nodes", "required": True},
                                 "requeue": {"type": "bool", "default": False,
                                             "weakens_guard": "changed"}})}, url=db_url)
    failing = bot.request("demo", {"node": "gpu04"}, "alice", source="schedule")
    engine = RunEngine(bot, sleep=lambda s: None)
    try:
        engine.drive(failing)
    finally:
        engine.close()
    bot.request("fleet", {"nodes": "gpu[01-02,04]", "requeue": "yes"}, "bob", source="window",
                break_glass=True)
    bot.request("fleet", {"nodes": "gpu03"}, "dave", source="chat")
    old = db.connect(another_database(db_url, tmp_path), migrate=False)
    migrate_to(old, "0009")
    _copy(bot.db, old)
    db.upgrade(old)
    assert _console_columns(old) == _console_columns(bot.db)
    with old.connect() as conn:
        assert conn.execute(select(executions.c.checks_failed)
                            .where(executions.c.id == failing)).scalar() == 1


def _copy(source: Engine, target: Engine) -> None:
    """The rows of the tables that exist at 0009, in the columns they had there."""
    shape = MetaData()
    shape.reflect(target, only=list(COPIED))
    with source.connect() as reading, target.begin() as writing:
        for name in COPIED:
            table = shape.tables[name]
            rows = [dict(row._mapping) for row in reading.execute(
                select(*(metadata.tables[name].c[column.name] for column in table.c)))]
            if rows:
                writing.execute(table.insert(), rows)


def _console_columns(engine: Engine) -> tuple[Any, ...]:
    with engine.connect() as conn:
        rows = conn.execute(select(*(executions.c[name] for name in NEW))
                            .order_by(executions.c.id)).all()
        nodes = conn.execute(select(execution_nodes).order_by(
            execution_nodes.c.execution_id, execution_nodes.c.node)).all()
    assert len(rows) == 3 and len(nodes) == 5
    return tuple(tuple(row) for row in rows), tuple(tuple(row) for row in nodes)
