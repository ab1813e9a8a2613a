"""The console's ASGI application, mounted at /ui by ``runbook serve``: who is asking first
(bot.surfaces.console.identity), then a page handler in a worker thread, rendered with
Jinja2 (autoescaped) under headers that keep it read-only and unframed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import QueryParams
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from bot.runtime.web import header_map
from bot.service import Service
from bot.surfaces.console.identity import REALM, Identities, NotAllowed, Viewer
from bot.surfaces.console.scope import shown

HERE = Path(__file__).parent
PREFIX = "/ui"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: under no-referrer a browser sends "Origin: null" with the
    # console's own forms, which _same_origin must refuse; other sites still get no referrer
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",  # pages hold audit data: never kept by a browser or proxy
    "X-Frame-Options": "DENY",
}


class BadRequest(Exception):
    """A filter or parameter the page cannot use: 400 with the message, nothing run."""


class NotFound(Exception):
    """What the page names does not exist (or is not for this viewer): 404."""


@dataclass(frozen=True)
class Ask:
    """One page request, as a handler sees it."""

    service: Service
    viewer: Viewer
    query: QueryParams
    path: Mapping[str, Any]
    method: str
    console: Console

    def page(self, template: str, status: int = 200, **context: Any) -> Response:
        return self.console.render(template, self.viewer, status, **context)


Handler = Callable[[Ask], Response]
PageRoute = tuple[str, Handler, tuple[str, ...]]  # (path under /ui, handler, methods)


class Console:
    def __init__(self, service: Service, pages: Iterable[PageRoute]) -> None:
        self.service = service
        self.identities = Identities(service.config)
        self.pages = list(pages)
        self.templates = Environment(loader=FileSystemLoader(HERE / "templates"),
                                     autoescape=True, undefined=StrictUndefined,
                                     trim_blocks=True, lstrip_blocks=True)
        self.templates.filters["when"] = when
        self.templates.filters["shown"] = shown  # masked: no secret reaches a page
        self.templates.globals["prefix"] = PREFIX

    def render(self, template: str, viewer: Viewer | None, status: int = 200,
               **context: Any) -> Response:
        html = self.templates.get_template(template).render(viewer=viewer, **context)
        return HTMLResponse(html, status, headers=SECURITY_HEADERS)

    def error(self, status: int, message: str, viewer: Viewer | None = None,
              headers: Mapping[str, str] | None = None) -> Response:
        answer = self.render("error.html", viewer, status, code=status, message=message)
        answer.headers.update(headers or {})
        return answer

    def endpoint(self, handler: Handler) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            headers = header_map(request.headers.raw)
            try:
                viewer = await run_in_threadpool(  # scrypt is slow: not on the event loop
                    self.identities.who, headers, request.client.host if request.client
                    else None)
            except NotAllowed as exc:
                challenge = {"WWW-Authenticate": REALM} if (
                    exc.status == 401 and self.service.config.console.basic) else {}
                return self.error(exc.status, str(exc), headers=challenge)
            if request.method == "POST" and not _same_origin(headers):
                return self.error(403, "a form of the console must be sent from the console",
                                  viewer)
            ask = Ask(self.service, viewer, request.query_params, request.path_params,
                      request.method, self)
            return await run_in_threadpool(self._answer, handler, ask)

        return endpoint

    def _answer(self, handler: Handler, ask: Ask) -> Response:
        started = time.perf_counter()
        try:
            answer = handler(ask)
        except BadRequest as exc:
            answer = self.error(400, str(exc), ask.viewer)
        except NotFound as exc:
            answer = self.error(404, str(exc), ask.viewer)
        # the handler's own time (queries and rendering; a download's first piece is not in
        # it): for the browser's developer tools and bench/console.py
        answer.headers["Server-Timing"] = (
            f"handler;dur={(time.perf_counter() - started) * 1000:.1f}")
        return answer

    def app(self) -> Starlette:
        routes: list[Any] = [Route(path, self.endpoint(handler), methods=list(methods))
                             for path, handler, methods in self.pages]
        routes.append(Route("/", lambda request: RedirectResponse(f"{PREFIX}/executions")))
        routes.append(Mount("/static", app=StaticFiles(directory=HERE / "static")))

        async def missing(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, HTTPException)
            message = (f"no page {request.url.path}" if exc.status_code == 404
                       else f"{request.url.path} does not take {request.method}")
            return self.error(exc.status_code, message, headers=exc.headers)

        async def failed(request: Request, exc: Exception) -> Response:  # logged by the server
            return self.error(500, "the console failed to answer; the bot's log says why")

        return Starlette(routes=routes, exception_handlers={404: missing, 405: missing,
                                                            Exception: failed})


def _same_origin(headers: Mapping[str, str]) -> bool:
    """A POST from a page of this console: the browser's Origin names this host (a form on
    another site cannot start work here). Clients that send no Origin are refused."""
    origin = headers.get("origin", "")
    host = headers.get("host", "")
    return bool(origin and host) and origin.split("://", 1)[-1] == host


def when(value: str | float | None) -> str:
    """A stored time (ISO-8601 UTC or epoch seconds) as ``2026-12-02 01:23:45Z``."""
    if value is None or value == "":
        return "–"
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return value[:19].replace("T", " ") + "Z"
