"""Shipping the audit log (bot.runtime.shipping) to real receivers the tests start and stop:
every event arrives at least once and in chain order though the receiver stops mid-stream;
the cursor moves only after a receiver accepted a batch; archived events do not stall it; a
log restored behind the cursor is shipped again; a refusal keeps the cursor and backs off."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from sqlalchemy import Engine, delete

from adapters.auditlog import DeliveryError
from adapters.otlp.client import OtlpClient
from adapters.otlp.config import OtlpConfig
from adapters.syslog.client import SyslogClient
from adapters.syslog.config import SyslogConfig
from bot.config import ShipConfig
from bot.runtime import metrics
from bot.runtime.shipping import Backoff, Destination, Shipper, ship_tasks
from bot.store import archive, audit, db, shipping
from bot.store.db import now_iso
from bot.store.schema import audit_events
from bot.store.words import Kind
from tests.adapters.receivers import OtlpSink, Receiver, Rsyslogd
from tests.bot.store.test_checkpoints import rewrite_from
from tests.conftest import BotFactory

FAST = ShipConfig(batch=50, interval_seconds=0.02, retry_seconds=0.05, max_retry_seconds=0.2)


def write(engine: Engine, count: int, per_transaction: int = 10, pause: float = 0.0) -> None:
    """``count`` audit events, a few per transaction, as executions write them."""
    for start in range(0, count, per_transaction):
        with engine.begin() as conn:
            for number in range(start, min(start + per_transaction, count)):
                audit.append(conn, Kind.STEP_FINISHED, "alice", {"n": number}, execution_id=3)
        time.sleep(pause)


def client_of(receiver: Receiver) -> Destination:
    if isinstance(receiver, Rsyslogd):
        return SyslogClient(SyslogConfig(host="127.0.0.1", port=receiver.port,
                                         timeout_seconds=2))
    assert isinstance(receiver, OtlpSink)
    return OtlpClient(OtlpConfig(endpoint=receiver.endpoint, timeout_seconds=2))


def until(check: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {seconds:g}s"
        time.sleep(0.02)


def assert_complete(engine: Engine, receiver: Receiver, destination: str) -> list[int]:
    """Every event of the log arrived, first arrivals in chain order, each with its own
    hash; the cursor is at the head. The positions received, duplicates included."""
    with engine.connect() as conn:
        stored = {e["seq"]: e["hash"] for e in audit.events(conn)}
    received = receiver.events()
    assert all(stored[int(e["seq"])] == e["hash"] for e in received)  # dedup by seq + hash
    seqs = [int(e["seq"]) for e in received]
    assert list(dict.fromkeys(seqs)) == sorted(stored)
    at = shipping.cursor(engine, destination)
    assert (at.seq, at.hash) == shipping.head(engine)
    return seqs


@pytest.mark.parametrize("kind", ["rsyslogd", "otlp_sink"])
def test_every_event_arrives_in_order_though_the_receiver_stops_mid_stream(
        kind: str, request: pytest.FixtureRequest, sqlite_url: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    receiver: Receiver = request.getfixturevalue(kind)
    engine = db.connect(sqlite_url)
    lines: list[str] = []
    destination = client_of(receiver)
    shipper = Shipper(engine, destination, FAST, lines.append)
    attempts: list[int] = []  # the shipper's tries to send, counted
    step = shipper.step

    def counted() -> int:
        attempts.append(1)
        return step()

    monkeypatch.setattr(shipper, "step", counted)
    stop, stopped = threading.Event(), threading.Event()

    def writer() -> None:  # the second half is written while the receiver is down
        write(engine, 250, 5, 0.004)
        stopped.wait(10)
        write(engine, 250, 5, 0.004)

    threads = [threading.Thread(target=shipper.run, args=(stop,)),
               threading.Thread(target=writer)]
    for thread in threads:
        thread.start()
    try:
        until(lambda: len(receiver.seqs()) >= 100, "the first 100 events")
        receiver.stop()  # mid-stream: events are still being written and shipped
        stopped.set()
        until(lambda: any("not delivered" in line for line in lines), "a failure")
        failed = len(attempts)
        until(lambda: len(attempts) > failed + 1, "tries again while it is down")  # backs off
        receiver.start()
        threads[1].join()
        until(lambda: shipping.cursor(engine, destination.name).seq == 500, "the cursor")
    finally:
        stop.set()
        stopped.set()
        for thread in threads:
            thread.join(10)
    seqs = assert_complete(engine, receiver, destination.name)
    assert len(set(seqs)) == 500 and seqs[-1] == 500
    assert f"{destination.name}: delivering again" in lines


def test_events_archived_before_they_were_shipped_are_said_and_skipped(
        otlp_sink: OtlpSink, sqlite_url: str, tmp_path: Path) -> None:
    engine = db.connect(sqlite_url)
    lines: list[str] = []
    shipper = Shipper(engine, client_of(otlp_sink), FAST, lines.append)
    write(engine, 3)
    assert shipper.step() == 3
    write(engine, 2)
    cut = now_iso()
    write(engine, 3)
    archive.archive(engine, cut, tmp_path / "a.jsonl", "auditor")  # events 1-5
    assert shipper.step() == 4  # 6-8 and the audit_archived event 9; no stall at 4-5
    assert otlp_sink.seqs() == [1, 2, 3, 6, 7, 8, 9]
    at = shipping.cursor(engine, otlp_sink.endpoint + "/v1/logs")
    assert (at.seq, at.skipped) == (9, 2)
    assert lines == [f"warning: events 4-5 were archived before they reached "
                     f"{at.destination} (runbook audit archive): send it the archive file "
                     "yourself"]


def test_a_log_restored_behind_the_cursor_is_shipped_again_from_its_end(
        otlp_sink: OtlpSink, sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    lines: list[str] = []
    shipper = Shipper(engine, client_of(otlp_sink), FAST, lines.append)
    write(engine, 10)
    assert shipper.step() == 10
    with engine.begin() as conn:  # what restoring a backup of event 7 does to the log
        conn.execute(delete(audit_events).where(audit_events.c.seq > 7))
    assert shipper.step() == 0
    assert "the audit log ends at event 7" in lines[0]
    write(engine, 2)
    assert shipper.step() == 2
    assert otlp_sink.seqs() == [*range(1, 11), 8, 9]
    old, new = otlp_sink.events()[7:10], otlp_sink.events()[10:]
    assert [e["hash"] for e in new] == [e.hash for e in shipping.following(engine, 7, 9)]
    assert old[0]["hash"] != new[0]["hash"]  # the receiver holds both: the fork shows
    at = shipping.cursor(engine, shipper.destination.name)
    assert (at.seq, at.hash) == shipping.head(engine)


def test_a_refusal_keeps_the_cursor(otlp_sink: OtlpSink, sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    shipper = Shipper(engine, client_of(otlp_sink), FAST, lambda line: None)
    write(engine, 3)
    otlp_sink.fault(status=400, count=1)
    with pytest.raises(DeliveryError, match="400"):
        shipper.step()
    assert shipping.cursor(engine, shipper.destination.name).seq == 0
    assert shipper.step() == 3 and otlp_sink.seqs() == [1, 2, 3]


def test_backoff_doubles_up_to_its_bound() -> None:
    backoff = Backoff(1.0, 30.0)
    retry = DeliveryError("down")
    assert [backoff.after(retry) for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    backoff.reset()
    assert backoff.after(retry) == 1
    assert backoff.after(DeliveryError("refused", retryable=False)) == 30
    backoff.reset()
    assert backoff.after(DeliveryError("busy", retry_after=45)) == 45  # the receiver's word
    assert backoff.after(DeliveryError("busy", retry_after=9999)) == 300  # within reason


def test_metrics_say_how_far_each_destination_is(otlp_sink: OtlpSink,
                                                 make_bot: BotFactory) -> None:
    bot = make_bot({}, audit={"ship": {"otlp": {"endpoint": otlp_sink.endpoint}}})
    (task,) = ship_tasks(bot)
    assert task.leader_only and task.name == f"audit-ship {otlp_sink.endpoint}/v1/logs"
    write(bot.db, 5)
    Shipper(bot.db, client_of(otlp_sink), bot.config.audit.ship).step()
    write(bot.db, 2)
    registry, _ = metrics.registry_for(bot)
    text = generate_latest(registry).decode()
    label = f'{{destination="{otlp_sink.endpoint}/v1/logs"}}'
    assert f"runbook_audit_shipped_seq{label} 5.0" in text
    assert f"runbook_audit_ship_lag_events{label} 2.0" in text
    assert f"runbook_audit_ship_skipped_events_total{label} 0.0" in text


def test_a_shipped_event_written_again_is_said(otlp_sink: OtlpSink, sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    lines: list[str] = []
    shipper = Shipper(engine, client_of(otlp_sink), FAST, lines.append)
    write(engine, 5)
    assert shipper.step() == 5
    rewrite_from(engine, 4)  # hashes recomputed from event 4: the chain verifies again
    write(engine, 2)
    assert shipper.step() == 2
    assert lines == [f"warning: event 5 is not the one {shipper.destination.name} received "
                     "(its hash differs): the log was written again; `runbook audit verify "
                     "--checkpoints` says where"]
    assert otlp_sink.seqs() == [1, 2, 3, 4, 5, 6, 7]


def test_an_event_deleted_from_the_log_is_said_not_waited_for(otlp_sink: OtlpSink,
                                                              sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    lines: list[str] = []
    shipper = Shipper(engine, client_of(otlp_sink), FAST, lines.append)
    write(engine, 5)
    with engine.begin() as conn:
        conn.execute(delete(audit_events).where(audit_events.c.seq == 3))
    assert shipper.step() == 4
    assert lines == ["warning: event 3 is missing from the log and never reached "
                     f"{shipper.destination.name}: `runbook audit verify` says what happened"]
    assert otlp_sink.seqs() == [1, 2, 4, 5]
    assert shipping.cursor(engine, shipper.destination.name).skipped == 1
