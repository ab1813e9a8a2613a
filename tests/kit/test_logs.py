"""JSON log lines (kit/logs.py): one object per line with time, level, logger, message, and
the execution and runbook in hand, set by the engine while it drives a run (also in the
step's own thread); RUNBOOK_LOG_FORMAT over logging.format; `runbook serve` in JSON writes
nothing on stderr that is not an object."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from bot.config import load_config
from bot.execution.engine import Engine
from bot.store import db
from kit import logs
from tests.bot import fakes
from tests.bot.runtime.test_access import free_port, post_alerts, serve_env, serve_until_up
from tests.conftest import BotFactory
from tests.processes import stopped


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """The bot's logs in JSON into a buffer, taken away after the test."""
    out = io.StringIO()
    logs.install("json", out)
    yield out
    logs.uninstall()


def lines(out: io.StringIO) -> list[dict[str, Any]]:
    text = out.getvalue()
    assert text.endswith("\n") or not text
    return [json.loads(line) for line in text.splitlines()]


def test_a_line_is_one_object_with_the_execution_in_hand(stream: io.StringIO) -> None:
    log = logging.getLogger("bot.test")
    log.info("before")
    with logs.execution(12, "drain-node"):
        log.warning("drain %s\nsecond line", "gpu03")
        with logs.execution(13):
            log.info("nested")
        log.info("elsewhere", extra={"execution_id": 9})  # another execution's line
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    before, drain, nested, elsewhere, failed = lines(stream)
    assert set(before) == {"time", "level", "logger", "message"}
    assert (before["level"], before["logger"], before["message"]) == ("INFO", "bot.test", "before")
    assert datetime.fromisoformat(before["time"]).utcoffset() is not None
    assert before["time"].endswith("Z")
    assert drain == {**drain, "level": "WARNING", "message": "drain gpu03\nsecond line",
                     "execution_id": 12, "runbook": "drain-node"}
    assert (nested["execution_id"], "runbook" in nested) == (13, False)
    assert (elsewhere["execution_id"], "runbook" in elsewhere) == (9, False)
    assert "execution_id" not in failed and "RuntimeError: boom" in failed["exception"]


def test_other_libraries_keep_to_warnings_and_text_replaces_json(stream: io.StringIO) -> None:
    logging.getLogger("urllib3.test").info("not shown")
    logging.getLogger("urllib3.test").warning("shown")
    logging.getLogger("bot").debug("not shown either")
    assert [(r["logger"], r["message"]) for r in lines(stream)] == [("urllib3.test", "shown")]
    text = io.StringIO()
    logs.install("text", text)  # replaces the JSON handlers: nothing more in the buffer
    logging.getLogger("bot.test").info("plain")
    assert text.getvalue().endswith(" bot.test plain\n")
    assert len(lines(stream)) == 1


def test_the_environment_wins_over_the_configuration(tmp_path: Path) -> None:
    (tmp_path / "bot.yaml").write_text("logging:\n  format: json\n")
    config = load_config(tmp_path / "bot.yaml")
    assert config.logging.format == "json"
    assert logs.chosen(config.logging.format, {}) == "json"
    assert logs.chosen(config.logging.format, {"RUNBOOK_LOG_FORMAT": "TEXT"}) == "text"
    assert logs.chosen("text", {"RUNBOOK_LOG_FORMAT": "json"}) == "json"
    with pytest.raises(ValueError, match="RUNBOOK_LOG_FORMAT='xml': the log format is text or "
                                         "json"):
        logs.chosen("text", {"RUNBOOK_LOG_FORMAT": "xml"})


def test_a_steps_own_lines_name_its_execution_and_runbook(
        make_bot: BotFactory, stream: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = fakes.RecordAction.run

    def noisy(self: fakes.RecordAction, args: Any, ctx: Any) -> Any:
        logging.getLogger("adapters.test").warning("recording %s", args.key)
        return plain(self, args, ctx)

    monkeypatch.setattr(fakes.RecordAction, "run", noisy)
    fakes.reset()
    bot = make_bot({"demo": {
        "name": "demo", "version": "1.0.0", "summary": "logs", "risk": "low",
        "steps": [{"id": "a", "action": "test.record", "with": {"key": "k"}}]}})
    execution_id = bot.request("demo", {}, "alice")
    engine = Engine(bot, sleep=lambda s: None, report=logs.report)
    try:
        assert engine.drive(execution_id).state == "succeeded"
    finally:
        engine.close()
    found = lines(stream)
    (step,) = [r for r in found if r["logger"] == "adapters.test"]
    assert step == {**step, "message": "recording k", "execution_id": execution_id,
                    "runbook": "demo"}
    progress = [r for r in found if r["logger"] == "bot.engine"]
    assert progress and all(r["execution_id"] == execution_id and r["runbook"] == "demo"
                            for r in progress)
    assert logs.current() == {}  # nothing left in hand after the run


def test_serve_in_json_writes_only_objects_on_stderr(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bot.db'}"
    db.connect(url).dispose()  # the database serve runs on (`runbook db init`'s part)
    port = free_port()
    server = serve_until_up(port, serve_env(tmp_path, RUNBOOK_LOG_FORMAT="json",
                                            RUNBOOK_DB_URL=url))
    try:
        status = post_alerts(port, None)
    finally:
        out, err = stopped(server)
    assert status == 200
    records = [json.loads(line) for line in err.splitlines()]
    said = [(r["level"], r["logger"], r["message"]) for r in records]
    assert any(level == "WARNING" and logger == "bot.serve" and "/alerts is not authenticated"
               in message for level, logger, message in said), said
    assert any(logger == "bot.serve" and message.startswith("serving on http://")
               for _, logger, message in said), said
    assert any(logger == "bot.runtime.leadership" and "is now the leader" in message
               for _, logger, message in said), said
    assert any(logger == "bot.access" and " POST /alerts 200 " in message
               for _, logger, message in said), said
    assert out == ""


def test_a_log_format_that_does_not_exist_stops_serve(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bot", "serve", "--port", str(free_port())],
                          env=serve_env(tmp_path, RUNBOOK_LOG_FORMAT="yaml"),
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert "RUNBOOK_LOG_FORMAT='yaml': the log format is text or json" in done.stderr
