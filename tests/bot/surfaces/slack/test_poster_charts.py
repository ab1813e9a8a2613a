"""A chart a step wrote (report.fairshare's PNG) reaches the execution's thread once, through
files_upload_v2, after the summary; a chart that changed since its hash was kept is not
uploaded, and the thread says why."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from adapters.reports.fairshare import PNG_SIGNATURE, FairshareReviewAction
from bot.execution.engine import Engine
from bot.runbooks.catalogue import Catalogue
from bot.service import Service
from bot.surfaces.slack.poster import Poster
from tests.adapters.test_fairshare import NOW, Source, cluster_queue, kube
from tests.conftest import BotFactory

RUNBOOK = Path(__file__).parents[4] / "runbooks" / "fairshare-review.yaml"


class UploadingClient:
    """chat.postMessage, chat.update and files_upload_v2 as the poster calls them."""

    def __init__(self) -> None:
        self.posts: list[dict[str, Any]] = []
        self.uploads: list[dict[str, Any]] = []

    def chat_postMessage(self, **kwargs: Any) -> dict[str, Any]:
        self.posts.append(kwargs)
        return {"ok": True, "ts": f"1700000000.{len(self.posts):06d}"}

    def chat_update(self, **kwargs: Any) -> dict[str, Any]:
        return {"ok": True, "ts": kwargs["ts"]}

    def files_upload_v2(self, **kwargs: Any) -> dict[str, Any]:
        self.uploads.append(kwargs)
        return {"ok": True, "file": {"id": "F1"}}


def reviewed(make_bot: BotFactory, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> tuple[Service, int]:
    monkeypatch.setenv("RUNBOOK_REPORT_DIR", str(tmp_path))
    bot = make_bot({"fairshare-review": RUNBOOK.read_text()})
    action = FairshareReviewAction(Source(), kube(cluster_queue()), clock=lambda: NOW)
    bot = dataclasses.replace(bot, catalogue=Catalogue(
        [action, *(bot.catalogue.get(name) for name in bot.catalogue.arguments())]))
    execution_id = bot.request("fairshare-review", {}, "alice")
    engine = Engine(bot)
    try:
        assert engine.drive(execution_id).state == "succeeded"
    finally:
        engine.close()
    return bot, execution_id


def test_the_chart_is_uploaded_once_into_the_thread(make_bot: BotFactory, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    bot, execution_id = reviewed(make_bot, tmp_path, monkeypatch)
    client = UploadingClient()
    first, second = Poster(bot, client, "C1", 1.0), Poster(bot, client, "C1", 1.0)
    first.tick()
    first.tick()
    second.tick()  # another replica
    assert len(client.uploads) == 1
    upload = client.uploads[0]
    root = "1700000000.000001"  # the execution's root message, posted first
    assert "thread_ts" not in client.posts[0] or client.posts[0]["thread_ts"] is None
    assert upload["channel"] == "C1" and upload["thread_ts"] == root
    assert upload["filename"] == f"fairshare-review-{execution_id}.png"
    assert upload["content"].startswith(PNG_SIGNATURE)
    assert upload["content"] == (tmp_path / upload["filename"]).read_bytes()
    summary = next(i for i, p in enumerate(client.posts) if "ended *succeeded*" in p["text"])
    assert client.posts[summary]["thread_ts"] == root


def test_a_changed_chart_is_not_uploaded(make_bot: BotFactory, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    bot, execution_id = reviewed(make_bot, tmp_path, monkeypatch)
    chart = tmp_path / f"fairshare-review-{execution_id}.png"
    chart.write_bytes(PNG_SIGNATURE + b"not the chart the step wrote")
    client = UploadingClient()
    Poster(bot, client, "C1", 1.0).tick()
    assert client.uploads == []
    assert any(p["text"] == f"the chart {chart} changed since the step wrote it (sha256): "
               "not uploaded" for p in client.posts)
