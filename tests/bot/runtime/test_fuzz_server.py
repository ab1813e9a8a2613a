"""Hostile input against the real server (uvicorn on a socket, raw HTTP): POST /alerts with
junk bytes, junk JSON, malformed Alertmanager webhooks and wrong tokens; POST /slack/events
with signed junk form fields and button payloads, and unsigned or badly signed ones; and
fuzzed `/runbook` lines from a requester who is no approver. For every example: no 5xx,
/healthz still answers, every request that reached the bot was handled (no failure logged,
each command answered), and nothing was approved or run. Slack's Web API is a local fake."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from concurrent.futures import Executor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from slack_sdk.signature import SignatureVerifier
from sqlalchemy import func, select

from bot.alerts import proposing
from bot.runtime.httpserver import HttpServer, Settings
from bot.runtime.serving import application
from bot.service import Service
from bot.store.schema import approvals, audit_events, executions, proposals
from bot.store.words import Kind, State
from bot.surfaces.slack import app as slack_app
from bot.surfaces.slack import surface as slack_surface
from bot.surfaces.slack.secrets import SlackSecrets
from bot.surfaces.slack.surface import SlackSurface
from tests.conftest import BotFactory

TOKEN = "fuzz-alerts-token-0123456789abcdef"
SECRET = "fuzz-signing-secret"
REQUESTER = "U0ALICE"  # alice: a requester (group oncall), no approver
APPROVER = "U0CAROL"  # carol: an approver; never the sender of a fuzzed request
RUNBOOK = {
    "name": "drain", "version": "1.0.0", "summary": "drain a node", "risk": "medium",
    "params": {"node": {"type": "node", "required": True}},
    "locks": ["node:{{ node }}"],
    "approval": {"required": 1, "approvers": ["group:gpu-leads"], "expires": "30m"},
    "steps": [{"id": "note", "action": "chat.notify", "with": {"message": "drain {{ node }}"}}],
}
RULES = [  # no auto_run: an alert only ever proposes
    {"match": {"alertname": "GpuXidFallenOffBus"}, "runbook": "drain",
     "params": {"node": "{{ labels.node }}"}},
    {"match": {"alertname": "GpuTemperatureHigh|GpuEccDoubleBit"}, "runbook": "drain",
     "params": {"node": "{{ labels.node }}-{{ labels.gpu | default('x') }}"}},
]
# what nobody in these tests may cause: a decision, a start, a step, a check
FORBIDDEN = {Kind.APPROVED, Kind.DENIED, Kind.STARTED, Kind.STEP_STARTED, Kind.STEP_FINISHED,
             Kind.CHECK_EVALUATED, Kind.CONFIRMED, Kind.CONFIRMATION_DECLINED,
             Kind.SCHEDULE_APPROVED, Kind.WINDOW_APPROVED, Kind.WINDOW_OPENING}
FUZZ = settings(max_examples=50, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


# --- a local fake of Slack's Web API and response URLs ------------------------------------

class FakeSlackHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        server = self.server
        assert isinstance(server, FakeSlack)
        with server.lock:
            server.paths.append(self.path)
        data: dict[str, Any] = {"ok": True}
        if self.path.endswith("/auth.test"):
            data.update(url="https://lab.slack.com/", team="lab", user="runbook",
                        team_id="T0LAB", user_id="U0BOT", bot_id="B0BOT",
                        is_enterprise_install=False)
        body = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


class FakeSlack(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), FakeSlackHandler)
        self.lock = threading.Lock()
        self.paths: list[str] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def answered(self, path: str) -> bool:
        with self.lock:
            return path in self.paths

    def responses(self) -> int:
        """How many answers were posted to response URLs."""
        with self.lock:
            return sum(p.startswith("/response/") for p in self.paths)


# --- the server under attack --------------------------------------------------------------

class Failures(logging.Handler):
    """Errors logged where a request that reached the bot failed after all."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def take(self) -> list[str]:
        found = [f"{r.name}: {r.getMessage()} {r.exc_info[1]!r}" if r.exc_info
                 else f"{r.name}: {r.getMessage()}" for r in self.records]
        self.records.clear()
        return found


