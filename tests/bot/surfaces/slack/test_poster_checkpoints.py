"""Audit checkpoints in the channel (audit.checkpoint_chat): each head posted once, even by
two replicas or after a restart, in words a checkpoint file can be made of."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.config import Config
from bot.service import Service
from bot.store import checkpoints, db
from bot.surfaces.slack.poster import Poster
from tests.bot.store.test_audit import fill


class RecordingClient:
    """Slack's chat.postMessage as the poster calls it: what was sent, and a ts back."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def chat_postMessage(self, **kwargs: Any) -> dict[str, Any]:
        self.sent.append(kwargs)
        return {"ok": True, "ts": f"1700000000.{len(self.sent):06d}"}


def test_a_head_is_posted_once_and_reads_back_as_a_checkpoint(tmp_path: Path,
                                                              sqlite_url: str) -> None:
    db.init(sqlite_url)  # `runbook db init`: the bot's commands never create the database
    bot = Service.from_config(Config(database_url=sqlite_url))
    fill(bot.db, 2)
    seq, digest = checkpoints.head(bot.db)
    point = checkpoints.Checkpoint(seq, digest, "2026-12-02T01:00:00Z")
    client = RecordingClient()
    first, second = Poster(bot, client, "C1", 1.0), Poster(bot, client, "C1", 1.0)
    first.checkpoint(point)
    second.checkpoint(point)  # another replica, or this one after a restart
    assert len(client.sent) == 1 and client.sent[0]["channel"] == "C1"
    pasted = tmp_path / "pasted"
    pasted.write_text(client.sent[0]["text"] + "\n")
    assert checkpoints.read(pasted) == [point]
    assert checkpoints.check(bot.db, pasted) == (1, [])
