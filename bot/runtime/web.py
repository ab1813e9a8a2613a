"""The ASGI application ``runbook serve`` runs under uvicorn (bot.runtime.httpserver).

Routes are plain functions ``(headers, body) -> Response`` run in a worker thread, so the
event loop only reads requests and writes answers (an ``AtOnce`` route may answer there).
Before a route runs, the body is checked (bot.runtime.access) and read within
``read_timeout``; at most ``max_requests`` are answered at once and four times as many
bodies read (503 beyond, ``Places``); each answer is timed and logged without secrets.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response as Answer
from starlette.routing import BaseRoute, Mount
from starlette.routing import Route as Path

from bot.runtime import access

access_log = logging.getLogger("bot.access")
MAX_HEADER_BYTES = 16 * 1024  # a request's headers, names and values

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()  # more headers: (name, value)


# A POST route: (request headers, raw body) -> response. Headers keys are lower case.
Route = Callable[[Mapping[str, str], bytes], Response]


class AtOnce:
    """A POST route some of whose answers are given on the event loop, with no worker thread,
    so that they never queue behind busy threads (Slack's acknowledgement: it wants one in
    3 s, under a burst of commands whose work holds the threads). ``first`` must be quick and
    never wait (no database, no network): it returns the answer, or None to let ``rest``
    answer in a worker thread. Called as a plain route, it runs both in the caller's thread."""

    def __init__(self, first: Callable[[Mapping[str, str], bytes], Response | None],
                 rest: Route) -> None:
        self.first = first
        self.rest = rest

    def __call__(self, headers: Mapping[str, str], body: bytes) -> Response:
        return self.first(headers, body) or self.rest(headers, body)


@dataclass(frozen=True)
class Limits:
    read_timeout: float = 10.0  # seconds to receive a whole body once the headers are in
    max_requests: int = 64  # requests in flight at once; more are answered 503


def json_response(status: int, data: Any, headers: tuple[tuple[str, str], ...] = ()
                  ) -> Response:
    return Response(status, json.dumps(data).encode(), headers=headers)