class Served:
    """The running server and what the tests look at (a plain class: short in reports)."""

    def __init__(self, bot: Service, port: int, surface: SlackSurface, slack: FakeSlack,
                 failures: Failures, seeded: Any) -> None:
        self.bot, self.port, self.surface, self.slack = bot, port, surface, slack
        self.failures = failures
        self.seeded = int(seeded.id)  # an execution bob requested: awaiting carol's approval
        self.plan_hash = str(seeded.plan_hash)

    def __repr__(self) -> str:
        return f"Served(port={self.port})"


LOGGERS = ("bot.surfaces.slack.app", "bot.alerts.proposing", "uvicorn.error", "slack_bolt")


@pytest.fixture
def served(make_bot: BotFactory) -> Iterator[Served]:
    slack = FakeSlack()
    threading.Thread(target=slack.serve_forever, args=(0.05,), daemon=True).start()
    bot = make_bot({"drain": RUNBOOK}, alert_rules=RULES,
                   slack={"channel": "C0RUNBOOK", "users": {REQUESTER: "alice",
                                                            APPROVER: "carol"}})
    seeded = bot.get(bot.request("drain", {"node": "gpu01"}, "bob"))
    proposing.receive(bot, proposing.parse(json.dumps(webhook([alert("gpu02")])).encode()))
    surface = SlackSurface(bot, SlackSecrets(bot_token="xoxb-fuzz", signing_secret=SECRET,
                                             app_token=None, api_url=slack.url + "/api/",
                                             mode="http"))
    server = HttpServer(application(bot, surface.routes(), alerts_token=TOKEN),
                        "127.0.0.1", 0, Settings(grace=1))
    failures = Failures()
    for name in LOGGERS:
        logging.getLogger(name).addHandler(failures)
    server.start()
    try:
        yield Served(bot, server.port, surface, slack, failures, seeded)
    finally:
        server.stop()
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(failures)
        ack_pool(surface).shutdown(wait=True)
        surface.work.shutdown(wait=True)
        slack.shutdown()
        slack.server_close()


def ack_pool(surface: SlackSurface) -> Executor:
    return surface.app._listener_runner.listener_executor


def drain(pool: Executor, width: int) -> None:
    """Return once everything ``pool`` (``width`` threads, first in first out) was given
    before has finished: ``width`` tasks that wait for each other all run at once."""
    barrier = threading.Barrier(width + 1)
    for _ in range(width):
        pool.submit(barrier.wait, 10)
    barrier.wait(10)


def settle(served: Served) -> None:
    """Wait for the work acknowledged: Bolt's listeners (which hand it on; commands and
    buttons skip them), then the work."""
    drain(ack_pool(served.surface), slack_app.ACK_THREADS)
    drain(served.surface.work, slack_surface.WORK_THREADS)


# --- raw HTTP -----------------------------------------------------------------------------

def exchange(port: int, raw: bytes) -> tuple[int, bytes]:
    """Send ``raw`` on a new connection; the answer's status and body (read to the close)."""
    chunks: list[bytes] = []
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with contextlib.suppress(ConnectionError):  # refused before it read it all
            sock.sendall(raw)
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), head[:80]
    return int(head.split(b" ", 2)[1]), body


