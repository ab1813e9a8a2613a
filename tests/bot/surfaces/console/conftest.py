"""The console tests' seeded database: made once per module and backend, read only."""

from __future__ import annotations

import pytest

from bot.service import Service
from tests.bot.surfaces.console.seeded import CONSOLE, Row, seeded_database
from tests.conftest import BotFactory


@pytest.fixture(scope="module",
                params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def seeded_db(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[Row]]:
    return seeded_database(request, tmp_path_factory.mktemp("seeded"))


@pytest.fixture
def seeded(make_bot: BotFactory,
           seeded_db: tuple[str, list[Row]]) -> tuple[Service, list[Row]]:
    """The module's seeded database (read, never changed), under a bot of its own."""
    url, rows = seeded_db
    return make_bot({}, url=url, console=CONSOLE), rows
