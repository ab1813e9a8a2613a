"""The last drift report on /metrics: its counts of nodes out of line per pool and kind,
when it ran, and which of its sources answered; read at scrape time from the result of the
last succeeded ``report.drift`` step (step_states), so every replica reports the same."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import Connection, select

from bot.store.schema import executions, step_states

DRIFT_RUNBOOK = "drift-report"
LOOK_BACK = 20  # succeeded steps of the runbook read, newest first, to find the report's


def last_report(conn: Connection) -> tuple[dict[str, Any], float] | None:
    """The details of the newest succeeded drift report and when it finished (epoch)."""
    rows = conn.execute(
        select(step_states.c.result, step_states.c.finished_at)
        .join(executions, executions.c.id == step_states.c.execution_id)
        .where(executions.c.runbook == DRIFT_RUNBOOK, step_states.c.phase == "do",
               step_states.c.state == "succeeded", step_states.c.result.is_not(None))
        .order_by(step_states.c.finished_at.desc()).limit(LOOK_BACK)).all()
    for result, finished in rows:
        details = (json.loads(result) or {}).get("details") or {}
        if isinstance(details.get("drift"), dict) and finished:
            at = datetime.fromisoformat(str(finished).replace("Z", "+00:00"))
            return details, at.timestamp()
    return None


def drift_metrics(conn: Connection) -> Iterator[Any]:
    """Nothing until a drift report succeeded."""
    found = last_report(conn)
    if found is None:
        return
    details, at = found
    nodes = GaugeMetricFamily("runbook_drift_nodes", "Nodes out of line in the last drift "
                              "report, by pool and kind", labels=["pool", "kind"])
    for pool, kinds in sorted(details["drift"].items()):
        for kind, count in sorted(kinds.items()):
            nodes.add_metric([pool, kind], float(count))
    checked = GaugeMetricFamily("runbook_drift_nodes_checked", "Nodes the last drift report "
                                "read, by pool", labels=["pool"])
    for pool, count in sorted((details.get("nodes_checked") or {}).items()):
        checked.add_metric([pool], float(count))
    sources = GaugeMetricFamily("runbook_drift_source_up", "1 when the source answered the "
                                "last drift report", labels=["source"])
    for source, up in sorted((details.get("sources") or {}).items()):
        sources.add_metric([source], 1.0 if up else 0.0)
    yield from (nodes, checked, sources)
    yield GaugeMetricFamily("runbook_drift_report_timestamp_seconds", "When the last drift "
                            "report finished (Unix time)", value=at)
