"""uvicorn, set up for a bot facing a network: the socket bound before anything starts,
a deadline on request headers, keep-alive and graceful-shutdown limits, optional TLS.

uvicorn runs in a thread of its own with its own event loop; ``stop`` asks it to stop
accepting, lets the requests in flight finish (up to ``grace`` seconds) and waits for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from bot.runtime import web
from bot.runtime.web import Asgi

_log = logging.getLogger(__name__)
# the request line and headers while they arrive in pieces (h11 answers 400 beyond); headers
# that arrive at once are bounded by bot.runtime.web.HeaderLimit (431)
MAX_HEADER_BYTES = web.MAX_HEADER_BYTES
STOP_SLACK = 5.0  # on stop, beyond the grace, for uvicorn's thread to end


@dataclass(frozen=True)
class Settings:
    header_timeout: float = 10.0  # seconds to send a request's line and headers
    keepalive: float = 5.0  # an idle kept-alive connection is closed after this long
    grace: float = 20.0  # on stop, requests in flight get this long to finish
    backlog: int = 128  # bursts: 20 chat requests at once are common in an incident
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None


class ListenError(Exception):
    """The server cannot start: the address is in use or not this machine's, or a TLS file
    cannot be read. The message says which."""


class HeaderDeadline(H11Protocol):
    """uvicorn closes an idle kept-alive connection, but waits forever for a client that
    sends its request line and headers a byte at a time (slowloris). This one closes a
    connection whose next request's headers are not all in ``header_timeout`` seconds after
    it opened or after its last answer. A request being answered is never cut."""

    header_timeout = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def send_400_response(self, msg: str) -> None:
        """What h11 cannot parse (a request line, a header, a Content-Length that is not a
        number) gets the JSON error every other answer has, and the connection closed.
        Once this request's answer is out (a GET's unread body turns out garbled), h11
        takes no second answer: the connection is only closed."""
        body = json.dumps({"error": "not a valid HTTP/1.1 request: check the request line, "
                                    "the headers and Content-Length (the body's size in "
                                    "bytes)"}).encode()
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            for event in (h11.Response(status_code=400, headers=[
                              (b"content-type", b"application/json"), (b"connection", b"close"),
                              (b"content-length", str(len(body)).encode())]),
                          h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event) or b"")
        self.transport.close()

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.header_timeout, self._expire)

    def _expire(self) -> None:
        self._deadline = None
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and not self.transport.is_closing():
            self.transport.close()


def bind(host: str, port: int, backlog: int) -> socket.socket:
    """The listening socket, bound now so that a port in use fails before anything starts
    (port 0: any free port; ``.getsockname()`` says which)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host.strip("[]"), port), family=family, backlog=backlog)


class HttpServer:
    """uvicorn on a bound socket, in a thread: ``start`` returns once it accepts."""

    def __init__(self, app: Asgi, host: str, port: int, settings: Settings) -> None:
        protocol = type("Protocol", (HeaderDeadline,), {"header_timeout": settings.header_timeout})
        self.config = uvicorn.Config(
            app, http=protocol, lifespan="off", log_config=None, access_log=False,
            server_header=False, proxy_headers=False, limit_concurrency=None,
            timeout_keep_alive=max(1, round(settings.keepalive)),
            timeout_graceful_shutdown=max(1, round(settings.grace)),
            h11_max_incomplete_event_size=MAX_HEADER_BYTES, backlog=settings.backlog,
            ssl_certfile=settings.tls_cert_file, ssl_keyfile=settings.tls_key_file)
        try:  # a TLS file that cannot be read, or a port in use, fails before anything starts
            self.config.load()
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            raise ListenError(f"cannot use the TLS certificate {settings.tls_cert_file} and key "
                              f"{settings.tls_key_file}: {_reason(exc)}") from exc
        try:
            self.socket = bind(host, port, settings.backlog)
        except OSError as exc:
            raise ListenError(f"cannot listen on {host}:{port}: {_reason(exc)}") from exc
        self.port = int(self.socket.getsockname()[1])
        self.grace = settings.grace
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self._run, daemon=True, name="http")
        self.failure: BaseException | None = None

    def _run(self) -> None:
        try:
            self.server.run(sockets=[self.socket])
        except BaseException as exc:  # reported by start()
            self.failure = exc
            _log.exception("the HTTP server stopped")

    def start(self, timeout: float = 10.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if self.failure is not None or not self.thread.is_alive():
                raise RuntimeError(f"the HTTP server did not start: {self.failure!r}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP server did not start in {timeout:g}s")
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop accepting; let requests in flight finish (up to ``grace``); then return."""
        self.server.should_exit = True
        self.thread.join(self.grace + STOP_SLACK)
        self.socket.close()


def _reason(exc: BaseException) -> str:
    errno = getattr(exc, "errno", None)
    if isinstance(exc, OSError) and not getattr(exc, "library", None) and errno:
        return os.strerror(errno)  # "Address already in use", without the address again
    return str(getattr(exc, "reason", None) or exc)
