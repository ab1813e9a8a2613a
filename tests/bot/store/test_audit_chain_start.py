"""Issue 28, section 1: the start of the audit chain is proven. Someone who can write the
database (the threat checkpoints exist for) hides a tampering behind the archive the log
starts after; ``audit.verify``, ``verify --checkpoints`` (the command line and
``checkpoints.check``) each catch it. A log archived once: events 1-8, a checkpoint after
each, 1-5 archived (event 9 records it), then 10 and 11, not yet checkpointed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from bot.store import archive, audit, checkpoints, db
from bot.store.db import now_iso
from bot.store.schema import audit_archives
from bot.surfaces import cli
from kit.canonical import canonical
from tests.bot.store.test_audit import fill


@dataclass(frozen=True)
class Log:
    engine: Engine
    points: Path  # the checkpoint file
    archive: Path  # the file events 1-5 went to
    hashes: dict[int, str]  # of events 1-8, as checkpointed


def archived_log(engine: Engine, folder: Path, points: Path | None = None) -> Log:
    points = points or folder / "cp.jsonl"
    cut = ""
    for number in range(1, 9):
        fill(engine, 1)
        checkpoints.record(engine, points)
        if number == 5:
            cut = now_iso()
    archive.archive(engine, cut, folder / "a1.jsonl", "auditor")
    fill(engine, 2)  # the tampering comes before the next checkpoint
    hashes = {point.seq: point.hash for point in checkpoints.read(points)}
    return Log(engine, points, folder / "a1.jsonl", hashes)


def _sql(log: Log, *statements: str, **values: object) -> None:
    with log.engine.begin() as conn:
        for statement in statements:
            conn.execute(text(statement), values)


def recompute_from(engine: Engine, seq: int, data: str) -> None:
    """Give event ``seq`` new data and recompute every hash from it: the chain verifies."""
    with engine.begin() as conn:
        rows = conn.execute(text("SELECT seq, ts, execution_id, kind, actor, data FROM "
                                 "audit_events WHERE seq >= :s ORDER BY seq"), {"s": seq}).all()
        prev = conn.execute(text("SELECT prev_hash FROM audit_events WHERE seq = :s"),
                            {"s": seq}).scalar_one()
        for number, ts, execution_id, kind, actor, stored in rows:
            body = data if number == seq else stored
            digest = audit.event_hash(ts, execution_id, kind, actor, body, prev)
            conn.execute(text("UPDATE audit_events SET data = :d, prev_hash = :p, hash = :h "
                              "WHERE seq = :s"), {"d": body, "p": prev, "h": digest, "s": number})
            prev = digest


def record(log: Log) -> dict[str, object]:
    """The data of event 9, the audit_archived event of events 1-5."""
    with log.engine.connect() as conn:
        data = conn.execute(text("SELECT data FROM audit_events WHERE seq = 9 AND kind = "
                                 "'audit_archived'")).scalar_one()
    return dict(json.loads(data))


def truncated_tail(log: Log) -> None:
    """The tail cut from the archive's own audit_archived event on: the archive row stays."""
    _sql(log, "DELETE FROM audit_events WHERE seq >= 9")


def deleted_middle(log: Log) -> None:
    """Events 6-7 deleted, and the real archive's row widened over them."""
    _sql(log, "DELETE FROM audit_events WHERE seq IN (6, 7)",
         "UPDATE audit_archives SET up_to_seq = 7, head_hash = :h", h=log.hashes[7])


def rewritten_event(log: Log) -> None:
    """The audit_archived event rewritten (another file) and every hash after recomputed."""
    recompute_from(log.engine, 9, canonical({**record(log), "file": "/elsewhere/a1.jsonl"}))


def forged_row(log: Log) -> None:
    """Issue 28's attack: one archive row at event 7 with its real hash, events 6-7 deleted."""
    _sql(log, "DELETE FROM audit_events WHERE seq IN (6, 7)")
    with log.engine.begin() as conn:
        conn.execute(audit_archives.insert().values(
            from_seq=6, up_to_seq=7, head_hash=log.hashes[7], file=str(log.archive),
            sha256="0" * 64, created_at=now_iso(), created_by="auditor"))


def reordered_pair(log: Log) -> None:
    """Events 2 and 3 swapped in the archive file."""
    lines = log.archive.read_text().splitlines()
    lines[2], lines[3] = lines[3], lines[2]
    log.archive.write_text("\n".join(lines) + "\n")


def rewritten_archived_event(log: Log) -> None:
    """Event 3 rewritten in the archive file, its hashes and header recomputed: the file
    proves itself, but it is not the file archived."""
    header, *events = (json.loads(line) for line in log.archive.read_text().splitlines())
    prev = header["prev_hash"]
    for event in events:
        if event["seq"] == 3:
            event["data"] = canonical({"n": "nothing to see"})
        event["prev_hash"] = prev
        prev = event["hash"] = audit.event_hash(event["ts"], event["execution_id"],
                                                event["kind"], event["actor"], event["data"],
                                                prev)
    header["head_hash"] = prev
    log.archive.write_text("".join(json.dumps(line, sort_keys=True) + "\n"
                                   for line in [header, *events]))


def rewritten_record_and_row(log: Log) -> None:
    """Events 6-7 deleted, the row and its audit_archived event both rewritten to end at 7
    (hashes recomputed): the chain agrees with itself; only the archive file does not."""
    deleted_middle(log)
    recompute_from(log.engine, 9, canonical({**record(log), "up_to_seq": 7,
                                            "head_hash": log.hashes[7]}))


