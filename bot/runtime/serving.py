"""``runbook serve``: the bot's HTTP server and its engine and other background tasks.

It imports no surface: surfaces hand it POST routes (``Route``) and tasks (``Task``); which
tasks run in this replica is bot.runtime.leadership's to say.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sqlalchemy import func, select, text

from bot.alerts import proposing
from bot.execution.engine import Reporter
from bot.runtime import access
from bot.runtime.leadership import Elector, Leadership, make_elector
from bot.runtime.tasks import Task, engine_task
from bot.service import Service
from bot.store.schema import audit_events, executions, proposals, step_states
from bot.store.words import Kind

MAX_BODY = access.MAX_BODY  # bytes: a larger request body is refused with 413

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()  # more headers: (name, value)


# A POST route: (request headers, raw body) -> response. Headers keys are lower case.
Route = Callable[[Mapping[str, str], bytes], Response]


STEP_BUCKETS = (0.1, 1.0, 10.0, 60.0, 600.0, 3600.0)


class BotCollector:
    """Metrics read from the database at scrape time, so every replica reports the same."""

    def __init__(self, bot: Service) -> None:
        self._bot = bot

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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

    def _step_durations(self) -> Any:
        from datetime import datetime

        from prometheus_client.core import HistogramMetricFamily

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


def health(bot: Service, leadership: Callable[[], Mapping[str, Any]] | None) -> Response:
    """GET /healthz: 200 when the database answers, with what leadership says."""
    try:
        with bot.db.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        return _json(503, {"status": "unhealthy", "database": str(exc)[:200]})
    return _json(200, {"status": "ok", **(leadership() if leadership else {})})


def alerts(bot: Service, body: bytes) -> Response:
    """POST /alerts: Alertmanager's webhook to proposals."""
    try:
        webhook = proposing.parse(body)
    except proposing.BadPayload as exc:
        return _json(400, {"error": str(exc)})
    try:
        touched = proposing.receive(bot, webhook)
    except proposing.TooManyAlerts as exc:
        return _json(413, {"error": str(exc)})
    return _json(200, {"proposals": [
        {"id": p.id, "runbook": p.runbook, "params": p.params, "state": p.state,
         "alert_status": p.alert_status, "fingerprint": p.fingerprint, "note": p.note}
        for p in touched]})


def alerts_route(bot: Service, token: str | None) -> Route:
    """POST /alerts behind its bearer token (none: not authenticated, see access.py)."""

    def route(headers: Mapping[str, str], body: bytes) -> Response:
        if token is not None:
            problem = access.bearer_problem(headers, token)
            if problem is not None:
                return unauthorized(problem, invalid="authorization" in headers)
        return alerts(bot, body)

    return route


def unauthorized(problem: str, *, invalid: bool) -> Response:
    """401 with the challenge RFC 6750 asks for; the answer never holds what was sent."""
    challenge = 'Bearer realm="gpu-runbook-bot"' + (', error="invalid_token"' if invalid else "")
    return _json(401, {"error": problem}, headers=(("WWW-Authenticate", challenge),))


def _json(status: int, data: Any, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, json.dumps(data).encode(), headers=headers)


