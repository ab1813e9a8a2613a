"""``runbook serve`` assembled: the checks before anything starts, the service, the leader's
tasks (scheduler, intake, audit checkpoints, shipping), the report, then the server.

It imports no surface: the command line hands in what the surfaces plug in (``Plugin``:
the Slack app, the console), built from the service by a function it passes.
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bot.config import Config
from bot.execution.engine import Reporter
from bot.runtime.access import AlertsAuthError, alerts_access
from bot.runtime.httpserver import STOP_SLACK, ListenError
from bot.runtime.serving import TASKS_STOP_SECONDS, serve
from bot.runtime.shipping import ShippingSetupError, ship_tasks
from bot.runtime.tasks import Task, checkpoint_task, intake_task, scheduler_task
from bot.runtime.web import Asgi, Route
from bot.service import Service
from bot.store.checkpoints import Checkpoint
from kit import logs


class StartError(Exception):
    """A start that cannot go ahead, saying why; nothing was started (exit 2)."""


@dataclass(frozen=True)
class Plugin:
    """What a surface plugs into serve: POST routes, tasks, ASGI mounts (with the paths the
    start line names), a second reader of each execution's lines, where checkpoints go."""

    routes: Mapping[str, Route] = field(default_factory=dict)
    tasks: Sequence[Task] = ()
    mounts: Mapping[str, Asgi] = field(default_factory=dict)
    shown: Sequence[str] = ()  # paths named in the "serving on" line, after the routes
    report: Callable[[int, str], None] | None = None
    checkpoint_post: Callable[[Checkpoint], None] | None = None
    note: str = ""  # the end of the "serving on" line ("; Slack in http mode")


@dataclass(frozen=True)
class Options:
    """``runbook serve``'s options: None takes the configuration's server.host and port."""

    host: str | None = None
    port: int | None = None
    init_db: bool = False  # create the database when it is not there (runbook db init)


def run(config: Config, options: Options, service_of: Callable[[Config], Service],
        plugins_of: Callable[[Service], Sequence[Plugin]]) -> None:
    """Check, assemble and serve until SIGTERM; StartError when a check refuses the start."""
    log_format(config)  # before anything logs: the Slack surface logs its scopes
    host = options.host or config.server.host
    port = options.port or config.server.port
    try:  # before anything starts: /alerts must not be open to the network by mistake
        alerts = alerts_access(config.server, host)
    except AlertsAuthError as exc:
        raise StartError(str(exc)) from None
    if alerts.warning:
        logs.liner("bot.serve", "warning: ", logging.WARNING, sys.stderr)(alerts.warning)
    if options.init_db:  # after the checks above: a refused start creates nothing
        from bot.store import db

        db.init(config.resolved_database_url())
    service = service_of(config)
    service.runbooks()
    plugins = list(plugins_of(service))
    tasks = [task for plugin in plugins for task in plugin.tasks]
    tasks += leader_tasks(service, plugins)
    routes = {path: route for plugin in plugins for path, route in plugin.routes.items()}
    mounts = {path: app for plugin in plugins for path, app in plugin.mounts.items()}
    shown = [*routes, *(path for plugin in plugins for path in plugin.shown)]
    paths = ", ".join(["/alerts", "/healthz", "/metrics", *shown])
    scheme = "https" if config.server.tls_cert_file else "http"
    logs.liner("bot.serve")(f"serving on {scheme}://{host}:{port} ({paths})"
                            + "".join(plugin.note for plugin in plugins))
    settle_heap()
    stop = threading.Event()  # SIGTERM (a pod stopping): give the leadership up, then exit
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm(stop, exit_deadline(config)))
    try:
        serve(service, host, port, _reporter(plugins), stop, routes=routes, tasks=tasks,
              alerts=alerts, mounts=mounts)
    except ListenError as exc:
        raise StartError(str(exc)) from None


def exit_deadline(config: Config) -> float:
    """Seconds after SIGTERM by which serve has ended whatever it waits for: the requests'
    grace, the HTTP server's thread, the tasks' threads, and 2 s for the exit itself."""
    return config.server.shutdown_grace_seconds + STOP_SLACK + TASKS_STOP_SECONDS + 2


def on_sigterm(stop: threading.Event, deadline: float) -> Callable[..., None]:
    """Stop; and should the process still run ``deadline`` seconds later (a thread that
    never ends, an exit that waits on one), write every thread's stack to stderr and exit 1,
    as a kill would end it (leases run out, another engine takes over), with the reason in
    the log and before the pod's grace period ends. A second SIGTERM does not move the
    deadline further away."""
    armed = threading.Event()

    def handler(*_: object) -> None:
        stop.set()
        if not armed.is_set():
            armed.set()
            faulthandler.dump_traceback_later(deadline, exit=True)

    return handler


def settle_heap() -> None:
    """Keep what the start made (modules, models, runbooks) out of the collector's full
    scans: one full collection over it stopped every thread for 75-85 ms, so each request
    then in flight, a Slack acknowledgement among them, waited that long (bench/slack_ack:
    5-12 ms after)."""
    gc.collect()
    gc.freeze()


def leader_tasks(service: Service, plugins: Sequence[Plugin]) -> list[Task]:
    """The leader's own tasks: schedules and windows fired, drains and node conditions the
    bot did not make turned into proposals, the log's head kept apart, the log shipped."""
    tasks = [scheduler_task(service, logs.liner("bot.scheduler", "[scheduler] ")),
             intake_task(service, logs.liner("bot.intake", "[intake] "))]
    tasks += _audit_tasks(service, plugins)
    try:  # a certificate or headers file that cannot be used stops the start, saying which
        tasks += ship_tasks(service, logs.liner("bot.audit.ship", "[audit-ship] "))
    except ShippingSetupError as exc:
        raise StartError(str(exc)) from None
    return tasks


def _audit_tasks(service: Service, plugins: Sequence[Plugin]) -> list[Task]:
    """The leader keeps the log's head apart: in a file, in the chat, or both."""
    audit_config = service.config.audit
    posts = [plugin.checkpoint_post for plugin in plugins if plugin.checkpoint_post]
    post = posts[0] if posts and audit_config.checkpoint_chat else None
    if audit_config.checkpoint_file is None and post is None:
        return []
    return [checkpoint_task(service, audit_config.checkpoint_file,
                            logs.liner("bot.audit", "[audit] "), post)]


def _reporter(plugins: Sequence[Plugin]) -> Reporter:
    """Each execution's lines to the log, and to each plugin that reads them (the chat)."""
    readers = [plugin.report for plugin in plugins if plugin.report is not None]
    if not readers:
        return logs.report

    def report(execution_id: int, line: str) -> None:
        logs.report(execution_id, line)
        for reader in readers:
            reader(execution_id, line)

    return report


def log_format(config: Config) -> None:
    """The bot's log lines on stderr, one per HTTP request among them (bot.runtime.web: never
    a header or a body): text, or JSON (logging.format, RUNBOOK_LOG_FORMAT)."""
    try:
        fmt = logs.chosen(config.logging.format, os.environ)
    except ValueError as exc:
        raise StartError(str(exc)) from None
    logs.install(fmt)