Tamper = Callable[[Log], None]
# What each leaves in the database: (tampering, what audit.verify says)
IN_THE_DATABASE: list[tuple[Tamper, str]] = [
    (truncated_tail, "the log starts after an archive of events 1-5 that no audit_archived "
                     "event in the log records"),
    (deleted_middle, "the log starts after an archive of events 1-7 that no audit_archived "
                     "event in the log records"),
    (rewritten_event, "the archive of events 1-5 the log starts after is not the one its "
                      "audit_archived event 9 records (file differ)"),
    (forged_row, "the log starts after an archive of events 6-7 that no audit_archived "
                 "event in the log records"),
]
# Every tampering, and what the checkpoints say of it
EVERY: list[tuple[Tamper, str]] = [
    (truncated_tail, "checkpoint(s) of events before event 6 cannot be proven: the log "
                     "continues from event 5"),
    (deleted_middle, "checkpoint(s) of events before event 8 cannot be proven: the log "
                     "continues from event 7"),
    (rewritten_event, "(audit_archived event 9) cannot be proven: its file "
                      "/elsewhere/a1.jsonl is missing"),
    (forged_row, "checkpoint(s) of events before event 8 cannot be proven: the log "
                 "continues from event 7"),
    (reordered_pair, "a1.jsonl, line 3: event 3 does not prove itself"),
    (rewritten_archived_event, "a1.jsonl is not the file archived (sha256"),
    (rewritten_record_and_row, "a1.jsonl holds events 1-5 ending at hash"),
]


def ids(cases: list[tuple[Tamper, str]]) -> list[str]:
    return [tamper.__name__ for tamper, _ in cases]


@pytest.fixture
def log(sqlite_url: str, tmp_path: Path) -> Log:
    made = archived_log(db.connect(sqlite_url), tmp_path)
    assert audit.verify(made.engine).ok
    assert checkpoints.check(made.engine, made.points) == (8, [])
    return made


@pytest.mark.parametrize(("tamper", "said"), IN_THE_DATABASE, ids=ids(IN_THE_DATABASE))
def test_verify_refuses_a_start_no_audit_archived_event_proves(log: Log, tamper: Tamper,
                                                               said: str) -> None:
    tamper(log)
    verdict = audit.verify(log.engine)
    assert not verdict.ok and verdict.problem.startswith(said), verdict


@pytest.mark.parametrize(("tamper", "said"), EVERY, ids=ids(EVERY))
def test_checkpoints_inside_the_archive_are_proven_by_its_file(log: Log, tamper: Tamper,
                                                               said: str) -> None:
    tamper(log)
    count, problems = checkpoints.check(log.engine, log.points)
    assert count == 8 and any(said in problem for problem in problems), problems


@pytest.mark.parametrize(("tamper", "said"), EVERY, ids=ids(EVERY))
def test_the_command_line_says_broken(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      tamper: Tamper, said: str) -> None:
    (tmp_path / "bot.yaml").write_text(f"database_url: sqlite:///{tmp_path / 'bot.db'}\n")
    log = archived_log(db.connect(f"sqlite:///{tmp_path / 'bot.db'}"), tmp_path)
    command = ["--config", str(tmp_path / "bot.yaml"), "audit", "verify", "--checkpoints",
               str(log.points)]
    assert cli.main(command) == 0
    capsys.readouterr()
    tamper(log)
    assert cli.main(command) == 1
    out = capsys.readouterr().out
    in_db = dict(IN_THE_DATABASE).get(tamper)
    assert any(line.startswith("audit log BROKEN: ") and (in_db or said) in line
               for line in out.splitlines()), out


def test_an_unproven_archive_file_fails_each_way_it_can(log: Log) -> None:
    """The file gone, or not an archive at all; and an intact log again agrees."""
    moved = log.archive.with_name("moved.jsonl")
    log.archive.rename(moved)
    problems = checkpoints.check(log.engine, log.points)[1]
    assert problems == [f"the archive of events 1-5 (audit_archived event 9) cannot be "
                        f"proven: its file {log.archive} is missing"]
    log.archive.write_text("not an archive\n")
    assert "is not an audit archive" in checkpoints.check(log.engine, log.points)[1][0]
    moved.replace(log.archive)
    assert checkpoints.check(log.engine, log.points) == (8, [])


def test_archives_of_archives_are_proven_back_to_the_first(log: Log, tmp_path: Path) -> None:
    """A second archive takes the first one's audit_archived event with it: the first is
    then found by its event inside the second file, and checked against its own file."""
    second = archive.archive(log.engine, now_iso(), tmp_path / "a2.jsonl", "auditor")
    assert (second.from_seq, second.up_to_seq) == (6, 11)
    assert audit.verify(log.engine).ok
    assert checkpoints.check(log.engine, log.points) == (8, [])
    rewritten_archived_event(log)  # the older file, reached only through the newer one
    assert "a1.jsonl is not the file archived" in checkpoints.check(
        log.engine, log.points)[1][0]


def test_an_archive_of_no_events_is_refused_not_walked_forever(log: Log,
                                                               tmp_path: Path) -> None:
    """A record rewritten to name a file of no events, chained where the log goes on."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"format": archive.FORMAT, "from_seq": 6, "up_to_seq": 5,
                                 "prev_hash": log.hashes[5], "head_hash": log.hashes[5]}) + "\n")
    sha256 = hashlib.sha256(empty.read_bytes()).hexdigest()
    recompute_from(log.engine, 9, canonical({**record(log), "from_seq": 6, "file": str(empty),
                                             "sha256": sha256}))
    assert checkpoints.check(log.engine, log.points)[1] == [
        f"the archive of events 6-5 (audit_archived event 9) cannot be proven: {empty} "
        "holds no events"]
