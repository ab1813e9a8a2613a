"""Run a report runbook (one read-only step) to its end and read the report it wrote."""

from __future__ import annotations

from typing import Any

from bot.execution.engine import Engine
from bot.service import Service
from bot.store import audit


def report_summary(bot: Service, runbook: str, params: dict[str, Any] | None = None) -> str:
    """Request as alice, drive to the end (it must succeed); the step's summary: the report."""
    execution_id = bot.request(runbook, params or {}, "alice")
    engine = Engine(bot)
    try:
        ex = engine.drive(execution_id)
    finally:
        engine.close()
    assert ex.state == "succeeded", ex.error
    with bot.db.connect() as conn:
        (done,) = [e for e in audit.events(conn, execution_id=execution_id)
                   if e["kind"] == "step_finished"]
    return str(done["data"]["summary"])