def post(port: int, path: str, body: bytes, headers: list[tuple[str, str]]) -> int:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close",
             f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers)]
    status, _ = exchange(port, "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body)
    return status


def healthy(port: int) -> bool:
    status, body = exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    return status == 200 and json.loads(body)["status"] == "ok"


def assert_nothing_done(served: Served, *, failures_allowed: bool = False) -> None:
    assert healthy(served.port)
    with served.bot.db.connect() as conn:
        states = dict(conn.execute(select(executions.c.id, executions.c.state)).all())
        decided = conn.execute(select(func.count()).select_from(approvals)).scalar()
        kinds = set(conn.execute(select(audit_events.c.kind).where(
            audit_events.c.kind.in_(sorted(FORBIDDEN)))).scalars())
        proposed = set(conn.execute(select(proposals.c.state)).scalars())
    assert states[served.seeded] == State.AWAITING_APPROVAL
    # alice may ask for runs and cancel her own requests; nothing else may move
    assert set(states.values()) <= {State.AWAITING_APPROVAL, State.CANCELLED}, states
    assert decided == 0 and not kinds, kinds
    assert proposed <= {"open", "refused", "started", "dismissed"}, proposed
    failures = served.failures.take()
    assert failures_allowed or not failures, failures


# --- 1. POST /alerts ----------------------------------------------------------------------

def webhook(alerts: Any, **fields: Any) -> dict[str, Any]:
    return {"version": "4", "status": "firing", "receiver": "bot", "groupKey": "{}:{}",
            "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://alertmanager", "alerts": alerts, **fields}


def alert(node: Any, name: str = "GpuXidFallenOffBus", **fields: Any) -> dict[str, Any]:
    return {"status": "firing", "labels": {"alertname": name, "node": node, "gpu": "3"},
            "annotations": {}, "startsAt": "2026-11-30T10:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "",
            "fingerprint": f"f-{uuid.uuid4().hex[:8]}", **fields}


def alerts_status(served: Served, body: bytes, authorization: str | None = f"Bearer {TOKEN}",
                  extra: list[tuple[str, str]] | None = None) -> int:
    headers = [("Content-Type", "application/json"), *(extra or [])]
    if authorization is not None:
        headers.append(("Authorization", authorization))
    status = post(served.port, "/alerts", body, headers)
    event(f"HTTP {status}")
    return status


def assert_only_proposed(served: Served) -> None:
    """After /alerts: proposals open or refused (the seeded one too), and no execution but
    the seeded one."""
    with served.bot.db.connect() as conn:
        states = set(conn.execute(select(proposals.c.state)).scalars())
        count = conn.execute(select(func.count()).select_from(executions)).scalar()
    assert states <= {"open", "refused"} and count == 1, (states, count)
    assert_nothing_done(served)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                   max_size=4),
    max_leaves=12)
ODD = st.sampled_from([
    "", " ", "gpu01", "gpu02", "gpu99", "GPU01", "gpu01 ", "gpu01\x00", "gpu01\n", "{{ 7*7 }}",
    "{% for x in range(9**9) %}{% endfor %}", "{{ labels }}", "${PATH}", "$(id)",
    "gpu01; rm -rf /", "../../etc/passwd", "\u202egpu01", "gpu\u200b01", "ｇｐｕ０１",
    "\ud7ff", "🔥" * 50, "gpu01' OR '1'='1"])
LABEL = st.one_of(ODD, st.text(max_size=40),
                  st.integers(1, 5_000).map(lambda n: "g" * n))  # huge
LABELS = st.fixed_dictionaries(
    {"alertname": st.sampled_from(["GpuXidFallenOffBus", "GpuTemperatureHigh",
                                   "GpuEccDoubleBit", "Other"]) | LABEL},
    optional={"node": LABEL, "gpu": LABEL}).flatmap(
    lambda fixed: st.dictionaries(LABEL, LABEL, max_size=3).map(lambda more: {**more,
                                                                               **fixed}))


