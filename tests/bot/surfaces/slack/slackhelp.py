"""Driving the Slack surface as Slack would: signed requests in, the lab's Web API fake out."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slack_sdk.signature import SignatureVerifier

from bot.runtime.serving import serve
from bot.service import Service
from bot.surfaces.slack.secrets import SlackSecrets
from bot.surfaces.slack.surface import SlackSurface
from tests.lab.fixture import Lab


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class FakeSlack:
    """The lab's fake of Slack's Web API: what the bot called, and faults to arm."""

    url: str  # http://127.0.0.1:PORT (the control endpoints live under /_lab/)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            raw = answer.read()
        return json.loads(raw) if raw else None

    def calls(self, method: str | None = None) -> list[dict[str, Any]]:
        query = f"?method={urllib.parse.quote(method)}" if method else ""
        found = self._call("GET", "/_lab/calls" + query)
        return list(found["calls"] if isinstance(found, dict) else found)

    def reset(self) -> None:
        self._call("POST", "/_lab/reset", {})

    def ratelimit(self, count: int, retry_after: int = 1, method: str | None = None) -> None:
        self._call("POST", "/_lab/faults",
                   {"ratelimit": count, "retry_after": retry_after, "method": method})

    def response_url(self, kind: str, payload: dict[str, Any]) -> str:
        """A response_url the fake issued, as Slack issues one per command."""
        return str(self._call("POST", "/_lab/responses", {"type": kind, "payload": payload})["url"])

    def responses(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/_lab/responses"))

    def socket_send(self, kind: str, payload: dict[str, Any],
                    envelope_id: str | None = None) -> str:
        body: dict[str, Any] = {"type": kind, "payload": payload,
                                "accepts_response_payload": kind == "slash_commands"}
        if envelope_id:
            body["envelope_id"] = envelope_id
        return str(self._call("POST", "/_lab/socket/send", body)["envelope_id"])

    def socket_acks(self) -> list[dict[str, Any]]:
        found = self._call("GET", "/_lab/socket/acks")
        return list(found["acks"] if isinstance(found, dict) else found)

    def socket_clients(self) -> int:
        found = self._call("GET", "/_lab/socket/clients")
        return int(found["clients"] if isinstance(found, dict) else found)

    def wait(self, what: Callable[[], Any], seconds: float = 30, message: str = "") -> Any:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = what()
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting: {message}")


@dataclass
class SlackClientSide:
    """Sends what Slack sends: signed slash commands and button clicks."""

    events_url: str
    secret: str
    fake: FakeSlack

    def post(self, body: str, *, timestamp: int | None = None, secret: str | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, str, float]:
        ts = str(int(time.time()) if timestamp is None else timestamp)
        signature = SignatureVerifier(secret or self.secret).generate_signature(
            timestamp=ts, body=body)
        assert signature is not None  # None only when there is no timestamp
        request = urllib.request.Request(self.events_url, data=body.encode(), method="POST",
                                         headers={"Content-Type":
                                                  "application/x-www-form-urlencoded",
                                                  "X-Slack-Request-Timestamp": ts,
                                                  "X-Slack-Signature": signature,
                                                  **(headers or {})})
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return answer.status, answer.read().decode(), time.perf_counter() - started
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), time.perf_counter() - started

    def command_body(self, text: str, user: str, trigger_id: str | None = None) -> str:
        fields = {
            "token": "unused", "team_id": "T0LAB", "team_domain": "lab",
            "channel_id": "C0RUNBOOK", "channel_name": "gpu-ops", "user_id": user,
            "user_name": user.lower(), "command": "/runbook", "text": text,
            "api_app_id": "A0LAB", "trigger_id": trigger_id or f"trigger-{uuid.uuid4().hex}",
        }
        fields["response_url"] = self.fake.response_url("slash_commands", fields)
        return urllib.parse.urlencode(fields)

    def command(self, text: str, user: str, **kwargs: Any) -> tuple[int, str, float]:
        return self.post(self.command_body(text, user), **kwargs)

    def click_body(self, action_id: str, value: str, user: str, ts: str = "0") -> str:
        payload = {
            "type": "block_actions", "team": {"id": "T0LAB"}, "api_app_id": "A0LAB",
            "user": {"id": user, "username": user.lower(), "team_id": "T0LAB"},
            "container": {"type": "message", "message_ts": ts, "channel_id": "C0RUNBOOK"},
            "channel": {"id": "C0RUNBOOK", "name": "gpu-ops"},
            "trigger_id": f"trigger-{uuid.uuid4().hex}",
            "actions": [{"action_id": action_id, "block_id": "b", "value": value,
                         "type": "button", "action_ts": str(time.time())}],
        }
        return urllib.parse.urlencode({"payload": json.dumps(payload)})

    def click(self, action_id: str, value: str, user: str, **kwargs: Any
              ) -> tuple[int, str, float]:
        return self.post(self.click_body(action_id, value, user), **kwargs)


LAB_FOLDER = Path(__file__).resolve().parents[4] / "deploy" / "lab"


@contextmanager
def standalone_fake(folder: Path) -> Iterator[tuple[FakeSlack, SlackSecrets]]:
    """The lab's Slack fake alone (no other lab daemon), on a free port, with tokens of its
    own: yields it and the HTTP-mode secrets a bot uses with it."""
    tokens = {"bot_token": f"xoxb-alone-{secrets.token_hex(8)}",
              "app_token": f"xapp-alone-{secrets.token_hex(8)}"}
    tokens_file = folder / "slack-tokens.json"
    tokens_file.write_text(json.dumps(tokens))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "slackapi", "--port", str(port),
                             "--tokens-file", str(tokens_file), "--log",
                             str(folder / "slack-fake.log")],
                            cwd=LAB_FOLDER, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    fake = FakeSlack(f"http://127.0.0.1:{port}")
    try:
        fake.wait(lambda: answers(fake.url + "/_lab/health"), 15, "the Slack fake to start")
        yield fake, SlackSecrets(bot_token=tokens["bot_token"],
                                 signing_secret=secrets.token_hex(16), app_token=None,
                                 api_url=fake.url + "/api/", mode="http")
    finally:
        proc.terminate()
        proc.wait(10)


def answers(url: str) -> bool:
    """True when ``url`` answers (any status below 400) within a second."""
    try:
        urllib.request.urlopen(url, timeout=1).close()
        return True
    except OSError:
        return False


def slack_secrets(lab: Lab, *, socket: bool = False) -> SlackSecrets:
    env = lab.env
    return SlackSecrets(bot_token=env["SLACK_BOT_TOKEN"],
                        signing_secret=env["SLACK_SIGNING_SECRET"],
                        app_token=env["LAB_SLACK_APP_TOKEN"] if socket else None,
                        api_url=env["SLACK_API_URL"], mode="socket" if socket else "http")


@contextmanager
def serving(bot: Service, secrets: SlackSecrets) -> Iterator[tuple[SlackSurface, str]]:
    """``runbook serve`` in this process with the Slack surface; yields it and its base URL."""
    surface = SlackSurface(bot, secrets)
    port = free_port()
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(bot, "127.0.0.1", port, surface.report, stop),
                              kwargs={"routes": surface.routes(), "tasks": surface.tasks()},
                              daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(base + "/healthz", timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    try:
        yield surface, base
    finally:
        stop.set()
        thread.join(30)
