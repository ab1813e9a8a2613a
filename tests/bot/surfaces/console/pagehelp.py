"""For the console's page tests: the console's people (basic auth; erin is an auditor,
alice a requester), a client through the real application of `runbook serve` with the
console mounted at /ui (httpx's ASGI transport), and a small HTML parse to assert on what
a page shows."""

from __future__ import annotations

import asyncio
import base64
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

import httpx

from bot.runtime.serving import application
from bot.service import Service
from bot.surfaces.console.pages import console
from bot.surfaces.console.passwords import hash_password
from tests.conftest import LAB_USERS

PASSWORD = "a console password for the tests"
USERS = {**LAB_USERS, "erin": {"groups": ["audit"]}}
BASE = "http://testserver"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


@functools.cache
def _hashed() -> str:
    return hash_password(PASSWORD)  # scrypt: once per test session


def overrides(**more: Any) -> dict[str, Any]:
    """make_bot keywords: the people, basic passwords for all, erin (group audit) auditor."""
    basic = {name: _hashed() for name in USERS}
    return {"users": USERS, "console": {"basic": basic, "auditors": ["group:audit"]}, **more}


class Client:
    """Requests through ``runbook serve``'s application (bot.runtime.serving), console at
    /ui; no redirect followed."""

    def __init__(self, bot: Service) -> None:
        self.app = application(bot, alerts_token=None, mounts={"/ui": console(bot)})

    def request(self, method: str, url: str, headers: dict[str, str]) -> httpx.Response:
        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app, client=("192.0.2.7", 40000))
            async with httpx.AsyncClient(transport=transport, base_url=BASE) as web:
                return await web.request(method, url, headers=headers)

        return asyncio.run(send())

    def get(self, url: str, headers: dict[str, str]) -> httpx.Response:
        return self.request("GET", url, headers)

    def post(self, url: str, headers: dict[str, str]) -> httpx.Response:
        return self.request("POST", url, headers)


_CLIENTS: dict[int, tuple[Service, Client]] = {}


def client(bot: Service) -> Client:
    """One client per bot: its console verifies each password and compiles each template
    once (scrypt and Jinja are what a page of these tests waits for)."""
    if id(bot) not in _CLIENTS or _CLIENTS[id(bot)][0] is not bot:
        if len(_CLIENTS) > 8:
            _CLIENTS.clear()
        _CLIENTS[id(bot)] = (bot, Client(bot))
    return _CLIENTS[id(bot)][1]


def as_user(name: str) -> dict[str, str]:
    token = base64.b64encode(f"{name}:{PASSWORD}".encode()).decode()
    return {"authorization": f"Basic {token}"}


def form_headers(name: str) -> dict[str, str]:
    """A form posted from a page of the console (same origin)."""
    return {**as_user(name), "origin": BASE}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)

    def text(self) -> str:
        """The text inside, spaces collapsed as a browser shows them."""
        return " ".join(self._raw().split())

    def _raw(self) -> str:
        return "".join(c if isinstance(c, str) else c._raw() for c in self.children)

    def walk(self) -> Iterator[Element]:
        yield self
        for child in self.children:
            if isinstance(child, Element):
                yield from child.walk()

    def all(self, tag: str, cls: str | None = None, **attrs: str) -> list[Element]:
        return [e for e in self.walk() if e.tag == tag
                and (cls is None or cls in e.attrs.get("class", "").split())
                and all(e.attrs.get(k) == v for k, v in attrs.items())]

    def one(self, tag: str, cls: str | None = None, **attrs: str) -> Element:
        found = self.all(tag, cls, **attrs)
        assert len(found) == 1, f"{len(found)} <{tag}> with {cls} {attrs}"
        return found[0]

    def rows(self) -> list[list[str]]:
        """The cells' text of each body row of a table."""
        return [[cell.text() for cell in row.children if isinstance(cell, Element)]
                for body in self.all("tbody") for row in body.all("tr")]


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag == "br":
            self.stack[-1].children.append(" ")
        if tag not in VOID:
            self.stack.append(element)

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(html: str) -> Element:
    builder = _Builder()
    builder.feed(html)
    builder.close()
    return builder.root
