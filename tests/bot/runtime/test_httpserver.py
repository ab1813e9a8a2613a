"""uvicorn as `runbook serve` runs it (bot.runtime.httpserver, serving.serve): a connection
whose headers do not all arrive within header_timeout is closed (a slowloris, an idle one),
a slow route or body is not cut; stop() and serve() let the request in flight finish, refuse
new connections and give the leadership up; HTTPS with the configured certificate; a
certificate that cannot be used or a port in use is a ListenError that says which."""

from __future__ import annotations

import importlib
import logging
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pydantic
import pytest

from bot.config import ServerConfig
from bot.execution.engine import silent
from bot.runtime import access, serving
from bot.runtime.httpserver import HttpServer, ListenError, Settings
from bot.runtime.serving import application
from bot.runtime.tasks import Task
from bot.runtime.web import Response, json_response
from tests.bot.runtime.test_web import (
    TOKEN,
    Gate,
    Servers,
    call,
    eventually,
    post_raw,
    raw,
    read_answer,
    until_closed,
)
from tests.conftest import BotFactory

HEADER_TIMEOUT = 0.6
GET = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"


@pytest.fixture
def servers(make_bot: BotFactory) -> Iterator[Servers]:
    with closing(Servers(make_bot)) as made:
        yield made


def refused(port: int) -> bool:
    """Whether a new connection to ``port`` is refused (one that is taken is closed)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


def answers(port: int) -> bool:
    try:
        return call(port, "GET", "/healthz").status == 200
    except ConnectionRefusedError:
        return False


# --- the header deadline -----------------------------------------------------------------


def dribble(sock: socket.socket, every: float = 0.2, within: float = 5.0) -> float:
    """A request line, then one header byte every ``every`` seconds until the server closes
    the connection: the seconds that took. The server must write nothing."""
    opened = time.monotonic()
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: ")
    sock.settimeout(every)
    while time.monotonic() - opened < within:
        try:
            assert sock.recv(1024) == b"", "the server answered headers it never had"
            return time.monotonic() - opened
        except TimeoutError:
            pass
        except ConnectionResetError:
            return time.monotonic() - opened
        try:
            sock.send(b"a")
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - opened
    raise AssertionError(f"the connection was still open after {within:g}s")


def test_a_client_dribbling_its_headers_is_cut_after_the_header_timeout_others_answered(
        servers: Servers) -> None:
    port = servers.start(header_timeout_seconds=HEADER_TIMEOUT).port
    with raw(port) as sock, ThreadPoolExecutor(1) as pool:
        cut = pool.submit(dribble, sock)
        time.sleep(HEADER_TIMEOUT / 2)
        assert not cut.done()
        answer = call(port, "GET", "/healthz")  # another connection meanwhile
        assert (answer.status, answer.json()) == (200, {"status": "ok"})
        took = cut.result(timeout=10)
    assert HEADER_TIMEOUT * 0.9 <= took < HEADER_TIMEOUT + 1.0


@pytest.mark.parametrize("answered_first", [False, True], ids=["fresh", "after-an-answer"])
def test_an_idle_connection_is_closed_after_the_header_timeout(
        servers: Servers, answered_first: bool) -> None:
    port = servers.start(header_timeout_seconds=HEADER_TIMEOUT, keepalive_seconds=5).port
    with raw(port) as sock:
        if answered_first:  # late: a deadline counted from the connect would cut it early
            time.sleep(HEADER_TIMEOUT * 0.6)
            sock.sendall(GET)
            assert read_answer(sock).status == 200
        idle = time.monotonic()
        assert until_closed(sock) == b""
        took = time.monotonic() - idle
    assert HEADER_TIMEOUT * 0.8 <= took < HEADER_TIMEOUT + 1.0  # not keepalive's 5 s


def test_a_route_slower_than_the_header_timeout_is_not_cut(servers: Servers) -> None:
    def slow(headers: Mapping[str, str], body: bytes) -> Response:
        time.sleep(HEADER_TIMEOUT * 1.5)
        return json_response(200, {"slept": True})

    port = servers.start({"/slow": slow}, header_timeout_seconds=HEADER_TIMEOUT).port
    with raw(port) as sock:
        post_raw(sock, "/slow")
        answer = read_answer(sock)
        assert (answer.status, answer.json()) == (200, {"slept": True})
        sock.sendall(GET)  # and the connection is still there for the next request
        assert read_answer(sock).status == 200


def test_a_body_slower_than_the_header_timeout_but_within_the_read_timeout_is_taken(
        servers: Servers) -> None:
    gate = servers.gate()
    gate.opened.set()
    port = servers.start({"/echo": gate.route}, header_timeout_seconds=0.5,
                         read_timeout_seconds=5).port
    with raw(port) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{")
        time.sleep(0.8)
        sock.sendall(b"}")
        answer = read_answer(sock)
    assert (answer.status, answer.json()) == (200, {"bytes": 2})


def test_garbage_after_an_answer_closes_the_connection_without_an_error_logged(
        servers: Servers, caplog: pytest.LogCaptureFixture) -> None:
    port = servers.start().port
    with raw(port) as sock:  # a GET's chunked body is not read; then a chunk h11 refuses
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        assert read_answer(sock).status == 200
        sock.sendall(b"zz\r\nnot a chunk\r\n")
        assert until_closed(sock) == b""
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


# --- stopping ----------------------------------------------------------------------------


def test_stop_lets_the_request_in_flight_finish_and_refuses_new_connections(
        servers: Servers) -> None:
    gate = servers.gate()
    server = servers.start({"/slow": gate.route}, shutdown_grace_seconds=2)
    with raw(server.port) as sock, ThreadPoolExecutor(1) as pool:
        post_raw(sock, "/slow")
        gate.wait_entered()
        stopping = pool.submit(server.stop)
        assert eventually(lambda: refused(server.port), within=3)
        assert not stopping.done()  # waiting for the request in flight: it answers below
        gate.opened.set()
        answer = read_answer(sock)
        assert until_closed(sock) == b""
        stopping.result(timeout=10)
    assert (answer.status, answer.json()) == (200, {"bytes": 2})
    assert refused(server.port)


def test_stop_does_not_wait_past_the_grace_for_a_stuck_route(servers: Servers) -> None:
    """Stop gives the stuck request its grace (2 s), then cuts it and returns: well before
    stop() would give up on the server thread itself (grace + 5 s)."""
    gate = servers.gate()  # opened only at the end of the test
    server = servers.start({"/stuck": gate.route}, shutdown_grace_seconds=2)
    with raw(server.port) as sock, ThreadPoolExecutor(1) as pool:
        post_raw(sock, "/stuck")
        gate.wait_entered()
        stopping = pool.submit(server.stop)
        assert eventually(lambda: refused(server.port), within=3)  # stopping has begun
        assert not stopping.done()  # the request in flight has its grace
        stopping.result(timeout=2 + 2.5)
        assert not until_closed(sock).startswith(b"HTTP/1.1 200")  # cut: it did not finish
    assert not gate.opened.is_set() and not server.thread.is_alive()


@dataclass
class FakeElector:
    """Always leads; records its rounds and whether the leadership was given up."""

    method: str = "fake"
    identity: str = "test-replica"
    problem: str | None = None
    campaigns: int = 0
    released: threading.Event = field(default_factory=threading.Event)

    def campaign(self) -> bool:
        self.campaigns += 1
        return True

    def holder(self) -> str | None:
        return self.identity

    def release(self) -> None:
        self.released.set()

    def describe(self) -> str:
        return "a test elector"


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return int(sock.getsockname()[1])


def test_serve_finishes_the_request_in_flight_and_gives_the_leadership_up_on_stop(
        make_bot: BotFactory) -> None:
    bot = make_bot({}, server={"shutdown_grace_seconds": 3})
    gate, elector, stop, port = Gate(), FakeElector(), threading.Event(), free_port()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            serving.serve(bot, "127.0.0.1", port, silent, stop, routes={"/slow": gate.route},
                          elector=elector, alerts=access.AlertsAccess((TOKEN,)))
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run, name="serve", daemon=True)
    thread.start()
    try:
        assert eventually(lambda: answers(port) and elector.campaigns > 0, within=5)
        with raw(port) as sock:
            post_raw(sock, "/slow")
            gate.wait_entered()
            stop.set()
            assert eventually(lambda: refused(port), within=3)
            assert thread.is_alive()  # serve waits for the request in flight: it answers below
            gate.opened.set()
            answer = read_answer(sock)
        thread.join(10)
    finally:
        stop.set()
        gate.opened.set()
        thread.join(10)
    assert (answer.status, failures, thread.is_alive()) == (200, [], False)
    assert elector.released.is_set()


def test_serve_stops_waiting_for_a_task_that_ignores_the_stop_and_names_it(
        make_bot: BotFactory, caplog: pytest.LogCaptureFixture) -> None:
    stuck, stop = threading.Event(), threading.Event()

    def ignores_the_stop(_stop: threading.Event) -> None:
        stuck.wait(30)

    task = Task("stuck-task", ignores_the_stop, leader_only=False)
    stop.set()  # at once: serve starts, then stops
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="bot.runtime.serving"):
        serving.serve(make_bot({}, server={"shutdown_grace_seconds": 1}), "127.0.0.1",
                      free_port(), silent, stop, tasks=[task], elector=FakeElector(),
                      alerts=access.AlertsAccess((TOKEN,)), stop_seconds=0.5)
    waited = time.monotonic() - started
    stuck.set()
    assert waited < 10, waited  # 0.5 s for the tasks in all, not 30 each
    assert "left to the exit: stuck-task" in caplog.text


def test_serve_on_a_port_in_use_fails_and_gives_the_leadership_up(
        make_bot: BotFactory) -> None:
    elector = FakeElector()
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = int(taken.getsockname()[1])
        with pytest.raises(ListenError, match=f"127.0.0.1:{port}"):
            serving.serve(make_bot({}), "127.0.0.1", port, silent, threading.Event(),
                          elector=elector, alerts=access.AlertsAccess((TOKEN,)))
    assert elector.released.is_set() and elector.campaigns == 0


def test_a_port_in_use_is_a_listen_error_naming_host_and_port(make_bot: BotFactory) -> None:
    app = application(make_bot({}), alerts_token=TOKEN)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = int(taken.getsockname()[1])
        with pytest.raises(ListenError) as raised:
            HttpServer(app, "127.0.0.1", port, Settings())
    assert str(raised.value).startswith(
        f"cannot listen on 127.0.0.1:{port}: Address already in use")


# --- TLS ---------------------------------------------------------------------------------


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key (PEM)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    openssl = shutil.which("openssl")
    if openssl:
        subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                        "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True, timeout=30)
    else:
        self_signed_with_cryptography(cert, key)
    return cert, key


def self_signed_with_cryptography(cert: Path, key: Path) -> None:
    try:
        x509: Any = importlib.import_module("cryptography.x509")
        hashes: Any = importlib.import_module("cryptography.hazmat.primitives.hashes")
        ec: Any = importlib.import_module("cryptography.hazmat.primitives.asymmetric.ec")
        pem: Any = importlib.import_module("cryptography.hazmat.primitives.serialization")
    except ImportError:
        pytest.skip("neither the openssl command nor the cryptography package is here")
    import ipaddress

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    built = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
             .public_key(private.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=2))
             .add_extension(x509.SubjectAlternativeName(
                 [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
             .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
             .sign(private, hashes.SHA256()))
    cert.write_bytes(built.public_bytes(pem.Encoding.PEM))
    key.write_bytes(private.private_bytes(pem.Encoding.PEM, pem.PrivateFormat.PKCS8,
                                          pem.NoEncryption()))


def test_https_answers_with_the_configured_certificate_and_plain_http_does_not(
        servers: Servers, tls_files: tuple[Path, Path]) -> None:
    cert, key = tls_files
    port = servers.start(tls_cert_file=str(cert), tls_key_file=str(key)).port
    answer = call(port, "GET", "/healthz", tls=ssl.create_default_context(cafile=str(cert)))
    assert (answer.status, answer.json()) == (200, {"status": "ok"})
    with pytest.raises(ssl.SSLCertVerificationError):  # the trust is real: not without it
        call(port, "GET", "/healthz", tls=ssl.create_default_context())
    with raw(port) as sock:
        sock.sendall(GET)
        assert b"HTTP/" not in until_closed(sock)


@pytest.mark.parametrize("broken", ["missing-cert", "garbage-cert", "garbage-key"])
def test_a_certificate_or_key_that_cannot_be_used_is_a_listen_error(
        make_bot: BotFactory, tls_files: tuple[Path, Path], broken: str) -> None:
    cert, key = tls_files
    if broken == "missing-cert":
        cert = cert.with_name("missing.pem")
    else:
        (cert if broken == "garbage-cert" else key).write_text("not PEM at all\n")
    app = application(make_bot({}), alerts_token=TOKEN)
    with pytest.raises(ListenError) as raised:
        HttpServer(app, "127.0.0.1", 0, Settings(tls_cert_file=cert, tls_key_file=key))
    message = str(raised.value)
    assert message.startswith(f"cannot use the TLS certificate {cert} and key {key}: ")
    if broken == "missing-cert":
        assert message.endswith("No such file or directory")


@pytest.mark.parametrize("only", ["tls_cert_file", "tls_key_file"])
def test_tls_needs_both_files_in_the_configuration(only: str, tmp_path: Path) -> None:
    with pytest.raises(pydantic.ValidationError, match="set both or neither"):
        ServerConfig.model_validate({only: str(tmp_path / "file.pem")})
