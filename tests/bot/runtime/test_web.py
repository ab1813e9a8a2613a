"""The HTTP application of `runbook serve` (bot.runtime.web) under the real server: JSON 404
and 405 naming the routes, /healthz and HEAD, the body checks (413 before the body is sent,
400 for chunked, 408 for half a body: each closes the connection), at most max_requests in
flight (503 + Retry-After, /healthz exempt), and what each request leaves: the duration
histogram by route ("other" for unknown paths) and one access line with no secret in it."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.runtime.httpserver import HttpServer
from bot.runtime.serving import application, http_settings
from bot.runtime.web import AtOnce, Response, Route, json_response
from tests.conftest import BotFactory

TOKEN = "test-alerts-token-0123456789abcdef"
TIMEOUT = 5.0  # a client's patience: an answer later than this is no answer


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # names lower case
    body: bytes

    def json(self) -> Any:
        assert self.headers.get("content-type") == "application/json", self.headers
        return json.loads(self.body)


@dataclass
class Gate:
    """A POST route that says when it is entered, then answers 200 once ``opened``."""

    entered: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    opened: threading.Event = field(default_factory=threading.Event)
    calls: int = 0

    def route(self, headers: Mapping[str, str], body: bytes) -> Response:
        self.calls += 1
        self.entered.release()
        self.opened.wait(TIMEOUT * 2)
        return json_response(200, {"bytes": len(body)})

    def wait_entered(self, count: int = 1) -> None:
        for _ in range(count):
            assert self.entered.acquire(timeout=TIMEOUT), "the route was never entered"


class Servers:
    """Servers started for one test; at its end every gate is opened, every server stopped."""

    def __init__(self, make_bot: BotFactory) -> None:
        self.make_bot = make_bot
        self.gates: list[Gate] = []
        self.started: list[HttpServer] = []

    def gate(self) -> Gate:
        self.gates.append(Gate())
        return self.gates[-1]

    def start(self, routes: Mapping[str, Route] | None = None,
              mounts: Mapping[str, Any] | None = None, **server: Any) -> HttpServer:
        """A server of ``application(bot, routes, mounts=mounts)`` set up as ``runbook
        serve`` sets it up from its configuration (``server``: ServerConfig fields; a 1 s
        grace by default)."""
        bot = self.make_bot({}, server={"shutdown_grace_seconds": 1, **server})
        started = HttpServer(application(bot, routes, alerts_token=TOKEN, mounts=mounts),
                             "127.0.0.1", 0, http_settings(bot.config.server))
        started.start()
        self.started.append(started)
        return started

    def close(self) -> None:
        for gate in self.gates:
            gate.opened.set()
        for started in self.started:
            started.stop()


@pytest.fixture
def servers(make_bot: BotFactory) -> Iterator[Servers]:
    with closing(Servers(make_bot)) as made:
        yield made


def call(port: int, method: str, path: str, body: bytes | None = None,
         headers: Mapping[str, str] | None = None, tls: ssl.SSLContext | None = None
         ) -> Answer:
    """One request on a connection of its own (over TLS with ``tls``)."""
    connection = (http.client.HTTPSConnection("127.0.0.1", port, timeout=TIMEOUT, context=tls)
                  if tls else http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT))
    try:
        connection.request(method, path, body=body, headers=dict(headers or {}))
        with connection.getresponse() as response:
            return Answer(response.status, {k.lower(): v for k, v in response.getheaders()},
                          response.read())
    finally:
        connection.close()


@contextmanager
def raw(port: int) -> Iterator[socket.socket]:
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        yield sock


def until_closed(sock: socket.socket) -> bytes:
    """All the server writes until it closes the connection (TimeoutError if it does not)."""
    chunks = []
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def parse(data: bytes) -> Answer:
    """One answer, read raw: status line, headers, body."""
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip()
               for name, _, value in (line.partition(":") for line in lines)}
    return Answer(int(status_line.split()[1]), headers, body)


def read_answer(sock: socket.socket) -> Answer:
    """The next answer on a connection that stays open."""
    with http.client.HTTPResponse(sock) as response:
        response.begin()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()},
                      response.read())


def eventually(check: Callable[[], bool], within: float = 2.0) -> bool:
    """Whether ``check`` comes true within ``within`` seconds (the server records a request
    just after the client has its answer)."""
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# --- routes ------------------------------------------------------------------------------


def test_an_unknown_path_is_a_json_404_that_names_the_routes(servers: Servers) -> None:
    port = servers.start({"/echo": servers.gate().route}).port
    for method in ("GET", "POST"):
        answer = call(port, method, "/nope", b"{}" if method == "POST" else None)
        assert answer.status == 404
        error = answer.json()["error"]
        assert "/nope" in error
        assert all(route in error for route in ("/healthz", "/metrics", "/alerts", "/echo"))


def test_a_wrong_method_is_a_json_405_that_names_the_routes(servers: Servers) -> None:
    port = servers.start({"/echo": servers.gate().route}).port
    answer = call(port, "GET", "/alerts")
    assert answer.status == 405
    assert answer.headers["allow"] == "POST"
    assert "GET" in answer.json()["error"] and "POST /alerts, /echo" in answer.json()["error"]
    answer = call(port, "POST", "/healthz", b"{}")
    assert answer.status == 405
    assert "GET" in answer.headers["allow"] and "POST" not in answer.headers["allow"]
    assert "GET /livez, /healthz, /metrics" in answer.json()["error"]


def test_healthz_says_ok_and_head_answers_without_a_body(servers: Servers) -> None:
    port = servers.start().port
    answer = call(port, "GET", "/healthz")
    assert (answer.status, answer.json()) == (200, {"status": "ok"})
    head = call(port, "HEAD", "/healthz")
    assert (head.status, head.body) == (200, b"")
    assert head.headers["content-length"] == str(len(answer.body))
    assert call(port, "HEAD", "/metrics").status == 200


# --- bodies ------------------------------------------------------------------------------


def test_a_body_over_1_mib_is_refused_413_before_it_is_sent_and_the_connection_closed(
        servers: Servers) -> None:
    gate = servers.gate()
    port = servers.start({"/echo": gate.route}).port
    with raw(port) as sock:  # asks for 100-continue: the server must not invite the body
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1048577\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        data = until_closed(sock)
    answer = parse(data)
    assert data.startswith(b"HTTP/1.1 413 ")  # no 100 Continue first
    assert answer.headers["connection"] == "close"
    assert "1048576" in answer.json()["error"]
    assert gate.calls == 0


def test_exactly_1_mib_is_taken(servers: Servers) -> None:
    gate = servers.gate()
    gate.opened.set()
    port = servers.start({"/echo": gate.route}).port
    answer = call(port, "POST", "/echo", b"x" * 1048576)
    assert (answer.status, answer.json()) == (200, {"bytes": 1048576})


def test_a_chunked_body_without_content_length_is_refused_400_and_the_connection_closed(
        servers: Servers) -> None:
    gate = servers.gate()
    port = servers.start({"/echo": gate.route}).port
    with raw(port) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"2\r\n{}\r\n0\r\n\r\n")
        answer = parse(until_closed(sock))
    assert answer.status == 400
    assert answer.headers["connection"] == "close"
    assert "Content-Length" in answer.json()["error"]
    assert gate.calls == 0


def test_a_body_that_stops_half_way_gets_408_within_the_read_timeout_and_is_closed(
        servers: Servers) -> None:
    gate = servers.gate()
    port = servers.start({"/echo": gate.route}, read_timeout_seconds=0.5).port
    with raw(port) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n{\"a\"")
        sent = time.monotonic()
        answer = parse(until_closed(sock))
        took = time.monotonic() - sent
    assert answer.status == 408
    assert answer.headers["connection"] == "close"
    assert "0.5s" in answer.json()["error"]
    assert took >= 0.4  # not before the read timeout (no upper bound: a loaded machine is late)
    assert gate.calls == 0


def test_what_h11_cannot_parse_gets_a_json_400_and_the_connection_closed(
        servers: Servers) -> None:
    port = servers.start().port
    for request in (b"GET /healthz HTTP/1.1\r\nHost: t\r\nno colon here\r\n\r\n",
                    b"POST /alerts HTTP/1.1\r\nHost: t\r\nContent-Length: 1x\r\n\r\n{}",
                    b"NOT HTTP AT ALL\r\n\r\n"):
        with raw(port) as sock:
            sock.sendall(request)
            answer = parse(until_closed(sock))
        assert answer.status == 400, request
        assert answer.headers["connection"] == "close"
        assert "not a valid HTTP/1.1 request" in answer.json()["error"]


# --- requests in flight ------------------------------------------------------------------


def post_raw(sock: socket.socket, path: str, body: bytes = b"{}") -> None:
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
                 .encode() + body)


def test_beyond_max_requests_a_post_gets_503_with_retry_after_but_healthz_answers(
        servers: Servers) -> None:
    gate = servers.gate()
    port = servers.start({"/slow": gate.route}, max_requests_in_flight=2).port
    with raw(port) as first, raw(port) as second:
        post_raw(first, "/slow")
        post_raw(second, "/slow")
        gate.wait_entered(2)
        refused = call(port, "POST", "/slow", b"{}")
        assert refused.status == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.headers["connection"] == "close"
        assert "2 requests" in refused.json()["error"]
        assert call(port, "POST", "/alerts", b"{}").status == 503  # every route, not one
        assert call(port, "GET", "/healthz").status == 200
        assert gate.calls == 2
        gate.opened.set()
        assert read_answer(first).status == 200
        assert read_answer(second).status == 200
    assert call(port, "POST", "/slow", b"{}").status == 200
    assert gate.calls == 3


def test_an_at_once_route_answers_on_the_event_loop_while_every_worker_thread_is_busy(
        servers: Servers) -> None:
    """Slack's acknowledgement (bot.surfaces.slack.surface) comes this way under a burst."""
    gate = servers.gate()
    threads = 40  # the worker threads routes run in (anyio's default limiter)

    def first(headers: Mapping[str, str], body: bytes) -> Response | None:
        return json_response(200, {"at": "once"}) if body == b"quick" else None

    port = servers.start({"/slow": gate.route, "/both": AtOnce(first, gate.route)}).port
    with ExitStack() as stack:
        held = [stack.enter_context(raw(port)) for _ in range(threads)]
        for sock in held:
            post_raw(sock, "/slow")
        gate.wait_entered(threads)
        answer = call(port, "POST", "/both", b"quick")
        assert (answer.status, answer.json()) == (200, {"at": "once"})
        assert gate.calls == threads
        gate.opened.set()
        assert all(read_answer(sock).status == 200 for sock in held)
    assert call(port, "POST", "/both", b"other").json() == {"bytes": 5}  # in a worker thread
    assert gate.calls == threads + 1


