"""Requests already acted on: Slack retries and Socket Mode redeliveries run once.

The key is what Slack keeps across a redelivery (trigger_id of a command or a
button, event_id of an event). The database makes it hold across replicas.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from bot.store import chatrecord
from bot.store.db import Engine

KEEP = timedelta(days=2)


def key_of(body: dict[str, Any]) -> str | None:
    for name in ("trigger_id", "event_id"):
        value = body.get(name)
        if isinstance(value, str) and value:
            return f"{name}:{value}"[:200]
    return None


def first_time(engine: Engine, key: str) -> bool:
    """True the first time ``key`` is seen; False for a redelivery."""
    return chatrecord.first_delivery(engine, key)


def prune(engine: Engine) -> None:
    cutoff = (datetime.now(UTC) - KEEP).strftime("%Y-%m-%dT%H:%M:%S")
    chatrecord.forget_deliveries(engine, cutoff)
