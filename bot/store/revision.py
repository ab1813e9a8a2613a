"""The schema revision this code needs (the last Alembic migration), apart from bot.store.db so
that a quick reader (bot.store.recent) can check it without importing SQLAlchemy."""

HEAD_REVISION = "0013"
