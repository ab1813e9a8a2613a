"""Slowloris against the real server: 200 clients dribbling request headers a byte at a time
hold no worker thread and do not keep GET /healthz or POST /alerts from answering; every one
of them is cut by the server once its header deadline (1 s here) has passed, not before.
Functional assertions only: answers within a generous client timeout, never a latency."""

from __future__ import annotations

import http.client
import json
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest

from bot.runtime.httpserver import HttpServer, Settings
from bot.runtime.serving import application
from tests.conftest import BotFactory

SLOW = 200
SENDERS = 8  # threads sending the fast requests
HEADER_TIMEOUT = 1.0
CLIENT_TIMEOUT = 5.0  # generous: an answer later than this counts as no answer
EMPTY_WEBHOOK = json.dumps({"version": "4", "status": "firing", "alerts": []}).encode()


@dataclass
class Slow:
    sock: socket.socket
    opened: float
    cut_after: float | None = None  # seconds from connect to the server closing it
    answered: bytes = b""  # anything the server wrote: it should write nothing


@dataclass
class Dribbler:
    """Slow clients in one thread: each sent a request line and one header, then sends one
    more header byte every ``every`` seconds until the server cuts it."""

    port: int
    every: float = 0.25
    clients: list[Slow] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    dribbled: threading.Event = field(default_factory=threading.Event)  # a round was sent
    thread: threading.Thread | None = None

    def start(self, count: int) -> None:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=CLIENT_TIMEOUT)
            self.clients.append(Slow(sock, time.monotonic()))
            sock.sendall(b"POST /alerts HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            sock.setblocking(False)
        self.thread = threading.Thread(target=self._run, name="dribbler", daemon=True)
        self.thread.start()

    def wait_all_cut(self, timeout: float) -> bool:
        """Whether the server cut every client within ``timeout`` seconds."""
        assert self.thread is not None
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(5)
        for client in self.clients:
            client.sock.close()

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for client in self.clients:
                selector.register(client.sock, selectors.EVENT_READ, client)
            next_byte = time.monotonic() + self.every
            while not self.stop.is_set() and selector.get_map():
                for key, _ in selector.select(timeout=0.05):
                    self._read(selector, key.data)
                if time.monotonic() >= next_byte:
                    next_byte += self.every
                    for key in list(selector.get_map().values()):
                        self._send(selector, key.data)
                    self.dribbled.set()

    def _read(self, selector: selectors.BaseSelector, client: Slow) -> None:
        try:
            data = client.sock.recv(4096)
        except BlockingIOError:
            return
        except ConnectionResetError:
            data = b""
        if data:
            client.answered += data
        else:
            self._cut(selector, client)

    def _send(self, selector: selectors.BaseSelector, client: Slow) -> None:
        try:
            client.sock.send(b"a")
        except BlockingIOError:
            pass
        except (BrokenPipeError, ConnectionResetError):
            self._cut(selector, client)

    def _cut(self, selector: selectors.BaseSelector, client: Slow) -> None:
        client.cut_after = time.monotonic() - client.opened
        selector.unregister(client.sock)


@pytest.fixture
def server(make_bot: BotFactory) -> Iterator[HttpServer]:
    bot = make_bot({})
    served = HttpServer(application(bot, alerts_token=None), "127.0.0.1", 0,
                        Settings(header_timeout=HEADER_TIMEOUT, grace=1))
    served.start()
    yield served
    served.stop()


def request(port: int, method: str, path: str) -> int:
    """One request on a connection of its own; its status (an exception: no answer)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT)
    try:
        body = EMPTY_WEBHOOK if method == "POST" else None
        connection.request(method, path, body=body,
                           headers={"Content-Type": "application/json"} if body else {})
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


def fast_requests(pool: ThreadPoolExecutor, port: int) -> list[int]:
    calls = [("GET", "/healthz"), ("POST", "/alerts")] * 50
    return list(pool.map(lambda call: request(port, *call), calls))


def test_slow_clients_hold_no_thread_and_are_cut_after_the_deadline(
        server: HttpServer) -> None:
    with ThreadPoolExecutor(SENDERS) as pool:
        assert set(fast_requests(pool, server.port)) == {200}  # warm: pool threads exist
        threads_before = threading.active_count()
        dribbler = Dribbler(server.port)
        try:
            dribbler.start(SLOW)
            assert dribbler.dribbled.wait(5)  # every slow client has sent a few header bytes
            threads_during = threading.active_count()
            statuses = fast_requests(pool, server.port)
            all_cut = dribbler.wait_all_cut(HEADER_TIMEOUT + 4)
        finally:
            dribbler.close()
        threads_after = threading.active_count()
    assert statuses == [200] * 100
    assert all_cut, f"{sum(c.cut_after is None for c in dribbler.clients)} never cut"
    assert [c.answered for c in dribbler.clients if c.answered] == []
    cut_after = [c.cut_after for c in dribbler.clients]
    assert None not in cut_after
    assert min(t for t in cut_after if t is not None) >= HEADER_TIMEOUT * 0.9
    # 200 connections cost one thread (the dribbler), the server's none; at most one worker
    # thread per request in flight at once (SENDERS of them) may be added by the requests
    assert threads_during <= threads_before + 2
    assert threads_after <= threads_before + SENDERS
