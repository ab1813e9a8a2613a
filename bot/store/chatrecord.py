"""What the Slack surface keeps in the database: the messages the poster posted
(``chat_messages``: claimed before posting, so no replica posts one twice) and the requests
already acted on (``chat_deliveries``: a redelivered command runs once). The surface reads
and writes these rows only through the functions here."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, delete, select, update
from sqlalchemy.exc import IntegrityError

from bot.store.db import now_iso
from bot.store.schema import chat_deliveries, chat_messages


def claim(db: Engine, subject: str, channel: str) -> bool:
    """The subject's row, ours to post; False when posted already (or by another replica)."""
    try:
        with db.begin() as conn:
            conn.execute(chat_messages.insert().values(
                subject=subject, channel=channel, ts=None, rendered=None, final=0,
                updated_at=now_iso()))
    except IntegrityError:
        return False
    return True


def let_go(db: Engine, subject: str) -> None:
    """Forget a claim whose post failed, so the next tick posts it again."""
    with db.begin() as conn:
        conn.execute(delete(chat_messages).where(chat_messages.c.subject == subject))


def mark(db: Engine, subject: str, **values: Any) -> None:
    """Set the row's ``ts``, ``rendered`` or ``final``."""
    with db.begin() as conn:
        conn.execute(update(chat_messages).where(chat_messages.c.subject == subject)
                     .values(**values, updated_at=now_iso()))


def posted(db: Engine, pattern: str) -> set[str]:
    """The subjects claimed (posted or being posted) that match a LIKE ``pattern``."""
    with db.connect() as conn:
        return set(conn.execute(select(chat_messages.c.subject).where(
            chat_messages.c.subject.like(pattern))).scalars())


def unsettled(db: Engine, pattern: str) -> list[tuple[str, str, str | None]]:
    """(subject, ts, rendered) of posted messages that may still change, oldest update first."""
    with db.connect() as conn:
        return [(r.subject, r.ts, r.rendered) for r in conn.execute(
            select(chat_messages).where(chat_messages.c.subject.like(pattern),
                                        chat_messages.c.final == 0,
                                        chat_messages.c.ts.is_not(None))
            .order_by(chat_messages.c.updated_at))]


def first_delivery(db: Engine, key: str) -> bool:
    """True the first time ``key`` is seen; False for a redelivery."""
    try:
        with db.begin() as conn:
            conn.execute(chat_deliveries.insert().values(key=key, received_at=now_iso()))
        return True
    except IntegrityError:
        return False


def forget_deliveries(db: Engine, before: str) -> None:
    """Drop the keys received before ``before`` (an ISO time, UTC)."""
    with db.begin() as conn:
        conn.execute(delete(chat_deliveries).where(chat_deliveries.c.received_at < before))