def maybe(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly ``good``, sometimes anything JSON holds."""
    return st.one_of(good, good, good, JSON)


def dropping(whole: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    """``whole``, or it without some of its keys."""
    return st.one_of(whole, whole.flatmap(lambda d: st.sets(st.sampled_from(sorted(d))).map(
        lambda gone: {k: v for k, v in d.items() if k not in gone})))


def same(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return strategy


def webhooks(broken: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Alertmanager's webhooks with odd values; ``broken``: wrong types and missing keys too."""
    bend, drop = (maybe, dropping) if broken else (same, same)
    one = drop(st.fixed_dictionaries({
        "status": bend(st.sampled_from(["firing", "firing", "resolved",
                                        *(["Firing", ""] if broken else [])])),
        "labels": bend(LABELS),
        "annotations": bend(st.dictionaries(st.text(max_size=10), LABEL, max_size=3)),
        "startsAt": bend(st.sampled_from(["2026-11-30T10:00:00Z", "", "yesterday",
                                          "9999-99-99T99:99:99Z", "0001-01-01T00:00:00Z"])
                         | st.text(max_size=50)),
        "fingerprint": bend(st.sampled_from(["f1", "f2"])
                            | st.text(min_size=1, max_size=70 if broken else 64)),
    }, optional={"endsAt": JSON, "generatorURL": JSON}))
    return drop(st.fixed_dictionaries({
        "version": bend(st.sampled_from(["4", *(["3", "04", " 4"] if broken else [])])),
        "status": bend(st.sampled_from(["firing", "resolved"])),
        "alerts": bend(st.lists(one, max_size=4)),
    }, optional={"receiver": JSON, "groupLabels": JSON, "commonLabels": JSON, "extra": JSON}))


WEBHOOK = st.one_of(webhooks(broken=False), webhooks(broken=True))


@FUZZ
@given(body=st.binary(min_size=1, max_size=2000))
@example(body=b"\x00")
@example(body=b"{" * 5000)
@example(body=b"[" * 100_000 + b"]" * 100_000)
@example(body=b'{"version": "4", "status": "firing", "alerts": [' + b"{}," * 30_000 + b"{}]}")
@example(body=b"\xef\xbb\xbf{}")  # a BOM
@example(body=b"[" + b" " * (1024 * 1024) + b"]")  # over 1 MiB: 413
def test_alerts_survive_any_bytes(served: Served, body: bytes) -> None:
    assert alerts_status(served, body) in (200, 400, 413)
    assert_only_proposed(served)


@FUZZ
@given(data=JSON)
def test_alerts_survive_any_json(served: Served, data: Any) -> None:
    assert alerts_status(served, json.dumps(data).encode()) in (200, 400, 413)
    assert_only_proposed(served)


@settings(FUZZ, max_examples=80)
@given(hook=WEBHOOK)
@example(hook=webhook([alert("gpu03")]))
@example(hook=webhook([alert("gpu01", fingerprint="x" * 65)]))
@example(hook=webhook([alert(7)]))
@example(hook=webhook([alert("gpu01", "GpuTemperatureHigh") for _ in range(201)]))
@example(hook=webhook([{**alert("gpu01"), "labels": {"alertname": "GpuXidFallenOffBus"}}]))
@example(hook=webhook([alert("gpu01", status="resolved")]))
@example(hook=webhook([alert("g" * 900_000)]))  # a label just under the 1 MiB body limit
@example(hook=webhook([alert("gpu01", "GpuEccDoubleBit", fingerprint="f1")] * 3))
def test_alerts_survive_malformed_webhooks(served: Served, hook: dict[str, Any]) -> None:
    assert alerts_status(served, json.dumps(hook).encode()) in (200, 400, 413)
    assert_only_proposed(served)


HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF,
                                    exclude_characters="\x7f"), max_size=80)
WRONG_AUTH = st.one_of(st.none(), HEADER_TEXT, st.sampled_from([
    "Bearer", "Bearer ", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", f"Basic {TOKEN}",
    f"{TOKEN}", f"Bearer{TOKEN}", f"Bearer {TOKEN.upper()}", f"Bearer {TOKEN}\x00",
    f"Bearer {TOKEN}, Bearer {TOKEN}", f"Bearer {TOKEN}\u00e9", "Bearer \u00ff" * 40]))


@FUZZ
@given(authorization=WRONG_AUTH, doubled=st.booleans(), body=st.sampled_from([
    json.dumps(webhook([alert("gpu03")])).encode(), b"{}", b"\xff"]))
def test_alerts_refuse_wrong_tokens(served: Served, authorization: str | None, doubled: bool,
                                    body: bytes) -> None:
    extra = [("Authorization", f"Bearer {TOKEN}")] if doubled and authorization else []
    assert alerts_status(served, body, authorization, extra) in (400, 401)
    assert_only_proposed(served)