def header_map(items: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """Request headers by lower-case name; one sent twice keeps both values, joined by ", "
    (so a doubled Authorization is refused, not one of them picked)."""
    found: dict[str, str] = {}
    for raw_name, raw_value in items:
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        found[name] = f"{found[name]}, {value}" if name in found else value
    return found


def _answer(response: Response, *, close: bool = False) -> Answer:
    headers = dict(response.headers)
    if close:  # the body was not read: it must not be taken for the next request
        headers["Connection"] = "close"
    return Answer(response.body, response.status, headers=headers,
                  media_type=response.content_type)


def post_endpoint(route: Route, limits: Limits, places: Places) -> Callable[[Request],
                                                                          Awaitable[Answer]]:
    """A POST route behind the body checks: Content-Length 1 to MAX_BODY (400, 413, unread
    and the connection closed), the whole body within ``read_timeout`` (408), a place to
    read it in and then a place to be answered in (503 when there is none)."""

    async def endpoint(request: Request) -> Answer:
        headers = header_map(request.headers.raw)
        try:
            access.content_length(headers.get("content-length"))
        except access.BodyRefused as exc:
            return _answer(json_response(exc.status, {"error": str(exc)}), close=True)
        with places.reading.one() as reading:
            if not reading:
                return places.reading.refusal()
            try:
                body = await asyncio.wait_for(request.body(), limits.read_timeout)
            except ClientDisconnect:  # nobody is left to answer; nothing was done
                return _answer(json_response(400, {"error": "the client went away"}),
                               close=True)
            except TimeoutError:
                return _answer(json_response(408, {"error": "the body did not arrive within "
                                                            f"{limits.read_timeout:g}s"}),
                               close=True)
        with places.answering.one() as answering:
            if not answering:
                return places.answering.refusal()
            if isinstance(route, AtOnce):
                at_once = route.first(headers, body)
                return _answer(at_once if at_once is not None
                               else await run_in_threadpool(route.rest, headers, body))
            return _answer(await run_in_threadpool(route, headers, body))

    return endpoint


def build(posts: Mapping[str, Route], *, health: Callable[[], Response],
          registry: CollectorRegistry, histogram: Histogram, limits: Limits,
          mounts: Mapping[str, Asgi] | None = None) -> Asgi:
    """The application: GET /livez (the process answers: it reads nothing, so a database
    outage never restarts a replica), /healthz and /metrics, ``posts`` (path -> route), and
    ``mounts`` (path prefix -> an application of its own, like the console at /ui), each
    request of which takes an answering place."""
    places = Places.of(limits)
    mounts = mounts or {}

    async def healthz(request: Request) -> Answer:
        return _answer(await run_in_threadpool(health))

    async def livez(request: Request) -> Answer:  # on the event loop: no thread, no database
        return _answer(json_response(200, {"status": "alive"}))

    async def metrics(request: Request) -> Answer:
        with places.answering.one() as answering:
            if not answering:
                return places.answering.refusal()
            text = await run_in_threadpool(generate_latest, registry)
        return Answer(text, 200, media_type="text/plain; version=0.0.4")

    paths: list[BaseRoute] = [Path("/livez", livez, methods=["GET"]),
                              Path("/healthz", healthz, methods=["GET"]),
                              Path("/metrics", metrics, methods=["GET"])]
    paths += [Path(path, post_endpoint(route, limits, places), methods=["POST"])
              for path, route in posts.items()]
    paths += [Mount(prefix, app=Placed(app, places.answering)) for prefix, app in mounts.items()]
    where = "GET /livez, /healthz, /metrics" + "".join(f", {prefix}/" for prefix in mounts) + \
        "; POST " + ", ".join(posts)

    async def refused(request: Request, exc: Exception) -> Answer:
        assert isinstance(exc, HTTPException)
        what = (f"no {request.url.path} here: {where}" if exc.status_code == 404
                else f"{request.url.path} does not take {request.method}: {where}")
        return _answer(json_response(exc.status_code, {"error": what},
                                     tuple((exc.headers or {}).items())))

    async def failed(request: Request, exc: Exception) -> Answer:  # logged by the server
        return _answer(json_response(500, {"error": "the bot failed to answer; its log says "
                                                    "why"}))

    app = Starlette(routes=paths,
                    exception_handlers={404: refused, 405: refused, Exception: failed})
    known = {"/livez", "/healthz", "/metrics", *posts}
    return Observed(HeaderLimit(app), histogram, known, prefixes=tuple(mounts))


class HeaderLimit:
    """Request headers of more than MAX_HEADER_BYTES are refused with 431. (h11 bounds
    headers that arrive in pieces, not those that arrive in one read.)"""

    def __init__(self, app: Asgi) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        size = sum(len(name) + len(value) + 4 for name, value in scope.get("headers", ()))
        if scope["type"] == "http" and size > MAX_HEADER_BYTES:
            answer = _answer(json_response(431, {"error": f"the request's headers must be at "
                                                          f"most {MAX_HEADER_BYTES} bytes"}),
                             close=True)
            await answer(scope, receive, send)
            return
        await self.app(scope, receive, send)


class Placed:
    """A mounted application whose requests each hold one of ``bound``'s places (503 when
    none is free), so that pages and exports count with the routes."""

    def __init__(self, app: Asgi, bound: Bound) -> None:
        self.app = app
        self.bound = bound

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with self.bound.one() as free:
            if not free:
                await self.bound.refusal()(scope, receive, send)
                return
            await self.app(scope, receive, send)


class Bound:
    """At most ``most`` at once of something requests hold; past it, 503 at once, so that a
    burst queues in the clients (Slack and Alertmanager retry), not in this process. Only
    the event loop counts, so no lock."""

    def __init__(self, most: int, what: str) -> None:
        self.most = most
        self.what = what
        self.taken = 0

    @contextmanager
    def one(self) -> Iterator[bool]:
        """Whether a place was free; it is held until the block ends."""
        if self.taken >= self.most:
            yield False
            return
        self.taken += 1
        try:
            yield True
        finally:
            self.taken -= 1

    def refusal(self) -> Answer:
        return _answer(json_response(503, {"error": f"{self.most} {self.what} at once; try "
                                                    "again"}, (("Retry-After", "1"),)),
                       close=True)


@dataclass(frozen=True)
class Places:
    """Requests being answered (a worker thread and the database each: ``max_requests``),
    and bodies being read (a socket and up to 1 MiB each, no thread: four times as many),
    bounded apart so that clients sending bodies slowly never take the places of requests
    being answered. /livez and /healthz take neither: a busy replica is not a dead one."""

    answering: Bound
    reading: Bound

    @classmethod
    def of(cls, limits: Limits) -> Places:
        return cls(Bound(limits.max_requests, "requests are being answered"),
                   Bound(4 * limits.max_requests, "request bodies are being read"))


class Observed:
    """Times every answer into the histogram and logs one access line: client, method,
    route, status, milliseconds. Never a header, a query string or a body (tokens and
    signatures travel there); a path no route takes is logged as "other"."""

    def __init__(self, app: Asgi, histogram: Histogram, known: set[str],
                 prefixes: tuple[str, ...] = ()) -> None:
        self.app = app
        self.histogram = histogram
        self.known = known
        self.prefixes = prefixes  # a mounted application's paths are timed under its prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client sees when the application fails before answering

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            seconds = time.perf_counter() - started
            route = self._route(scope["path"])
            method = scope["method"] if scope["method"] in _METHODS else "other"
            self.histogram.labels(method, route, str(status)).observe(seconds)
            client = scope.get("client") or ("-", 0)
            access_log.info("%s %s %s %d %.1fms", client[0], method, route, status,
                            seconds * 1000)


    def _route(self, path: str) -> str:
        if path in self.known:
            return path
        for prefix in self.prefixes:
            if path == prefix or path.startswith(prefix + "/"):
                return prefix
        return "other"


_METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"}
