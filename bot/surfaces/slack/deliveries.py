"""Requests already acted on: Slack retries and Socket Mode redeliveries run once.

The key is what Slack keeps across a redelivery (trigger_id of a command or a
button, event_id of an event). The database makes it hold across replicas.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, delete
from sqlalchemy.exc import IntegrityError

from bot.store.db import now_iso
from bot.store.schema import chat_deliveries

KEEP = timedelta(days=2)


def key_of(body: dict[str, Any]) -> str | None:
    for name in ("trigger_id", "event_id"):
        value = body.get(name)
        if isinstance(value, str) and value:
            return f"{name}:{value}"[:200]
    return None


def first_time(engine: Engine, key: str) -> bool:
    """True the first time ``key`` is seen; False for a redelivery."""
    try:
        with engine.begin() as conn:
            conn.execute(chat_deliveries.insert().values(key=key, received_at=now_iso()))
        return True
    except IntegrityError:
        return False


def prune(engine: Engine) -> None:
    cutoff = (datetime.now(UTC) - KEEP).strftime("%Y-%m-%dT%H:%M:%S")
    with engine.begin() as conn:
        conn.execute(delete(chat_deliveries).where(chat_deliveries.c.received_at < cutoff))
