"""Shared fixtures: a bot on a throw-away database (SQLite, and PostgreSQL where marked),
test runbooks written to a temporary folder, and the lab (tests.lab.fixture)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, settings

from bot.config import Config
from bot.execution.checks.core import Checks, CommandEvaluator
from bot.runbooks.catalogue import Catalogue
from bot.runbooks.params import Inventory
from bot.service import Service
from bot.store import db
from tests import postgres
from tests.bot.fakes import test_actions

# the lab; the audit log's receivers that shipping tests start themselves
pytest_plugins = ["tests.lab.fixture", "tests.adapters.receivers"]

NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]
LAB_USERS = {
    "alice": {"groups": ["oncall"]},
    "bob": {"groups": ["oncall"]},
    "carol": {"groups": ["gpu-leads"]},
    "dave": {"groups": ["gpu-leads"]},
}


@pytest.fixture(autouse=True)
def _dispose_engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Close every database pool a test opened, so no connection outlives its test."""
    opened: list[Any] = []
    real = db.connect

    def tracking(url: str, **kwargs: Any) -> Any:
        engine = real(url, **kwargs)
        opened.append(engine)
        return engine

    monkeypatch.setattr(db, "connect", tracking)
    yield
    for engine in opened:
        engine.dispose()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[postgres.PostgresServer]:
    try:
        server = postgres.start()
    except postgres.PostgresMissing as exc:
        if os.environ.get("CI"):
            pytest.fail(f"{exc}: `make test` installs it")
        pytest.skip(str(exc))
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of each kind the store supports."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'bot.db'}"
    server = request.getfixturevalue("postgres_server")
    return postgres.fresh_database(server.url, f"t_{secrets.token_hex(6)}")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'bot.db'}"


def lab_config(url: str, runbook_dir: Path, **overrides: Any) -> Config:
    data: dict[str, Any] = {
        "lab": True,
        "database_url": url,
        "runbook_paths": [str(runbook_dir)],
        "users": LAB_USERS,
        "requesters": ["group:oncall", "group:gpu-leads"],
        "approvers": ["group:gpu-leads"],
        "inventory": {"nodes": NODES},
        "engine": {"lease_seconds": 2, "poll_seconds": 0.05},
    }
    data.update(overrides)
    return Config.model_validate(data)


BotFactory = Callable[..., Service]


@pytest.fixture
def make_bot(tmp_path: Path, sqlite_url: str) -> BotFactory:
    """Build a bot over runbooks given as dicts (or YAML text), with the fake test actions."""

    def factory(runbooks: dict[str, Any], url: str | None = None, **overrides: Any) -> Service:
        folder = tmp_path / f"runbooks-{secrets.token_hex(3)}"
        folder.mkdir()
        for name, body in runbooks.items():
            text = body if isinstance(body, str) else yaml.safe_dump(body, sort_keys=False)
            (folder / f"{name}.yaml").write_text(text)
        config = lab_config(url or sqlite_url, folder, **overrides)
        nodes = frozenset(config.inventory.nodes)
        engine = db.connect(config.resolved_database_url())
        return Service(
            config=config,
            db=engine,
            catalogue=Catalogue([*test_actions(), *standard_actions(config, engine)]),
            checks=Checks({"command": CommandEvaluator(config.host_commands)},
                          sleep=lambda s: None),
            inventory=Inventory(nodes=nodes, slurm=nodes, kubernetes=frozenset({"gpu04"})),
        )

    return factory


def standard_actions(config: Config, engine: Any) -> list[Any]:
    from bot.execution.confirming import DatabaseConfirmations
    from bot.runbooks.catalogue import standard_actions as standard

    return standard(config, DatabaseConfirmations(engine))


# --- Hypothesis profiles: HYPOTHESIS_PROFILE=ci|long, "ci" by default where CI is set ----
# ci: the same examples every run (derandomised; Hypothesis then keeps no example database,
# it refuses both at once) and the blob to reproduce a failure. long: random examples, the
# database in .hypothesis/, and LONG_FACTOR times each test's own max_examples (every
# property test names its own, which a profile alone would not override).
LONG_FACTOR = 20
settings.register_profile("ci", derandomize=True, database=None, print_blob=True,
                          deadline=None, max_examples=50,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", derandomize=False, deadline=None, max_examples=2000,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI") else "default"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if settings.get_current_profile_name() != "long":
        return
    machines: set[type] = set()
    for item in items:
        test: Any = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)  # what @given reads
        if isinstance(own, settings):
            test._hypothesis_internal_use_settings = settings(
                own, max_examples=own.max_examples * LONG_FACTOR)
        case: Any = getattr(item, "cls", None)  # a state machine's TestCase
        if isinstance(getattr(case, "settings", None), settings) and case not in machines:
            machines.add(case)
            case.settings = settings(case.settings,
                                     max_examples=case.settings.max_examples * LONG_FACTOR)
