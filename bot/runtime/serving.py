"""``runbook serve``: the bot's HTTP server and its engine and other background tasks.

It imports no surface: surfaces hand it POST routes (``Route``) and tasks (``Task``); which
tasks run in this replica is bot.runtime.leadership's to say. The HTTP application is
bot.runtime.web's, run under uvicorn by bot.runtime.httpserver.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import text

from bot.alerts import proposing
from bot.config import ServerConfig
from bot.execution.engine import Reporter
from bot.runtime import access, metrics, web
from bot.runtime.httpserver import HttpServer, Settings
from bot.runtime.leadership import Elector, Leadership, make_elector
from bot.runtime.tasks import Task, engine_task
from bot.runtime.web import Response, Route, json_response
from bot.service import Service

MAX_BODY = access.MAX_BODY  # bytes: a larger request body is refused with 413

_log = logging.getLogger(__name__)
TASKS_STOP_SECONDS = 30.0  # on stop, the tasks' threads get this long in all


def health(service: Service, leadership: Callable[[], Mapping[str, Any]] | None) -> Response:
    """GET /healthz: 200 when the database answers, with what leadership says."""
    try:
        with service.db.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        return json_response(503, {"status": "unhealthy", "database": str(exc)[:200]})
    return json_response(200, {"status": "ok", **(leadership() if leadership else {})})


def alerts(service: Service, body: bytes) -> Response:
    """POST /alerts: Alertmanager's webhook to proposals."""
    try:
        webhook = proposing.parse(body)
    except proposing.BadPayload as exc:
        return json_response(400, {"error": str(exc)})
    try:
        touched = proposing.receive(service, webhook)
    except proposing.TooManyAlerts as exc:
        return json_response(413, {"error": str(exc)})
    return json_response(200, {"proposals": [
        {"id": p.id, "runbook": p.runbook, "params": p.params, "state": p.state,
         "alert_status": p.alert_status, "fingerprint": p.fingerprint, "note": p.note}
        for p in touched]})


def alerts_route(service: Service, tokens: str | Sequence[str] | None) -> Route:
    """POST /alerts behind its bearer token, or either of two while rotating (None or none:
    not authenticated, see access.py)."""

    def route(headers: Mapping[str, str], body: bytes) -> Response:
        if tokens:
            problem = access.bearer_problem(headers, tokens)
            if problem is not None:
                return unauthorized(problem, invalid="authorization" in headers)
        return alerts(service, body)

    return route


def unauthorized(problem: str, *, invalid: bool) -> Response:
    """401 with the challenge RFC 6750 asks for; the answer never holds what was sent."""
    challenge = 'Bearer realm="gpu-runbook-bot"' + (', error="invalid_token"' if invalid else "")
    return json_response(401, {"error": problem}, headers=(("WWW-Authenticate", challenge),))


def serve(service: Service, host: str, port: int, report: Reporter,
          stop: threading.Event | None = None, *, routes: Mapping[str, Route] | None = None,
          tasks: Sequence[Task] = (), elector: Elector | None = None,
          alerts: access.AlertsAccess | None = None,
          mounts: Mapping[str, web.Asgi] | None = None,
          stop_seconds: float = TASKS_STOP_SECONDS) -> None:
    """Serve HTTP and run the engine and ``tasks`` until ``stop`` is set; then wait for the
    tasks' threads ``stop_seconds`` in all.

    ``alerts``: how POST /alerts is guarded; default from the configuration and the
    environment (access.alerts_access: AlertsAuthError, before anything starts, when /alerts
    would be open on a non-loopback ``host``; a warning logged when it is open on loopback).

    Leader-only tasks (the engine loop, the chat progress poster, the scheduler) run in one
    replica at a time, the leader (``elector``: default from the configuration's
    ``leader_election``): they start when this replica becomes the leader and are stopped
    when it stops being the leader. The others, and the HTTP server, run in every replica.
    """
    if alerts is None:
        alerts = access.alerts_access(service.config.server, host)
        if alerts.warning:
            _log.warning("%s", alerts.warning)
    stop = stop or threading.Event()
    everything = [engine_task(service, report), *tasks]
    leadership = Leadership(
        elector or make_elector(service.config, service.backends.get("kubernetes")),
        [task for task in everything if task.leader_only],
        retry_seconds=service.config.leader_election.retry_seconds)
    try:  # bound and accepting before any task starts; a port in use fails here
        server = HttpServer(application(service, routes, alerts_token=alerts.tokens,
                                        leadership=leadership.status, mounts=mounts),
                            host, port, http_settings(service.config.server))
        server.start()
    except BaseException:
        leadership.elector.release()
        raise
    threads = [threading.Thread(target=task.run, args=(stop,), daemon=True, name=task.name)
               for task in everything if not task.leader_only]
    threads.append(threading.Thread(target=leadership.run, args=(stop,), daemon=True,
                                    name="leader-election"))
    for thread in threads:
        thread.start()
    try:
        stop.wait()
    finally:  # stop accepting, let the requests in flight finish; the leadership is given
        stop.set()  # up by leadership.run as it ends
        server.stop()
        _join(threads, stop_seconds)


def _join(threads: Sequence[threading.Thread], seconds: float) -> None:
    """Wait for the tasks' threads, ``seconds`` in all (not each: a pod has its grace period);
    one still running is named in the log and left to the process's exit (daemon)."""
    deadline = time.monotonic() + seconds
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    busy = [thread.name for thread in threads if thread.is_alive()]
    if busy:
        _log.warning("stopping: still running %gs after the stop, left to the exit: %s",
                     seconds, ", ".join(busy))


def application(service: Service, routes: Mapping[str, Route] | None = None, *,
                alerts_token: str | Sequence[str] | None,
                leadership: Callable[[], Mapping[str, Any]] | None = None,
                mounts: Mapping[str, web.Asgi] | None = None) -> web.Asgi:
    """The HTTP application:

        POST /alerts    Alertmanager's webhook (version 4) -> proposals; with
                        ``alerts_token`` (one, or two while rotating), only with
                        Authorization: Bearer <it> (else 401)
        GET  /livez     200 while the process answers HTTP (liveness: never the database)
        GET  /healthz   200 when the database answers (followers too); says whether this
                        replica leads: {"status": "ok", "leader": false, "replica": ...}
        GET  /metrics   Prometheus metrics (executions, checks, approvals, proposals, and
                        runbook_http_request_duration_seconds)

    and the surfaces' POST ``routes`` (Slack at /slack/events) and ``mounts`` (the console at
    /ui). A POST body must be 1 byte to MAX_BODY (400, 413). ``leadership``: what /healthz
    adds about leader election (Leadership.status).
    """
    registry, histogram = metrics.registry_for(service)
    posts = {"/alerts": alerts_route(service, alerts_token), **(routes or {})}
    return web.build(posts, health=lambda: health(service, leadership), registry=registry,
                     histogram=histogram, limits=limits(service.config.server), mounts=mounts)


def limits(server: ServerConfig) -> web.Limits:
    return web.Limits(read_timeout=server.read_timeout_seconds,
                      max_requests=server.max_requests_in_flight)


def http_settings(server: ServerConfig) -> Settings:
    return Settings(header_timeout=server.header_timeout_seconds,
                    keepalive=server.keepalive_seconds, grace=server.shutdown_grace_seconds,
                    tls_cert_file=server.tls_cert_file, tls_key_file=server.tls_key_file)
