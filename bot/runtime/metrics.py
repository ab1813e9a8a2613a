"""What /metrics says: the bot's state read from the database at scrape time
(``BotCollector``, the same in every replica) and how long this replica's HTTP answers took
(``registry_for``)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from sqlalchemy import func, select

from bot.runtime.driftmetrics import drift_metrics
from bot.runtime.fleetmetrics import fleet_metrics
from bot.runtime.shipping import destination_names
from bot.service import Service
from bot.store import shipping
from bot.store.schema import audit_events, executions, proposals, step_states
from bot.store.words import Kind

STEP_BUCKETS = (0.1, 1.0, 10.0, 60.0, 600.0, 3600.0)


class BotCollector:
    """Metrics read from the database at scrape time, so every replica reports the same."""

    def __init__(self, service: Service) -> None:
        self._bot = service

    def collect(self) -> Iterator[Any]:
        with self._bot.db.connect() as conn:
            by_state = conn.execute(select(executions.c.runbook, executions.c.state, func.count())
                                    .group_by(executions.c.runbook, executions.c.state)).all()
            kinds: dict[str, int] = dict(conn.execute(
                select(audit_events.c.kind, func.count())
                .where(audit_events.c.kind.in_([Kind.CHECK_EVALUATED, Kind.APPROVED, Kind.DENIED,
                                                Kind.STEP_FINISHED, Kind.STEP_FAILED]))
                .group_by(audit_events.c.kind)).all())
            open_proposals = conn.execute(select(func.count()).select_from(proposals)
                                          .where(proposals.c.state == "open")).scalar_one()
        gauge = GaugeMetricFamily("runbook_executions", "Executions by runbook and state",
                                  labels=["runbook", "state"])
        for runbook, state, count in by_state:
            gauge.add_metric([runbook, state], count)
        yield gauge
        events = CounterMetricFamily("runbook_audit_events", "Audit events by kind",
                                     labels=["kind"])
        for kind, count in sorted(kinds.items()):
            events.add_metric([kind], count)
        yield events
        yield GaugeMetricFamily("runbook_open_proposals", "Alert proposals waiting for a person",
                                value=open_proposals)
        yield self._step_durations()
        yield from self._shipping()
        with self._bot.db.connect() as conn:  # the last drift report (bot.runtime.driftmetrics)
            drift = list(drift_metrics(conn))
        yield from drift
        yield from fleet_metrics(self._bot)  # the breaker, nodes held out, proposals

    def _step_durations(self) -> Any:
        with self._bot.db.connect() as conn:
            rows = conn.execute(select(step_states.c.started_at, step_states.c.finished_at)
                                .where(step_states.c.state == "succeeded",
                                       step_states.c.started_at.is_not(None),
                                       step_states.c.finished_at.is_not(None))).all()
        durations = [
            (datetime.fromisoformat(end.rstrip("Z")) - datetime.fromisoformat(start.rstrip("Z")))
            .total_seconds() for start, end in rows]
        counts = [sum(1 for d in durations if d <= edge) for edge in STEP_BUCKETS]
        histogram = HistogramMetricFamily("runbook_step_duration_seconds",
                                          "Duration of succeeded steps")
        histogram.add_metric([], [(f"{edge:g}", count) for edge, count in
                                  zip(STEP_BUCKETS, counts, strict=True)]
                             + [("+Inf", len(durations))], sum_value=sum(durations))
        return histogram


    def _shipping(self) -> Iterator[Any]:
        """Per configured destination of the audit log (bot.runtime.shipping): the last
        event it accepted, how many of the log's events it lacks, and how many it lost."""
        names = destination_names(self._bot.config.audit.ship)
        if not names:
            return
        cursors = {c.destination: c for c in shipping.all_cursors(self._bot.db)}
        head, _ = shipping.head(self._bot.db)
        shipped = GaugeMetricFamily("runbook_audit_shipped_seq", "The last audit event the "
                                    "destination accepted", labels=["destination"])
        lag = GaugeMetricFamily("runbook_audit_ship_lag_events", "Audit events written but "
                                "not yet accepted by the destination", labels=["destination"])
        skipped = CounterMetricFamily("runbook_audit_ship_skipped_events", "Audit events gone "
                                      "(archived) before they were shipped",
                                      labels=["destination"])
        rejected = CounterMetricFamily("runbook_audit_ship_rejected_records", "Records the "
                                       "destination took but said it dropped",
                                       labels=["destination"])
        for name in names:
            found = cursors.get(name) or shipping.Cursor(name, 0, "", 0, 0)
            shipped.add_metric([name], found.seq)
            lag.add_metric([name], max(head - found.seq, 0))
            skipped.add_metric([name], found.skipped)
            rejected.add_metric([name], found.rejected)
        yield from (shipped, lag, skipped, rejected)


# a Slack acknowledgement must leave within 3 s; /alerts waits for planning
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def registry_for(service: Service) -> tuple[CollectorRegistry, Histogram]:
    """A registry of this server's own (never the process-wide one, so that two servers in
    one process do not clash) with the bot's collector and the request histogram."""
    registry = CollectorRegistry()
    registry.register(BotCollector(service))
    histogram = Histogram("runbook_http_request_duration_seconds",
                          "Time from a request's headers to its answer, by route",
                          ["method", "route", "code"], buckets=REQUEST_BUCKETS,
                          registry=registry)
    return registry, histogram