def header_map(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Request headers by lower-case name; one sent twice keeps both values, joined by ", "
    (so a doubled Content-Length or Authorization is refused, not one of them picked)."""
    found: dict[str, str] = {}
    for name, value in items:
        key = name.lower()
        found[key] = f"{found[key]}, {value}" if key in found else value
    return found


def answer_post(posts: Mapping[str, Route], path: str, headers: Mapping[str, str],
                read: Callable[[int], bytes]) -> tuple[Response, bool]:
    """The answer to POST ``path`` and whether its body was read: 404 for a path no route
    takes, 400 or 413 for a Content-Length that is not 1 to MAX_BODY, else the route's."""
    if path not in posts:
        known = ", ".join(["/alerts", *sorted(set(posts) - {"/alerts"})])
        return _json(404, {"error": f"no {path} here: POST {known}"}), False
    try:
        length = access.content_length(headers.get("content-length"))
    except access.BodyRefused as exc:
        return _json(exc.status, {"error": str(exc)}), False
    return posts[path](headers, read(length)), True


def make_handler(bot: Service, routes: Mapping[str, Route] | None = None, *,
                 alerts_token: str | None,
                 leadership: Callable[[], Mapping[str, Any]] | None = None,
                 ) -> type[BaseHTTPRequestHandler]:
    """The HTTP handler:

        POST /alerts    Alertmanager's webhook (version 4) -> proposals; with
                        ``alerts_token``, only with Authorization: Bearer <it> (else 401)
        GET  /healthz   200 when the database answers (followers too); says whether this
                        replica leads: {"status": "ok", "leader": false, "replica": ...}
        GET  /metrics   Prometheus metrics (executions, checks, approvals, proposals)

    and the surfaces' POST ``routes`` (Slack at /slack/events). A POST body must be 1 byte to
    MAX_BODY (400, 413). ``leadership``: what /healthz adds about leader election
    (Leadership.status).
    """
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(BotCollector(bot))
    posts: dict[str, Route] = {"/alerts": alerts_route(bot, alerts_token), **(routes or {})}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            pass  # requests are not worth a line each; the audit log has what matters

        def _send(self, answer: Response) -> None:
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            for name, value in answer.headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(answer.body)

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._send(health(bot, leadership))
            elif self.path == "/metrics":
                self._send(Response(200, generate_latest(registry), "text/plain; version=0.0.4"))
            else:
                self._send(_json(404, {"error": f"no {self.path} here: /alerts, /healthz, "
                                                "/metrics"}))

        def do_POST(self) -> None:
            answer, read = answer_post(posts, self.path.split("?", 1)[0],
                                       header_map(self.headers.items()), self.rfile.read)
            if not read:  # a body left unread must not be parsed as the next request
                self.close_connection = True
            self._send(answer)

    return Handler


class Server(ThreadingHTTPServer):
    # Bursts of chat requests (20 at once is common when a channel reacts to an incident):
    # the default listen backlog of 5 resets connections.
    request_queue_size = 128
    daemon_threads = True


def serve(bot: Service, host: str, port: int, report: Reporter,
          stop: threading.Event | None = None, *, routes: Mapping[str, Route] | None = None,
          tasks: Sequence[Task] = (), elector: Elector | None = None,
          alerts: access.AlertsAccess | None = None) -> None:
    """Serve HTTP and run the engine and ``tasks`` until ``stop`` is set.

    ``alerts``: how POST /alerts is guarded; default from the configuration and the
    environment (access.alerts_access: AlertsAuthError, before anything starts, when /alerts
    would be open on a non-loopback ``host``; a warning logged when it is open on loopback).

    Leader-only tasks (the engine loop, the chat progress poster, the scheduler) run in one
    replica at a time, the leader (``elector``: default from the configuration's
    ``leader_election``): they start when this replica becomes the leader and are stopped
    when it stops being the leader. The others, and the HTTP server, run in every replica.
    """
    if alerts is None:
        alerts = access.alerts_access(bot.config.server, host)
        if alerts.warning:
            _log.warning("%s", alerts.warning)
    stop = stop or threading.Event()
    everything = [engine_task(bot, report), *tasks]
    leadership = Leadership(
        elector or make_elector(bot.config, bot.backends.get("kubernetes")),
        [task for task in everything if task.leader_only],
        retry_seconds=bot.config.leader_election.retry_seconds)
    try:
        server = Server((host, port), make_handler(bot, routes, alerts_token=alerts.token,
                                                   leadership=leadership.status))
    except BaseException:
        leadership.elector.release()
        raise
    threads = [threading.Thread(target=task.run, args=(stop,), daemon=True, name=task.name)
               for task in everything if not task.leader_only]
    threads.append(threading.Thread(target=leadership.run, args=(stop,), daemon=True,
                                    name="leader-election"))
    for thread in threads:
        thread.start()
    web = threading.Thread(target=server.serve_forever, daemon=True, name="http")
    web.start()
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        for thread in threads:
            thread.join(timeout=30)
