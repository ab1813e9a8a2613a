"""The quick Prometheus query (adapters/prometheus/quick.py) against a local HTTP server that
answers as told: for each answer (a vector, a refused query, a 401 from a proxy, 5xx then
retries, not JSON, no charset, a redirect) and for no answer (refused, too slow) it sends
requests' request (path, query, every header) and gives the requests-based backend's result
or error; a setting requests would act on gets requests."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from adapters.prometheus.backend import PrometheusApiBackend, PrometheusError
from adapters.prometheus.config import PrometheusConfig
from adapters.prometheus.quick import REQUESTS_HEADERS, QuickPrometheus, quick_enough

VECTOR = {"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "Hostname": "gpu01", "gpu": "0"},
     "value": [1700000000.5, "47"]},
    {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "gpu01", "gpu": "0"},
     "value": [1700000000.5, "+Inf"]}]}}
JSON = "application/json"


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str | None = JSON
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Server:
    url: str
    answers: list[Answer]  # in turn; the last one again and again
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    moved: Answer | None = None


@pytest.fixture
def server() -> Iterator[Server]:
    state = Server("", [])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.seen.append((self.path, dict(self.headers.items())))
            answer = state.answers.pop(0) if len(state.answers) > 1 else state.answers[0]
            if self.path.startswith("/moved/") and state.moved is not None:
                answer = state.moved  # where a redirect points
            time.sleep(answer.delay)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it gave up
                self._answer(answer)

        def _answer(self, answer: Answer) -> None:
            self.send_response(answer.status)
            if answer.content_type:
                self.send_header("Content-Type", answer.content_type)
            for key, value in answer.headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    yield state
    httpd.shutdown()
    httpd.server_close()


def outcome(backend: Any, promql: str) -> Any:
    """The samples, or the error: its class, its text (times masked), what it carries."""
    try:
        return backend.query(promql, 1700000000.25)
    except PrometheusError as exc:
        text = re.sub(r"in [0-9.]+s\)", "in Ns)", str(exc))
        return type(exc), text, {k: v for k, v in vars(exc).items() if k != "args"}


def both(server: Server, answers: list[Answer], **settings: Any) -> tuple[Any, Any]:
    """The quick backend's and the requests one's outcome, and the same requests sent."""
    config = PrometheusConfig(url=server.url + "/prom", retry_backoff=0, **settings)
    quick = QuickPrometheus(config)
    assert quick.quick is not None
    server.answers[:], server.seen[:] = list(answers), []
    got = outcome(quick, 'up{job="x"}')
    quick_seen, server.seen[:] = list(server.seen), []
    server.answers[:] = list(answers)
    want = outcome(PrometheusApiBackend(config), 'up{job="x"}')
    assert got == want
    assert quick_seen[-len(server.seen):] == server.seen  # path, query, every header
    return got, quick_seen


def test_a_vector_and_the_configured_headers(server: Server) -> None:
    got, seen = both(server, [Answer(200, json.dumps(VECTOR).encode())],
                     headers={"Authorization": "Bearer t", "accept": "application/json"})
    assert got[0].value == 47 and len(seen) == 1
    path, headers = seen[0]
    assert path.startswith("/prom/api/v1/query?query=up%7Bjob%3D%22x%22%7D&time=")
    assert headers["Authorization"] == "Bearer t" and headers["accept"] == "application/json"


@pytest.mark.parametrize("answer", [
    Answer(400, b'{"status":"error","errorType":"bad_data","error":"parse error"}'),
    Answer(401, b"Unauthorized\n", "text/plain; charset=utf-8"),
    Answer(404, b"<html>not here</html>", "text/html"),
    Answer(200, b"<html>a login page</html>", "text/html; charset=ISO-8859-1"),
    Answer(200, b'{"status":"success"}'),
], ids=["bad-query", "401", "404", "not-json", "no-data"])
def test_a_refusal_or_a_strange_answer_is_the_same_error(server: Server,
                                                         answer: Answer) -> None:
    got, seen = both(server, [answer], retries=2)
    assert isinstance(got, tuple) and len(seen) == 1  # never retried


def test_5xx_is_retried_alike_then_answered_or_given_up(server: Server) -> None:
    failing = Answer(503, b'{"status":"error","error":"overloaded"}')
    got, seen = both(server, [failing, Answer(200, json.dumps(VECTOR).encode())], retries=2)
    assert len(got) == 2 and len(seen) == 2
    got, seen = both(server, [failing], retries=1)
    assert "2 attempts" in got[1] and "overloaded" in got[1] and len(seen) == 2


def test_no_declared_charset_or_a_redirect_go_through_requests(server: Server) -> None:
    vector = json.dumps(VECTOR).encode()
    got, seen = both(server, [Answer(200, vector, None)])
    assert len(got) == 2 and len(seen) == 2  # the quick ask, then requests'
    server.moved = Answer(200, vector)
    got, seen = both(server, [Answer(302, b"", None, {"Location": "/moved/api/v1/query"})])
    assert len(got) == 2 and [path[:7] for path, _ in seen] == ["/prom/a", "/prom/a", "/moved/"]


def test_no_answer_is_the_same_error(server: Server) -> None:
    slow = Answer(200, json.dumps(VECTOR).encode(), delay=1.0)
    got, _ = both(server, [slow], timeout=0.3, retries=0)
    assert "no answer within 0.3s" in got[1]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = PrometheusConfig(url=f"http://127.0.0.1:{port}", retries=1, retry_backoff=0)
    assert outcome(QuickPrometheus(config), "up") == outcome(PrometheusApiBackend(config), "up")
    assert "connection refused" in outcome(QuickPrometheus(config), "up")[1]


def test_what_requests_would_act_on_gets_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    assert quick_enough(PrometheusConfig(url="http://prometheus:9090/prefix"))
    for url in ("https://prometheus:9090", "http://user:pw@prometheus:9090",
                "http://prometheus:9090/?x=1", "http://Prometheus:9090"):
        assert not quick_enough(PrometheusConfig(url=url)), url
    for variable in ("HTTP_PROXY", "all_proxy", "NETRC"):
        with monkeypatch.context() as env:
            env.setenv(variable, "x")
            assert QuickPrometheus(PrometheusConfig(url="http://p:9090")).quick is None
    assert QuickPrometheus(PrometheusConfig(url="https://p:9090")).quick is None


def test_the_headers_are_requests_defaults() -> None:
    import requests.utils

    assert dict(requests.utils.default_headers()) == REQUESTS_HEADERS
