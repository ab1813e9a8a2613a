"""What ``runbook serve`` plugs in for Slack: a route (HTTP mode) or a socket (Socket Mode),
the progress poster, and a reporter that feeds the engine's lines to the threads."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from slack_bolt.request.internals import parse_body

from bot.runtime.tasks import Task
from bot.runtime.web import AtOnce, Response, Route, json_response
from bot.service import Service
from bot.surfaces.slack import scopes
from bot.surfaces.slack import secrets as slack_secrets
from bot.surfaces.slack.app import Listeners, build_app
from bot.surfaces.slack.identity import Identities
from bot.surfaces.slack.poster import Poster
from bot.surfaces.slack.secrets import SlackSecrets, SlackSetupError

log = logging.getLogger(__name__)
SLACK_API = "https://slack.com/api/"
WORK_THREADS = 8


def web_client(secrets: SlackSecrets) -> Any:
    from slack_sdk import WebClient
    from slack_sdk.http_retry.builtin_handlers import (
        ConnectionErrorRetryHandler,
        RateLimitErrorRetryHandler,
    )

    base = secrets.api_url or SLACK_API
    return WebClient(token=secrets.bot_token, base_url=base if base.endswith("/") else base + "/",
                     timeout=15, retry_handlers=[ConnectionErrorRetryHandler(max_retry_count=2),
                                                 RateLimitErrorRetryHandler(max_retry_count=5)])


class SlackSurface:
    def __init__(self, service: Service, secrets: SlackSecrets) -> None:
        assert service.config.slack is not None
        self.secrets = secrets
        self.client = web_client(secrets)
        self.poster = Poster(service, self.client, service.config.slack.channel,
                             service.config.slack.poll_seconds)
        self.identities = Identities(service.config, self.client)
        self.work = ThreadPoolExecutor(WORK_THREADS, thread_name_prefix="slack-work")
        self.listeners = Listeners(service, self.client, self.identities, self.work,
                                   self.poster.nudge)
        try:  # calls auth.test
            self.app = build_app(service, secrets, self.client, self.listeners)
        except Exception as exc:
            raise SlackSetupError(f"Slack did not accept the bot token at "
                                  f"{secrets.api_url or SLACK_API}: {_reason(exc)}") from exc
        self.features_off = scopes.check(self.client)  # logged; never fails the start
        self.identities.refresh_if_due()

    @property
    def mode(self) -> str:
        return self.secrets.mode

    def routes(self) -> Mapping[str, Route]:
        if self.mode != "http":
            return {}
        return {"/slack/events": AtOnce(self._acknowledge, self._http)}

    def tasks(self) -> list[Task]:
        tasks = [Task("slack-progress", self.poster.run, leader_only=True)]
        if self.mode == "socket":
            tasks.append(Task("slack-socket", self._socket, leader_only=False))
        return tasks

    def report(self, execution_id: int, line: str) -> None:
        self.poster.report(execution_id, line)

    def _acknowledge(self, headers: Mapping[str, str], body: bytes) -> Response | None:
        """POST /slack/events on the server's event loop: the signature checked first (401),
        then a ``/runbook`` command or a button click acknowledged with an empty 200 and
        handed to the work pool (``Listeners.acknowledged``); None (to ``_http``, in a worker
        thread) for anything else. Their listeners acknowledge with nothing anyway (answers go
        to response_url and chat.postEphemeral), and each worker thread Bolt's dispatch holds
        delays the next acknowledgement: 50 commands at once were acknowledged in 140 ms
        (p99) that way on two cores, with the work running. Slack allows 3 s."""
        text = body.decode("utf-8", "replace")
        if not _signed(self.secrets.signing_secret, text, headers):  # before anything else
            return json_response(401, {"error": "not signed with this Slack app's signing "
                                                "secret in the last 5 minutes"})
        try:
            parsed = parse_body(text, headers.get("content-type"))
        except Exception:  # not JSON (or nested past Python's stack): Bolt's 400, in _http
            return None
        return Response(200, b"", "text/plain") if self.listeners.acknowledged(parsed) else None

    def _http(self, headers: Mapping[str, str], body: bytes) -> Response:
        """POST /slack/events through Bolt, in a worker thread: what ``_acknowledge`` did
        not answer. Bolt's Starlette adapter (slack_bolt.adapter.starlette) does what this
        does, but calls App.dispatch on the event loop, where Bolt waits for the listener's
        ack in 10 ms sleeps: every other request would wait behind it."""
        from slack_bolt import BoltRequest

        text = body.decode("utf-8", "replace")
        if not _signed(self.secrets.signing_secret, text, headers):  # before Bolt parses it
            return json_response(401, {"error": "not signed with this Slack app's signing "
                                                "secret in the last 5 minutes"})
        try:
            request = BoltRequest(body=text, headers=dict(headers))
        except Exception:  # not JSON, or JSON of another shape than Slack's: Bolt raises
            return json_response(400, {"error": "not a Slack request body"})
        answer = self.app.dispatch(request)
        if answer.status >= 500:  # Bolt failed on a body of a shape Slack never sends (and
            return json_response(400, {"error": "not a Slack request body"})  # logged it)
        content_type = (answer.headers.get("content-type") or ["text/plain"])[0]
        return Response(answer.status, (answer.body or "").encode(), content_type)

    def _socket(self, stop: threading.Event) -> None:
        from slack_bolt.adapter.socket_mode import SocketModeHandler

        # a larger receive buffer: the built-in client fails on messages over ~1 MB with
        # its default of 1 KiB (RecursionError)
        handler = SocketModeHandler(self.app, app_token=self.secrets.app_token,
                                    web_client=self.client, receive_buffer_size=65536)
        handler.connect()  # type: ignore[no-untyped-call]
        log.info("Slack Socket Mode connected")
        try:
            stop.wait()
        finally:
            handler.close()  # type: ignore[no-untyped-call]


def _signed(secret: str | None, body: str, headers: Mapping[str, str]) -> bool:
    """Whether Slack signed the request (X-Slack-Signature, X-Slack-Request-Timestamp).
    Checked before Bolt sees the body: Bolt parses it first and fails (a 500) on a body that
    is not JSON or a timestamp that is not a number, whoever sent it."""
    from slack_sdk.signature import SignatureVerifier

    if not secret:
        return False
    try:
        return SignatureVerifier(secret).is_valid_request(body, headers)
    except ValueError:  # a timestamp that is not a number
        return False


def from_environment(service: Service) -> SlackSurface | None:
    """The Slack surface when its secrets are set (None when Slack is not set up)."""
    secrets = slack_secrets.load(service.config.slack)
    return None if secrets is None else SlackSurface(service, secrets)


def _reason(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if response is not None and hasattr(response, "get"):
        return str(response.get("error") or exc)
    return f"{type(exc).__name__}: {exc}"