# --- 2. POST /slack/events ----------------------------------------------------------------

FORM = "application/x-www-form-urlencoded"


def signed_headers(body: str, *, secret: str = SECRET, timestamp: str | None = None,
                   content_type: str | None = FORM) -> list[tuple[str, str]]:
    ts = timestamp if timestamp is not None else str(int(time.time()))
    signature = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)
    assert signature is not None
    headers = [("X-Slack-Request-Timestamp", ts), ("X-Slack-Signature", signature)]
    return headers + ([("Content-Type", content_type)] if content_type else [])


def slack_status(served: Served, body: str, headers: list[tuple[str, str]]) -> int:
    status = post(served.port, "/slack/events", body.encode(), headers)
    settle(served)
    event(f"HTTP {status}")
    return status


def command_fields(text: str, user: str = REQUESTER) -> dict[str, str]:
    """A slash command as Slack sends it, answered at a response URL of the fake."""
    trigger = uuid.uuid4().hex
    return {"token": "unused", "team_id": "T0LAB", "team_domain": "lab",
            "channel_id": "C0RUNBOOK", "channel_name": "gpu-ops", "user_id": user,
            "user_name": "someone", "command": "/runbook", "text": text, "api_app_id": "A0LAB",
            "trigger_id": f"trigger-{trigger}", "response_url": f"/response/{trigger}"}


def with_urls(served: Served, fields: dict[str, Any]) -> dict[str, Any]:
    """``response_url`` made absolute, on the fake."""
    url = fields.get("response_url")
    if isinstance(url, str) and url.startswith("/response/"):
        return {**fields, "response_url": served.slack.url + url}
    return fields


SLACK_IDS = st.one_of(st.sampled_from([REQUESTER, "U0MALLORY", "", "U0ALICE ", "u0alice",
                                       "U0ALICE\x00", "W0ALICE", "slack:U0ALICE"]),
                      st.text(max_size=20))
COMMAND_FIELDS = st.builds(command_fields, st.text(max_size=200), SLACK_IDS).flatmap(
    lambda fields: dropping(st.fixed_dictionaries({
        **{k: st.just(v) for k, v in fields.items()},
        "command": st.sampled_from(["/runbook", "/runbook", "/RUNBOOK", "/runbok", "runbook",
                                    ""]) | st.text(max_size=20),
        "team_id": maybe(st.text(max_size=12)), "channel_id": maybe(st.text(max_size=12)),
        "trigger_id": st.just(fields["trigger_id"]) | st.text(max_size=20),
    }, optional={"payload": st.text(max_size=40), "ssl_check": st.sampled_from(["1", "0"]),
                 "type": st.sampled_from(["url_verification", "event_callback"]),
                 "challenge": st.text(max_size=20), "is_enterprise_install": JSON,
                 "enterprise_id": JSON})))


@FUZZ
@given(fields=COMMAND_FIELDS,
       content_type=st.sampled_from([FORM, FORM, FORM, "application/json", "text/plain", None]))
@example(fields=command_fields("approve 1"), content_type=FORM)
@example(fields=command_fields("approve 1", "U0MALLORY"), content_type=FORM)
def test_signed_commands_with_fuzzed_fields(served: Served, fields: dict[str, Any],
                                            content_type: str | None) -> None:
    body = urllib.parse.urlencode(with_urls(served, fields))
    assert slack_status(served, body, signed_headers(body, content_type=content_type)) < 500
    # Slack always sends these two; without them the work fails after the ack (and says so)
    assert_nothing_done(served, failures_allowed=not {"user_id", "response_url"} <= set(fields))


BUTTONS = st.sampled_from(["approve", "deny", "cancel", "run_proposal", "dismiss_proposal",
                           "confirm_yes", "confirm_no"])
