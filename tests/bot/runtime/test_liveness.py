"""Liveness never depends on the database: with the database unreachable GET /livez still
answers 200 while GET /healthz (readiness) answers 503 saying why, and both are back to 200
once the database is; /livez is named among the routes an unknown path is told of."""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.runtime.httpserver import HttpServer
from bot.runtime.serving import application, http_settings
from bot.service import Service
from tests.conftest import BotFactory


def get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        with connection.getresponse() as answer:
            return answer.status, json.loads(answer.read())
    finally:
        connection.close()


@pytest.fixture
def served(make_bot: BotFactory, tmp_path: Path) -> Iterator[tuple[Service, int, Path]]:
    bot = make_bot({}, url=f"sqlite:///{tmp_path / 'bot.db'}")
    server = HttpServer(application(bot, alerts_token=None), "127.0.0.1", 0,
                        http_settings(bot.config.server))
    server.start()
    try:
        yield bot, server.port, tmp_path / "bot.db"
    finally:
        server.stop()


def test_liveness_holds_while_the_database_is_unreachable(
        served: tuple[Service, int, Path]) -> None:
    bot, port, database = served
    assert get(port, "/livez") == (200, {"status": "alive"})
    assert get(port, "/healthz")[0] == 200
    kept = database.with_name("kept.db")
    database.rename(kept)
    database.mkdir()  # where the file was, something SQLite cannot open: the database is gone
    bot.db.dispose()  # no pooled connection keeps the old file open
    try:
        status, body = get(port, "/healthz")
        assert status == 503 and body["status"] == "unhealthy" and body["database"], body
        assert get(port, "/livez") == (200, {"status": "alive"})
    finally:
        database.rmdir()
        os.replace(kept, database)
        bot.db.dispose()
    assert get(port, "/healthz")[0] == 200
    assert get(port, "/livez")[0] == 200


def test_livez_is_among_the_routes_named(make_bot: BotFactory) -> None:
    bot = make_bot({})
    server = HttpServer(application(bot, alerts_token=None), "127.0.0.1", 0,
                        http_settings(bot.config.server))
    server.start()
    try:
        assert get(server.port, "/livez") == (200, {"status": "alive"})
        status, body = get(server.port, "/nowhere")
        assert status == 404 and "GET /livez, /healthz, /metrics" in body["error"]
    finally:
        server.stop()