def mounted(gate: Gate) -> Any:
    """A mounted application (like the console at /ui) whose answers wait on ``gate``."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import Response as Answered
    from starlette.routing import Route as Path

    async def page(request: Request) -> Answered:
        answer = await run_in_threadpool(gate.route, {}, b"")
        return Answered(answer.body, answer.status, media_type="application/json")

    return Starlette(routes=[Path("/page", page)])


def test_a_mounted_application_takes_places_like_the_routes_and_is_timed_under_its_prefix(
        servers: Servers) -> None:
    gate = servers.gate()
    port = servers.start(mounts={"/ui": mounted(gate)}, max_requests_in_flight=1).port
    with raw(port) as held:
        held.sendall(b"GET /ui/page HTTP/1.1\r\nHost: x\r\n\r\n")
        gate.wait_entered()
        assert call(port, "POST", "/alerts", b"{}").status == 503  # the page holds the place
        assert call(port, "GET", "/ui/page").status == 503
        assert call(port, "GET", "/healthz").status == 200
        gate.opened.set()
        assert read_answer(held).status == 200
    assert call(port, "GET", "/ui/nothing-here").status == 404
    assert eventually(lambda: ("GET", "/ui", "404") in durations(port))
    counts = durations(port)
    assert counts[("GET", "/ui", "200")] == 1.0 and counts[("GET", "/ui", "503")] == 1.0
    assert not [key for key in counts if key[1].startswith("/ui/")]


def test_clients_sending_bodies_slowly_never_take_the_places_of_answers(
        servers: Servers) -> None:
    """With max_requests 2, eight bodies may be read at once. Six clients stall after one
    byte of their bodies: POSTs whose bodies arrive are still answered. Two more: full."""
    port = servers.start(max_requests_in_flight=2).port
    head = b"POST /alerts HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"
    with ExitStack() as stack:
        stalled = [stack.enter_context(raw(port)) for _ in range(8)]
        for sock in stalled:
            sock.sendall(head)
        # all eight are being read when a ninth body is refused: the event, not a sleep
        assert eventually(lambda: call(port, "POST", "/alerts", b"{}").status == 503)
        refused = call(port, "POST", "/alerts", b"{}")
        assert "8 request bodies are being read" in refused.json()["error"], refused
        assert call(port, "GET", "/healthz").status == 200
        for sock in stalled[6:]:
            sock.close()  # two give up; the other six are still being read
        assert eventually(lambda: call(port, "POST", "/alerts", b"{}").status == 401)
        assert [call(port, "POST", "/alerts", b"{}").status for _ in range(3)] == [401] * 3
    assert eventually(lambda: call(port, "POST", "/alerts", b"{}").status == 401)


def test_a_route_that_raises_gets_500_and_frees_its_place(servers: Servers) -> None:
    def broken(headers: Mapping[str, str], body: bytes) -> Response:
        raise RuntimeError("boom")

    port = servers.start({"/broken": broken}, max_requests_in_flight=1).port
    for _ in range(2):  # the first one's place was given back
        answer = call(port, "POST", "/broken", b"{}")
        assert answer.status == 500 and "boom" not in answer.json()["error"]
    assert call(port, "GET", "/healthz").status == 200


@pytest.mark.parametrize("pieces", [1, 40])
def test_headers_over_16_kib_are_refused_431_however_they_arrive(servers: Servers,
                                                                  pieces: int) -> None:
    port = servers.start().port
    request = (b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
               + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 1000) for i in range(20))
               + b"\r\n")
    with raw(port) as sock:
        step = -(-len(request) // pieces)
        try:
            for start in range(0, len(request), step):
                sock.sendall(request[start:start + step])
        except (ConnectionResetError, BrokenPipeError):  # refused before all was sent
            assert pieces > 1
        data = until_closed(sock)
    if not data:  # h11 refused and closed while the rest was still arriving: reset
        assert pieces > 1
    else:  # at once: the application refuses them (431); in pieces, h11 may first (400)
        answer = parse(data)
        assert answer.status in ((431,) if pieces == 1 else (400, 431)), answer
        assert any(word in answer.json()["error"] for word in ("headers", "HTTP/1.1"))
    headers = {f"X-Pad-{i}": "p" * 700 for i in range(20)}  # 14 KiB: taken
    assert call(port, "GET", "/healthz", headers=headers).status == 200


# --- what each request leaves behind ------------------------------------------------------


def durations(port: int) -> dict[tuple[str, str, str], float]:
    """runbook_http_request_duration_seconds_count by (method, route, code)."""
    text = call(port, "GET", "/metrics").body.decode()
    return {(s.labels["method"], s.labels["route"], s.labels["code"]): s.value
            for family in text_string_to_metric_families(text)
            if family.name == "runbook_http_request_duration_seconds"
            for s in family.samples if s.name.endswith("_count")}


def test_the_duration_histogram_is_by_route_and_unknown_paths_are_other(
        servers: Servers) -> None:
    port = servers.start().port
    call(port, "GET", "/healthz")
    call(port, "GET", "/nope/a")
    call(port, "GET", "/nope/b?x=1")
    call(port, "POST", "/alerts", b"{}")
    call(port, "BREW", "/healthz")
    assert eventually(lambda: ("other", "/healthz", "405") in durations(port))
    counts = durations(port)  # a method no route knows is "other" too
    assert counts[("GET", "/healthz", "200")] == 1.0
    assert counts[("GET", "other", "404")] == 2.0  # one label for every unknown path
    assert counts[("POST", "/alerts", "401")] == 1.0  # no token
    assert not [key for key in counts if "/nope" in key[1]]


def test_the_access_log_has_route_and_status_but_no_token_query_or_body(
        servers: Servers, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    port = servers.start().port
    secrets = [TOKEN, "SECRET123", "BODYSECRET", "/nope"]
    answer = call(port, "POST", "/alerts?token=SECRET123", b'{"BODYSECRET": 1}',
                  {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    assert answer.status == 400
    assert call(port, "GET", "/nope?token=SECRET123").status == 404

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "bot.access"]

    assert eventually(lambda: len(lines()) == 2), lines()
    posted, unknown = lines()
    assert posted.startswith("127.0.0.1 POST /alerts 400 ") and posted.endswith("ms")
    assert unknown.startswith("127.0.0.1 GET other 404 ")
    everything = "\n".join(r.getMessage() for r in caplog.records)  # any logger at all
    assert [secret for secret in secrets if secret in everything] == []
