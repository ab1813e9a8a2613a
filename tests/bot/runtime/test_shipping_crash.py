"""``runbook serve`` ships the audit log, and a shipper killed with SIGKILL after the
receiver took a batch but before the cursor moved loses nothing: the batch is sent again
(duplicates, told apart by seq and hash)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from adapters.otlp.client import OtlpClient
from adapters.otlp.config import OtlpConfig
from bot.config import ShipConfig
from bot.runtime.shipping import Shipper
from bot.store import db, shipping
from tests.adapters.receivers import OtlpSink, free_port
from tests.bot.runtime.test_shipping import until, write


def serve(tmp_path: Path, url: str, endpoint: str) -> subprocess.Popen[bytes]:
    config = {"database_url": url, "server": {"host": "127.0.0.1", "port": free_port()},
              "audit": {"ship": {"otlp": {"endpoint": endpoint, "timeout_seconds": 60},
                                 "batch": 100, "interval_seconds": 0.05}}}
    (tmp_path / "bot.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "RUNBOOK_CONFIG": str(tmp_path / "bot.yaml")}
    with (tmp_path / "serve.log").open("ab") as log:
        return subprocess.Popen([sys.executable, "-m", "bot", "serve"], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def test_kill_9_between_send_and_cursor_loses_nothing(otlp_sink: OtlpSink, tmp_path: Path,
                                                       sqlite_url: str) -> None:
    engine = db.connect(sqlite_url)
    write(engine, 250, per_transaction=50)
    # the receiver writes the first batch, then holds its answer: the shipper is between
    # the send and the cursor when it is killed
    otlp_sink.fault(delay=60, count=1)
    server = serve(tmp_path, sqlite_url, otlp_sink.endpoint)
    try:
        # a bound, not a timing: `runbook serve` starting on a busy machine takes a while
        until(lambda: len(otlp_sink.seqs()) >= 100, "the first batch", seconds=120)
        server.send_signal(signal.SIGKILL)
        server.wait(10)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
    log = (tmp_path / "serve.log").read_text()
    destination = f"{otlp_sink.endpoint}/v1/logs"
    assert f"[audit-ship] shipping the audit log to {destination}" in log
    assert otlp_sink.seqs() == list(range(1, 101))
    assert shipping.cursor(engine, destination).seq == 0  # accepted, but not yet recorded
    settings = ShipConfig(batch=100)
    shipper = Shipper(engine, OtlpClient(OtlpConfig(endpoint=otlp_sink.endpoint)), settings)
    while shipper.step():  # the next leader: from the cursor, the first batch again
        pass
    head = shipping.head(engine)
    assert head[0] >= 250  # serve appends events of its own as it starts
    assert otlp_sink.seqs() == [*range(1, 101), *range(1, head[0] + 1)]  # none lost, in order
    at = shipping.cursor(engine, destination)
    assert (at.seq, at.hash) == head
