"""What ``runbook serve`` plugs in for Slack: a route (HTTP mode) or a socket (Socket Mode),
the progress poster, and a reporter that feeds the engine's lines to the threads."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bot.runtime.tasks import Task
from bot.runtime.web import Response, Route, json_response
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
        # Bolt's dispatch of what /slack/events acknowledged at once (_acknowledged_at_once)
        self.dispatching = ThreadPoolExecutor(WORK_THREADS, thread_name_prefix="slack-dispatch")
        listeners = Listeners(service, self.client, self.identities, self.work, self.poster.nudge)
        try:
            self.app = build_app(service, secrets, self.client, listeners)  # calls auth.test
        except Exception as exc:
            raise SlackSetupError(f"Slack did not accept the bot token at "
                                  f"{secrets.api_url or SLACK_API}: {_reason(exc)}") from exc
        self.features_off = scopes.check(self.client)  # logged; never fails the start
        self.identities.refresh_if_due()

    @property
    def mode(self) -> str:
        return self.secrets.mode

    def routes(self) -> Mapping[str, Route]:
        return {"/slack/events": self._http} if self.mode == "http" else {}

    def tasks(self) -> list[Task]:
        tasks = [Task("slack-progress", self.poster.run, leader_only=True)]
        if self.mode == "socket":
            tasks.append(Task("slack-socket", self._socket, leader_only=False))
        return tasks

    def report(self, execution_id: int, line: str) -> None:
        self.poster.report(execution_id, line)

    def _http(self, headers: Mapping[str, str], body: bytes) -> Response:
        """POST /slack/events. Bolt's Starlette adapter (slack_bolt.adapter.starlette) does
        what this does, but calls App.dispatch on the event loop, where Bolt waits for the
        listener's ack in 10 ms sleeps: every other request would wait behind it. As a route
        this runs in the server's thread pool, after its body checks."""
        from slack_bolt import BoltRequest

        text = body.decode("utf-8", "replace")
        if not _signed(self.secrets.signing_secret, text, headers):  # before Bolt parses it
            return json_response(401, {"error": "not signed with this Slack app's signing "
                                                "secret in the last 5 minutes"})
        try:
            request = BoltRequest(body=text, headers=dict(headers))
        except Exception:  # not JSON, or JSON of another shape than Slack's: Bolt raises
            return json_response(400, {"error": "not a Slack request body"})
        if _acknowledged_at_once(request.body):
            self.dispatching.submit(self._dispatch, request)
            return Response(200, b"", "text/plain")
        answer = self.app.dispatch(request)
        if answer.status >= 500:  # Bolt failed on a body of a shape Slack never sends (and
            return json_response(400, {"error": "not a Slack request body"})  # logged it)
        content_type = (answer.headers.get("content-type") or ["text/plain"])[0]
        return Response(answer.status, (answer.body or "").encode(), content_type)

    def _dispatch(self, request: Any) -> None:
        """Bolt's dispatch of a request already acknowledged (its answer goes nowhere)."""
        try:
            answer = self.app.dispatch(request)
        except Exception:
            log.exception("Slack request failed after it was acknowledged")
            return
        if answer.status >= 400:
            log.warning("Slack request acknowledged, then refused by Bolt: %d", answer.status)

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


def _acknowledged_at_once(body: Any) -> bool:
    """Whether the request is a slash command or a button click: acknowledged with an empty
    200 as soon as its signature is checked, and handed to Bolt after. Their listeners
    acknowledge with nothing anyway (answers go to response_url and chat.postEphemeral), and
    Bolt's dispatch waits for the listener's ack in 10 ms sleeps in a busy thread pool: on
    two cores, 20 commands at once took 300 ms to acknowledge that way (Slack allows 3 s)."""
    if not isinstance(body, dict):
        return False
    return isinstance(body.get("command"), str) or body.get("type") == "block_actions"


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
