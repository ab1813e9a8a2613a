"""What /metrics says about the fleet and the automation, read from the database at scrape
time like the rest of BotCollector: the breaker (tripped or not), the nodes the bot's
executions hold out of service now (its drains, and repairs under way or failed: the
execution history's verdict, as bot.execution.remediations gives it), and the alert
proposals by state and by alert. It asks no cluster system: a scrape never waits on Slurm."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy import func, select

from bot.alerts import breaker
from bot.execution import remediations
from bot.service import Service
from bot.store.schema import proposals

PROPOSAL_STATES = ("open", "started", "dismissed", "refused")


def fleet_metrics(service: Service) -> Iterator[Any]:
    yield GaugeMetricFamily("runbook_breaker_tripped", "1 while the breaker on automation is "
                            "tripped (alert proposals and auto_run stopped)",
                            value=1.0 if breaker.tripped(service) is not None else 0.0)
    kinds = service.remediation_kinds()
    with service.db.connect() as conn:
        held = remediations.held_out(conn, kinds)
        by_state: dict[str, int] = dict(conn.execute(
            select(proposals.c.state, func.count()).group_by(proposals.c.state)).all())
        by_alert = conn.execute(select(proposals.c.alertname, func.count())
                                .group_by(proposals.c.alertname)
                                .order_by(proposals.c.alertname)).all()
    yield GaugeMetricFamily("runbook_nodes_held_out", "Nodes the bot's executions hold out "
                            "of service now (drained, or a repair under way or failed)",
                            value=float(len(held)))
    states = GaugeMetricFamily("runbook_proposals", "Alert proposals by state",
                               labels=["state"])
    for state in sorted({*PROPOSAL_STATES, *by_state}):
        states.add_metric([state], float(by_state.get(state, 0)))
    yield states
    made = CounterMetricFamily("runbook_proposals_created", "Alerts turned into proposals, "
                               "by alert name", labels=["alertname"])
    for alertname, count in by_alert:
        made.add_metric([alertname], float(count))
    yield made
