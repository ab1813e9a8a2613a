"""Retention (bot.store.archive): events before a date move into a file that proves itself;
the log keeps verifying from the archive's head, new events chain on, checkpoints still
agree; a broken log, an existing file or nothing to archive changes nothing; a tampered
archive file is named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, text

from bot.store import archive, audit, checkpoints, db
from bot.store.db import now_iso
from bot.store.schema import audit_events
from tests.bot.store.test_audit import fill


def events_in(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(select(audit_events.c.seq).order_by(audit_events.c.seq))
                    .scalars())


def test_archive_moves_the_old_events_and_the_log_still_verifies(db_url: str,
                                                                 tmp_path: Path) -> None:
    engine = db.connect(db_url)
    fill(engine, 5)
    checkpoints.record(engine, tmp_path / "cp")
    cut = now_iso()
    fill(engine, 3)
    before = audit.verify(engine)
    done = archive.archive(engine, cut, tmp_path / "a1.jsonl", "auditor")
    assert (done.from_seq, done.up_to_seq) == (1, 5)
    assert events_in(engine) == [6, 7, 8, 9]  # 9: audit_archived, chained on
    after = audit.verify(engine)
    assert after.ok and after.events == 4 and before.head != after.head
    with engine.connect() as conn:
        last = list(audit.events(conn))[-1]
    assert last["kind"] == "audit_archived" and last["data"]["sha256"] == done.sha256
    assert archive.verify_file(tmp_path / "a1.jsonl") == done
    assert checkpoints.check(engine, tmp_path / "cp") == (1, [])  # event 5 is the archive's
    fill(engine, 2)
    second = archive.archive(engine, now_iso(), tmp_path / "a2.jsonl", "auditor")
    assert (second.from_seq, second.up_to_seq) == (6, 11)
    assert events_in(engine) == [12] and audit.verify(engine).ok


def test_nothing_changes_when_it_cannot_archive(db_url: str, tmp_path: Path) -> None:
    engine = db.connect(db_url)
    with pytest.raises(archive.ArchiveError, match="no event in the log is older than"):
        archive.archive(engine, now_iso(), tmp_path / "a.jsonl", "auditor")
    fill(engine, 3)
    (tmp_path / "taken.jsonl").write_text("mine")
    with pytest.raises(archive.ArchiveError, match="exists: name a new file"):
        archive.archive(engine, now_iso(), tmp_path / "taken.jsonl", "auditor")
    with engine.begin() as conn:
        conn.execute(text("UPDATE audit_events SET actor = 'mallory' WHERE seq = 2"))
    with pytest.raises(archive.ArchiveError, match="the audit log is broken"):
        archive.archive(engine, now_iso(), tmp_path / "b.jsonl", "auditor")
    assert events_in(engine) == [1, 2, 3] and not (tmp_path / "b.jsonl").exists()
    assert (tmp_path / "taken.jsonl").read_text() == "mine"


def test_a_tampered_archive_file_is_named(sqlite_url: str, tmp_path: Path) -> None:
    engine = db.connect(sqlite_url)
    fill(engine, 4)
    file = tmp_path / "a.jsonl"
    archive.archive(engine, now_iso(), file, "auditor")
    lines = file.read_text().splitlines()
    event = json.loads(lines[2])
    event["actor"] = "mallory"
    for changed in ([*lines[:2], json.dumps(event), *lines[3:]], lines[:-1],
                    [lines[0], *lines[2:]]):
        file.write_text("\n".join(changed) + "\n")
        with pytest.raises(archive.ArchiveError, match=r"line|ends at event"):
            archive.verify_file(file)
    file.write_text("not an archive\n")
    with pytest.raises(archive.ArchiveError, match="not an audit archive"):
        archive.verify_file(file)


def test_deleting_archived_rows_again_is_seen(sqlite_url: str, tmp_path: Path) -> None:
    """After an archive, a deletion at the new start of the log is still named."""
    engine = db.connect(sqlite_url)
    fill(engine, 4)
    archive.archive(engine, now_iso(), tmp_path / "a.jsonl", "auditor")
    fill(engine, 2)
    with engine.begin() as conn:
        first = conn.execute(select(func.min(audit_events.c.seq))).scalar_one()
        conn.execute(text("DELETE FROM audit_events WHERE seq = :s"), {"s": first})
    verdict = audit.verify(engine)
    assert not verdict.ok and "deleted" in verdict.problem


def test_the_command_line_archives_and_proves_the_file(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    from bot.surfaces import cli

    url = f"sqlite:///{tmp_path / 'bot.db'}"
    (tmp_path / "bot.yaml").write_text(f"database_url: {url}\n")
    config = ["--config", str(tmp_path / "bot.yaml")]
    fill(db.connect(url), 3)
    out = str(tmp_path / "old.jsonl")
    assert cli.main([*config, "audit", "archive", "--before", "2000-01-01",
                     "--output", out]) == 2  # nothing that old: refused, nothing written
    assert "no event in the log is older than 2000-01-01" in capsys.readouterr().err
    assert cli.main([*config, "audit", "archive", "--before", "2999-01-01", "--output",
                     out]) == 0
    assert "archived events 1-3" in capsys.readouterr().out
    assert cli.main([*config, "audit", "verify"]) == 0
    assert "audit log intact: 1 events" in capsys.readouterr().out
    assert cli.main([*config, "audit", "verify", "--archive", out]) == 0
    assert "archive intact: events 1-3" in capsys.readouterr().out
    Path(out).write_text(Path(out).read_text().replace("alice", "mallory", 1))
    assert cli.main([*config, "audit", "verify", "--archive", out]) == 1
    assert "archive BROKEN" in capsys.readouterr().out
