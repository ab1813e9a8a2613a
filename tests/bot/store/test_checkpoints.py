"""Checkpoints of the audit log (bot.store.checkpoints): a tail cut off or written again with
its hashes recomputed passes the chain's own check but not the checkpoints; the command
line and the leader's task that record them."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from bot.config import Config, load_config
from bot.runtime.tasks import checkpoint_task
from bot.service import Service
from bot.store import audit, checkpoints, db
from bot.store.words import Kind
from bot.surfaces import cli
from kit.canonical import canonical
from tests.bot.store.test_audit import fill


def rewrite_from(engine: Engine, seq: int) -> None:
    """What someone with write access to the database does to hide event ``seq`` and on:
    change it and recompute every hash after it, so that the chain verifies again."""
    with engine.begin() as conn:
        rows = conn.execute(text("SELECT seq, ts, execution_id, kind, actor, data FROM "
                                 "audit_events WHERE seq >= :s ORDER BY seq"), {"s": seq}).all()
        prev = conn.execute(text("SELECT hash FROM audit_events WHERE seq = :s"),
                            {"s": seq - 1}).scalar_one()
        for number, ts, execution_id, kind, actor, data in rows:
            data = canonical({"n": "nothing to see"}) if number == seq else data
            digest = audit.event_hash(ts, execution_id, kind, actor, data, prev)
            conn.execute(text("UPDATE audit_events SET data = :d, prev_hash = :p, hash = :h "
                              "WHERE seq = :s"), {"d": data, "p": prev, "h": digest, "s": number})
            prev = digest


def test_an_intact_log_agrees_with_its_checkpoints(db_url: str, tmp_path: Path) -> None:
    engine = db.connect(db_url)
    file = tmp_path / "audit.checkpoints"
    assert checkpoints.record(engine, file) == checkpoints.Checkpoint(0, "", checkpoints.read(
        file)[0].ts)  # an empty log has a checkpoint too
    fill(engine, 5)
    first = checkpoints.record(engine, file)
    assert first is not None and first.seq == 5 and first.hash == audit.verify(engine).head
    assert checkpoints.record(engine, file) is None  # nothing new: no second line
    fill(engine, 3)
    assert checkpoints.record(engine, file) is not None
    assert [p.seq for p in checkpoints.read(file)] == [0, 5, 8]
    assert checkpoints.check(engine, file) == (3, [])


def test_a_cut_tail_verifies_but_the_checkpoints_see_it(db_url: str, tmp_path: Path) -> None:
    engine = db.connect(db_url)
    file = tmp_path / "audit.checkpoints"
    fill(engine, 6)
    checkpoints.record(engine, file)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_events WHERE seq > 4"))
    assert audit.verify(engine).ok  # a prefix of a chain is a chain
    count, problems = checkpoints.check(engine, file)
    assert count == 1 and problems == [
        f"the checkpoint of {checkpoints.read(file)[0].ts} saw event 6, but the log ends at "
        "event 4: its tail was cut off"]


def test_a_rewritten_tail_verifies_but_the_checkpoints_see_it(db_url: str,
                                                              tmp_path: Path) -> None:
    engine = db.connect(db_url)
    file = tmp_path / "audit.checkpoints"
    fill(engine, 4)
    checkpoints.record(engine, file)
    fill(engine, 4)
    checkpoints.record(engine, file)
    rewrite_from(engine, 6)
    assert audit.verify(engine).ok
    _, problems = checkpoints.check(engine, file)
    assert len(problems) == 1 and problems[0].startswith("event 8 is not the one")
    rewrite_from(engine, 3)  # before the first checkpoint: both see it
    assert audit.verify(engine).ok
    assert [p.split(" is not")[0] for p in checkpoints.check(engine, file)[1]] == [
        "event 4", "event 8"]


@pytest.mark.parametrize("content", ['{"seq": 1}\n', "not json\n", '{"seq": "x", "hash": "h", '
                                     '"ts": "t"}\n'])
def test_a_damaged_checkpoint_file_is_named(sqlite_url: str, tmp_path: Path,
                                            content: str) -> None:
    file = tmp_path / "audit.checkpoints"
    file.write_text(json.dumps({"seq": 0, "hash": "", "ts": "t"}) + "\n" + content)
    with pytest.raises(checkpoints.CheckpointError, match=r"line 2: not a checkpoint"):
        checkpoints.check(db.connect(sqlite_url), file)
    with pytest.raises(checkpoints.CheckpointError, match="cannot read"):
        checkpoints.check(db.connect(sqlite_url), tmp_path / "missing")


def test_checkpoints_of_an_archived_log(sqlite_url: str, tmp_path: Path) -> None:
    """After an archive: a checkpoint of the empty log or inside the archive is passed over,
    one at the archive's head is checked against the archive's head hash, one at the first
    event still in the table against that event."""
    from bot.store import archive

    engine = db.connect(sqlite_url)
    file = tmp_path / "cp"
    checkpoints.record(engine, file)  # seq 0
    fill(engine, 3)
    checkpoints.record(engine, file)  # seq 3, inside the archive
    fill(engine, 2)
    checkpoints.record(engine, file)  # seq 5, the archive's head
    archive.archive(engine, checkpoints.read(file)[-1].ts, tmp_path / "a.jsonl", "auditor")
    checkpoints.record(engine, file)  # seq 6, the archive's own event
    points = checkpoints.read(file)
    assert [p.seq for p in points] == [0, 3, 5, 6]
    assert checkpoints.check(engine, file) == (4, [])
    with engine.begin() as conn:
        conn.execute(text("UPDATE audit_archives SET head_hash = :h"), {"h": "e" * 64})
        conn.execute(text("UPDATE audit_events SET hash = :h WHERE seq = 6"), {"h": "d" * 64})
    assert checkpoints.check(engine, file)[1] == [
        f"event 5 is not the one the checkpoint of {points[2].ts} saw (hash "
        f"{points[2].hash[:12]}…, now {'e' * 12}…): the log was written again from there",
        f"event 6 is not the one the checkpoint of {points[3].ts} saw (hash "
        f"{points[3].hash[:12]}…, now {'d' * 12}…): the log was written again from there"]


def test_a_checkpoint_of_the_first_event_is_checked(sqlite_url: str, tmp_path: Path) -> None:
    engine = db.connect(sqlite_url)
    file = tmp_path / "cp"
    checkpoints.record(engine, file)  # the empty log: nothing to check
    fill(engine, 1)
    checkpoints.record(engine, file)
    assert checkpoints.check(engine, file) == (2, [])
    with engine.begin() as conn:  # written again (verify would see this one; check too)
        conn.execute(text("UPDATE audit_events SET hash = :h WHERE seq = 1"), {"h": "e" * 64})
    problems = checkpoints.check(engine, file)[1]
    assert len(problems) == 1 and problems[0].startswith("event 1 is not the one")


def test_reading_checkpoints(tmp_path: Path) -> None:
    """Blank lines are passed over (not the end), a line may hold more than the three fields,
    and a bad line is named with the form a checkpoint has."""
    file = tmp_path / "cp"
    file.write_text('\n{"seq": 1, "hash": "a", "ts": "t1"}\n\n'
                    'bot: {"seq": 2, "hash": "b", "ts": "t2", "by": {"replica": "r1"}} (ok)\n')
    assert checkpoints.read(file) == [checkpoints.Checkpoint(1, "a", "t1"),
                                      checkpoints.Checkpoint(2, "b", "t2")]
    file.write_text('{"seq": 1, "hash": "a", "ts": "t1"}\n{"seq": 2}\n')
    with pytest.raises(checkpoints.CheckpointError) as caught:
        checkpoints.read(file)
    assert str(caught.value) == (
        f'{file}, line 2: not a checkpoint ({{"seq": N, "hash": "...", "ts": "..."}})')


def test_a_checkpoint_file_that_cannot_be_read_says_why(tmp_path: Path) -> None:
    file = tmp_path / "cp"
    file.write_bytes(b'{"seq": 1, "hash": "\xff", "ts": "t"}\n')
    with pytest.raises(checkpoints.CheckpointError) as caught:
        checkpoints.read(file)
    assert str(caught.value) == f"cannot read the audit checkpoint file {file}: not text"
    with pytest.raises(checkpoints.CheckpointError) as caught:
        checkpoints.read(tmp_path)
    assert str(caught.value) == (
        f"cannot read the audit checkpoint file {tmp_path}: Is a directory")


def test_recording_makes_the_folders_or_says_why_it_cannot(sqlite_url: str,
                                                            tmp_path: Path) -> None:
    engine = db.connect(sqlite_url)
    fill(engine, 1)
    deep = tmp_path / "a" / "b" / "cp"
    point = checkpoints.record(engine, deep)
    assert point is not None and checkpoints.read(deep) == [point]
    (tmp_path / "plain").write_text("")
    with pytest.raises(checkpoints.CheckpointError) as caught:
        checkpoints.record(engine, tmp_path / "plain" / "cp")
    assert str(caught.value) == (
        f"cannot write the audit checkpoint file {tmp_path / 'plain' / 'cp'}: File exists")


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_the_command_line_records_and_verifies(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bot.yaml").write_text(
        f"database_url: sqlite:///{tmp_path / 'bot.db'}\naudit:\n  checkpoint_file: cp\n")
    config = str(tmp_path / "bot.yaml")
    assert load_config(config).audit.checkpoint_file == tmp_path / "cp"
    engine = db.connect(f"sqlite:///{tmp_path / 'bot.db'}")
    fill(engine, 3)
    assert run_cli(capsys, "--config", config, "audit", "checkpoint")[0] == 0
    code, out = run_cli(capsys, "--config", config, "audit", "verify", "--checkpoints")
    assert code == 0 and "checkpoints agree: 1 in" in out
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_events WHERE seq = 3"))
    code, out = run_cli(capsys, "--config", config, "audit", "verify", "--checkpoints")
    assert code == 1 and "audit log intact: 2 events" in out and "tail was cut off" in out
    code, out = run_cli(capsys, "--config", config, "audit", "verify")  # without: not seen
    assert code == 0
    (tmp_path / "none.yaml").write_text(f"database_url: sqlite:///{tmp_path / 'bot.db'}\n")
    code, out = run_cli(capsys, "--config", str(tmp_path / "none.yaml"), "audit", "checkpoint")
    assert code == 2 and "set audit.checkpoint_file" in out


def wait_for(check: Callable[[], bool], stop: threading.Event) -> bool:
    for _ in range(50):
        if check():
            return True
        stop.wait(0.1)
    return False


def test_the_leader_records_at_start_every_interval_and_at_stop(tmp_path: Path,
                                                                 sqlite_url: str) -> None:
    config = Config(database_url=sqlite_url, audit={"checkpoint_seconds": 1})
    db.init(sqlite_url)  # `runbook db init`: the bot's commands never create the database
    bot = Service.from_config(config)
    file = tmp_path / "cp"
    said: list[str] = []
    stop = threading.Event()
    runner = threading.Thread(target=checkpoint_task(bot, file, said.append).run, args=(stop,))
    runner.start()
    try:
        assert wait_for(lambda: file.exists(), stop)  # the first, at start
        fill(bot.db, 2)
        assert wait_for(lambda: checkpoints.read(file)[-1].seq == 2, stop)  # within a second
        with bot.db.begin() as conn:
            audit.append(conn, Kind.REQUESTED, "alice", {"n": "last"})
    finally:
        stop.set()
        runner.join(10)
    assert [p.seq for p in checkpoints.read(file)] == [0, 2, 3] and said == []


def test_the_leader_posts_each_new_head_to_the_chat_once(tmp_path: Path,
                                                          sqlite_url: str) -> None:
    """audit.checkpoint_chat without a file: the chat is the record kept apart, and a head
    already posted is not posted again."""
    db.init(sqlite_url)
    bot = Service.from_config(Config(database_url=sqlite_url, audit={"checkpoint_seconds": 1}))
    posted: list[checkpoints.Checkpoint] = []
    stop = threading.Event()
    runner = threading.Thread(target=checkpoint_task(bot, None, post=posted.append).run,
                              args=(stop,))
    runner.start()
    try:
        assert wait_for(lambda: len(posted) == 1, stop)
        fill(bot.db, 2)
        assert wait_for(lambda: len(posted) == 2, stop)
        stop.wait(1.5)  # an interval with nothing new: nothing posted
    finally:
        stop.set()
        runner.join(10)
    assert [(p.seq, p.hash) for p in posted] == [(0, ""), (2, checkpoints.head(bot.db)[1])]
    assert not (tmp_path / "cp").exists()


def test_lines_copied_from_the_chat_are_read_as_checkpoints(tmp_path: Path,
                                                            sqlite_url: str) -> None:
    """What the channel shows ("audit checkpoint `{...}`"), pasted into a file with blank
    lines between, is a checkpoint file verify reads; a rewritten tail still shows."""
    engine = db.connect(sqlite_url)
    fill(engine, 3)
    seq, digest = checkpoints.head(engine)
    pasted = tmp_path / "from-slack.txt"
    line = checkpoints.as_line(checkpoints.Checkpoint(seq, digest, "2026-12-02T01:00:00Z"))
    pasted.write_text(f"audit checkpoint `{line}`\n\n")
    assert checkpoints.check(engine, pasted) == (1, [])
    rewrite_from(engine, 2)
    count, problems = checkpoints.check(engine, pasted)
    assert count == 1 and "written again" in problems[0]


def test_chat_checkpoints_need_the_chat() -> None:
    with pytest.raises(ValueError, match=r"audit\.checkpoint_chat posts to the Slack channel"):
        Config(audit={"checkpoint_chat": True})


# --- checkpoints of archived events, against the archive files (exact words) ---------------


def archived_hashes(path: Path) -> dict[int, str]:
    return {int(line["seq"]): str(line["hash"]) for line in
            (json.loads(text) for text in path.read_text().splitlines()[1:])}


def test_an_emptied_log_after_an_archive_proves_no_checkpoint(sqlite_url: str,
                                                              tmp_path: Path) -> None:
    from tests.bot.store.test_audit_chain_start import archived_log

    log = archived_log(db.connect(sqlite_url), tmp_path)
    points = checkpoints.read(log.points)
    with log.engine.begin() as conn:
        conn.execute(text("DELETE FROM audit_events"))
    h5 = log.hashes[5]
    assert checkpoints.check(log.engine, log.points) == (8, [
        *(f"the checkpoint of {p.ts} saw event {p.seq}, but the log ends at event 0: its tail "
          "was cut off" for p in points[5:]),
        f"5 checkpoint(s) of events before event 6 cannot be proven: the log continues from "
        f"event 5 (hash {h5[:12]}…), but no audit_archived event records an archive ending "
        "there (events deleted, the archive made up)"])


def test_events_written_again_before_they_were_archived_are_named(sqlite_url: str,
                                                                  tmp_path: Path) -> None:
    from bot.store import archive
    from bot.store.db import now_iso
    from tests.bot.store.test_audit_chain_start import recompute_from

    engine = db.connect(sqlite_url)
    file = tmp_path / "cp"
    for _ in range(3):
        fill(engine, 1)
        checkpoints.record(engine, file)
    recompute_from(engine, 1, canonical({"n": "nothing to see"}))
    cut = now_iso()
    fill(engine, 1)
    archive.archive(engine, cut, tmp_path / "a.jsonl", "auditor")
    points, now = checkpoints.read(file), archived_hashes(tmp_path / "a.jsonl")
    where = tmp_path / "a.jsonl"
    assert checkpoints.check(engine, file)[1] == [
        f"event 3 is not the one the checkpoint of {points[2].ts} saw (hash "
        f"{points[2].hash[:12]}…, now {now[3][:12]}…): the log was written again from there",
        *(f"event {p.seq} is not the one the checkpoint of {p.ts} saw (hash {p.hash[:12]}…, "
          f"archived in {where} as {now[p.seq][:12]}…): the log was written again from "
          "there before it was archived" for p in points)]


def test_an_archive_of_one_event_proves_its_checkpoint(sqlite_url: str, tmp_path: Path) -> None:
    from bot.store import archive
    from bot.store.db import now_iso

    engine = db.connect(sqlite_url)
    fill(engine, 1)
    checkpoints.record(engine, tmp_path / "cp")
    cut = now_iso()
    fill(engine, 1)
    assert archive.archive(engine, cut, tmp_path / "a.jsonl", "auditor").up_to_seq == 1
    assert checkpoints.check(engine, tmp_path / "cp") == (1, [])


def test_an_archive_that_cannot_be_proven_is_named_exactly(sqlite_url: str,
                                                           tmp_path: Path) -> None:
    import hashlib

    from tests.bot.store import test_audit_chain_start as start

    log = start.archived_log(db.connect(sqlite_url), tmp_path)
    recorded = start.record(log)
    name = "the archive of events 1-5 (audit_archived event 9)"
    start.recompute_from(log.engine, 9, canonical(
        {k: v for k, v in recorded.items() if k != "sha256"}))
    assert checkpoints.check(log.engine, log.points)[1] == [
        f"{name} does not name its file and sha256: it cannot be proven"]
    start.recompute_from(log.engine, 9, canonical(recorded))
    start.rewritten_archived_event(log)
    got = hashlib.sha256(log.archive.read_bytes()).hexdigest()
    assert checkpoints.check(log.engine, log.points)[1] == [
        f"{name} cannot be proven: {log.archive} is not the file archived (sha256 {got[:12]}…, "
        f"recorded {str(recorded['sha256'])[:12]}…)"]


def test_an_archive_whose_record_was_rewritten_with_its_row_is_named_exactly(
        sqlite_url: str, tmp_path: Path) -> None:
    from tests.bot.store import test_audit_chain_start as start

    log = start.archived_log(db.connect(sqlite_url), tmp_path)
    start.rewritten_record_and_row(log)
    problems = checkpoints.check(log.engine, log.points)[1]
    assert problems[-1] == (
        f"the archive of events 1-7 (audit_archived event 9) cannot be proven: {log.archive} "
        f"holds events 1-5 ending at hash {log.hashes[5][:12]}…, not those its event records")