ACTION_IDS = st.one_of(BUTTONS, BUTTONS, BUTTONS, st.sampled_from(["APPROVE", "approve ", ""]))
VALUES = st.one_of(st.sampled_from([
    "{id}:{hash}", "{id}:", "{id}", "{id}:{hash}:more", "1", "1:" + "0" * 64, "2:x", "-1:x",
    "0:x", "99999999999999999999:x", "1" * 400 + ":x", "1" * 5000 + ":x", "²:x", "١:{hash}",
    "１:{hash}", " 1:{hash}", "1 :{hash}", "{id}:note:{hash}", "{id}:../../x:{hash}", ":", "",
    "{id}:{hash}\x00", "{id}\u202e:{hash}"]), st.text(max_size=60))


def clicks(broken: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Button payloads as Slack sends them, with fuzzed users, actions and values;
    ``broken``: wrong types, missing keys and other payload types too."""
    bend, drop = (maybe, dropping) if broken else (same, same)
    action = drop(st.fixed_dictionaries({
        "action_id": bend(ACTION_IDS | st.text(max_size=20)) if broken else ACTION_IDS,
        "value": bend(VALUES),
        "block_id": st.just("b"), "type": st.just("button"), "action_ts": st.just("1.0")}))
    return drop(st.fixed_dictionaries({
        "type": bend(st.sampled_from(["block_actions", *(["interactive_message",
                                      "view_submission", "shortcut", ""] if broken else [])])),
        "user": bend(drop(st.fixed_dictionaries({"id": SLACK_IDS, "team_id": st.just("T0LAB"),
                                                 "username": st.text(max_size=10)}))),
        "team": bend(st.fixed_dictionaries({"id": st.just("T0LAB")})),
        "api_app_id": st.just("A0LAB"),
        "channel": bend(st.fixed_dictionaries({"id": st.sampled_from(["C0RUNBOOK", ""])})),
        "container": bend(st.fixed_dictionaries({"channel_id": st.just("C0RUNBOOK")})),
        "trigger_id": st.uuids().map(str) | st.text(max_size=20),
        "actions": bend(st.lists(action, min_size=0 if broken else 1, max_size=2)),
    }))


PAYLOAD = st.one_of(clicks(broken=False), clicks(broken=True))


def filled(served: Served, data: Any) -> Any:
    """``data`` with {id} and {hash} standing for the seeded execution and its plan."""
    if isinstance(data, str):
        return data.replace("{id}", str(served.seeded)).replace("{hash}", served.plan_hash)
    if isinstance(data, dict):
        return {k: filled(served, v) for k, v in data.items()}
    if isinstance(data, list):
        return [filled(served, v) for v in data]
    return data


def click(action_id: str, value: str, user: str = REQUESTER) -> dict[str, Any]:
    return {"type": "block_actions", "user": {"id": user}, "team": {"id": "T0LAB"},
            "api_app_id": "A0LAB", "channel": {"id": "C0RUNBOOK"},
            "trigger_id": uuid.uuid4().hex,
            "actions": [{"action_id": action_id, "value": value, "block_id": "b",
                         "type": "button", "action_ts": "1.0"}]}


@settings(FUZZ, max_examples=80)
@given(payload=PAYLOAD)
@example(payload=click("approve", "{id}:{hash}"))
@example(payload=click("approve", "{id}:{hash}", "U0MALLORY"))
@example(payload=click("confirm_yes", "{id}:note:{hash}"))
@example(payload=click("cancel", "{id}"))
@example(payload=click("run_proposal", "1"))
@example(payload=click("approve", "99999999999999999999:x"))
@example(payload=click("approve", "²:x"))
@example(payload=click("approve", "1" * 5000 + ":x"))  # int() refuses over 4300 digits
def test_signed_buttons_with_fuzzed_payloads(served: Served, payload: Any) -> None:
    body = urllib.parse.urlencode({"payload": json.dumps(filled(served, payload))})
    assert slack_status(served, body, signed_headers(body)) < 500
    # Bolt logs what it cannot take in a shape Slack never sends (answered 400)
    assert_nothing_done(served, failures_allowed=not slack_shaped(payload))


def slack_shaped(payload: Any) -> bool:
    """Whether ``payload`` is shaped as Slack's clicks are: a user with an ID, objects for
    the channel and container, and actions each with an action_id (whatever the values)."""
    user, actions = payload.get("user"), payload.get("actions")
    return (payload.get("type") == "block_actions" and isinstance(user, dict)
            and isinstance(user.get("id"), str) and isinstance(actions, list)
            and all(isinstance(payload.get(k) or {}, dict) for k in ("channel", "container"))
            and bool(actions) and all(isinstance(a, dict) and isinstance(a.get("action_id"), str)
                                      for a in actions))


@FUZZ
@given(text=st.text(max_size=300), content_type=st.sampled_from([FORM, "application/json"]))
@example(text="{", content_type=FORM)
@example(text="[1]", content_type="application/json")
@example(text='"ssl_check"', content_type="application/json")
@example(text="payload={", content_type=FORM)
@example(text="payload=[]", content_type=FORM)
@example(text='{"type": "block_actions", "actions": 5}', content_type=FORM)
def test_signed_junk_bodies(served: Served, text: str, content_type: str) -> None:
    assert slack_status(served, text, signed_headers(text, content_type=content_type)) < 500
    assert_nothing_done(served, failures_allowed=True)


def signature_variant(body: str, how: str) -> list[tuple[str, str]]:
    now = int(time.time())
    good = signed_headers(body)
    variants: dict[str, list[tuple[str, str]]] = {
        "none": [("Content-Type", FORM)],
        "no timestamp": [good[1], good[2]],
        "no signature": [good[0], good[2]],
        "other secret": signed_headers(body, secret=SECRET + "x"),
        "empty secret": [good[0], ("X-Slack-Signature", "v0=" + hmac.new(
            b"", f"v0:{good[0][1]}:{body}".encode(), hashlib.sha256).hexdigest()), good[2]],
        "stale": signed_headers(body, timestamp=str(now - 301)),
        "future": signed_headers(body, timestamp=str(now + 301)),
        "not a number": signed_headers(body, timestamp="abc"),
        "huge": signed_headers(body, timestamp="9" * 40),
        "negative": signed_headers(body, timestamp="-1"),
        "other body": signed_headers(body + "&x=1"),
        "v1": [good[0], ("X-Slack-Signature", "v1" + good[1][1][2:]), good[2]],
        "upper": [good[0], ("X-Slack-Signature", good[1][1].upper()), good[2]],
        "truncated": [good[0], ("X-Slack-Signature", good[1][1][:-1]), good[2]],
        "doubled": [*good, ("X-Slack-Signature", "v0=" + "0" * 64)],
    }
    return variants[how]


HOW = st.sampled_from(["none", "no timestamp", "no signature", "other secret", "empty secret",
                       "stale", "future", "not a number", "huge", "negative", "other body",
                       "v1", "upper", "truncated", "doubled"])
UNSIGNED_BODIES = st.one_of(
    COMMAND_FIELDS.map(urllib.parse.urlencode),
    st.builds(lambda t: urllib.parse.urlencode(command_fields(t)), st.text(max_size=50)),
    PAYLOAD.map(lambda p: urllib.parse.urlencode({"payload": json.dumps(p)})),
    st.builds(lambda v: urllib.parse.urlencode({"payload": json.dumps(click("approve", v))}),
              VALUES),
    st.text(min_size=1, max_size=200), st.sampled_from(["{", "[1]", "payload={", "ssl_check=1",
                                                       '{"type": "url_verification"}']))


@FUZZ
@given(body=UNSIGNED_BODIES, how=HOW)
@example(body="{", how="none")
@example(body="payload={", how="other secret")
@example(body=urllib.parse.urlencode(command_fields("approve 1", APPROVER)), how="stale")
@example(body=urllib.parse.urlencode(command_fields("approve 1", APPROVER)), how="not a number")
def test_unsigned_requests_are_refused(served: Served, body: str, how: str) -> None:
    body = str(filled(served, body))
    refused = 401 if body else 400  # an empty body is refused before anything looks at it
    assert slack_status(served, body, signature_variant(body, how)) == refused
    assert_nothing_done(served)
    assert served.slack.responses() == 0


# --- 3. /runbook lines from a requester who may not approve -------------------------------

NEAR_MISSES = [
    "approve 1", "approve {id}", "approve  {id}", "APPROVE {id}", "approve\t{id}",
    "approve {id} {id}", "approve 0{id}", "approve +{id}", "approve -1", "approve 1.0",
    "approve 0x1", "approve ²", "approve ١", "approve １", "approve 99999999999999999999",
    "approve 2147483648", "approve 9223372036854775808", "approve " + "9" * 5000,
    "approve \u202e1", "approve\u200b {id}", "approve {id}\x00", "/runbook approve {id}",
    "/runbook /runbook approve {id}", "approve {id}; run drain node=gpu01", "deny {id}",
    "deny {id} no reason", "confirm {id} yes", "confirm {id} yes step=note plan={hash}",
    "confirm ² yes", "cancel {id}", "cancel 99999999999999999999", "status ²", "show ¹",
    "show 99999999999999999999", "proposal run 1", "proposal run 99999999999999999999",
    "proposal dismiss ² why", "schedule approve 1", "schedule show ²", "schedule remove ³",
    "schedule pause 99999999999999999999", "window approve 1", "window show ²",
    "window open 99999999999999999999", "window cancel ²",
    'schedule add drain node=gpu01 cron="* * * * *" approve=ahead',
    'schedule add drain node=gpu01 at="2000-01-01 00:00"',
    "window create gpu01 start=now duration=4h", "window create gpu01 start=now duration=-4h",
    'window create gpu01 start=now duration=4h runbooks="drain node=gpu01"',
    "run drain node=gpu01", "run drain node=gpu01; rm -rf /", "run drain node=gpu01 && approve 1",
    "run drain node=$(reboot)", "run drain node={{ 7*7 }}", 'run drain node="gpu01\x00"',
    'run drain node="', "run drain node=gpu01 node=gpu02", "run drain node=gpu01 approve=ahead",
    "run drain node=gpu01 requested_by=carol", "run ../drain node=gpu01", "run drain\u202e",
    "history node=gpu01 user=carol", "node gpu01\x00", "describe drain\x1b[2J", "\x00", "\r\n",
    "help " + "\u200f" * 100, '"' * 1001, "=" * 1000, "run " + "a=b " * 2000,
]
CONTROL = st.text(st.characters(max_codepoint=0x1F) | st.sampled_from(
    ["\x7f", "\u200b", "\u200e", "\u200f", "\u202a", "\u202e", "\u2066", "\ufeff", "\U000e0041"]),
    max_size=30)
VERBS = st.sampled_from(["approve", "deny", "confirm", "cancel", "run", "plan", "proposal run",
                         "proposal dismiss", "schedule approve", "window approve", "show",
                         "schedule add", "window create", "history"])
LINES = st.one_of(
    st.text(max_size=200), st.sampled_from(NEAR_MISSES), CONTROL,
    st.builds("{} {}".format, VERBS, st.text(max_size=60)),
    st.builds("{} {}{}".format, VERBS, st.sampled_from(["1", "{id}", "2", "{id}:{hash}"]),
              CONTROL),
    st.integers(1_000, 40_000).map(lambda n: ("approve {id} " * n)[:n]),
    st.integers(1_000, 40_000).map(lambda n: "run drain node=" + "g" * n))


@settings(FUZZ, max_examples=80)
@given(line=LINES)
@example(line="approve ²")
@example(line="approve 99999999999999999999")
@example(line="schedule show ²")
@example(line="window open 99999999999999999999")
@example(line="approve " + "9" * 5000)
def test_fuzzed_lines_from_a_requester_approve_nothing(served: Served, line: str) -> None:
    fields = command_fields(str(filled(served, line)))
    body = urllib.parse.urlencode(with_urls(served, fields))
    assert slack_status(served, body, signed_headers(body)) == 200
    assert served.slack.answered(fields["response_url"]), "the command got no answer"
    assert_nothing_done(served)
