"""The cursors of the audit log's destinations (bot.store.shipping) on SQLite and
PostgreSQL: made once, moved only from where they were (two leaders at once lose nothing),
and migration 0009 adding them to a log at 0008."""

from __future__ import annotations

import threading

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import inspect

from adapters.otlp.client import OtlpClient
from adapters.otlp.config import OtlpConfig
from bot.runtime.shipping import Shipper
from bot.store import audit, db, shipping
from tests.adapters.receivers import OtlpSink
from tests.bot.runtime.test_shipping import FAST, until, write


def test_a_cursor_is_made_once_and_moves_only_from_where_it_was(db_url: str) -> None:
    engine = db.connect(db_url)
    first = shipping.cursor(engine, "syslog://logs:514")
    assert first == shipping.Cursor("syslog://logs:514", 0, "", 0, 0)
    assert shipping.cursor(engine, "syslog://logs:514") == first
    assert shipping.move(engine, first, 5, "h5", skipped=2)
    assert not shipping.move(engine, first, 7, "h7")  # another leader moved it meanwhile
    moved = shipping.cursor(engine, "syslog://logs:514")
    assert (moved.seq, moved.hash, moved.skipped) == (5, "h5", 2)
    assert shipping.move(engine, moved, 9, "h9", rejected=1)
    assert [c.seq for c in shipping.all_cursors(engine)] == [9]
    assert shipping.all_cursors(engine)[0].rejected == 1


def test_two_leaders_at_once_lose_nothing(db_url: str, otlp_sink: OtlpSink) -> None:
    """A split brain (two replicas each believing it leads): duplicates, never a gap."""
    engine = db.connect(db_url)
    stop = threading.Event()
    shippers = [Shipper(engine, OtlpClient(OtlpConfig(endpoint=otlp_sink.endpoint)), FAST,
                        lambda line: None) for _ in range(2)]
    threads = [threading.Thread(target=s.run, args=(stop,)) for s in shippers]
    for thread in threads:
        thread.start()
    try:
        write(engine, 200, 20, 0.002)
        name = shippers[0].destination.name
        until(lambda: shipping.cursor(engine, name).seq == 200, "the cursor at the head")
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert set(otlp_sink.seqs()) == set(range(1, 201))
    assert shipping.cursor(engine, name).hash == shipping.head(engine)[1]


def test_migration_0009_adds_the_cursors_to_a_log_at_0008(db_url: str) -> None:
    engine = db.connect(db_url, migrate=False)
    config = AlembicConfig()
    config.set_main_option("script_location", str(db.MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0008")
    write(engine, 4)
    assert not inspect(engine).has_table("audit_cursors")
    db.upgrade(engine)
    assert inspect(engine).has_table("audit_cursors")
    verdict = audit.verify(engine)
    assert verdict.ok and verdict.events == 4
    assert shipping.cursor(engine, "otlp").seq == 0
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0008")
    assert not inspect(engine).has_table("audit_cursors")
