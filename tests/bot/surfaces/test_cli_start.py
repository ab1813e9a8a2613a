"""A command's start collects garbage seldom (bot.surfaces.cli.GC_WHILE_STARTING) and its
work as usual: the collector's thresholds are back once the service is assembled, and after
any command, even one that never assembles it."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from bot.service import Service
from bot.surfaces import cli
from tests.bot.surfaces.test_cli import bare_env, cli_here  # noqa: F401  (a fixture)


def test_the_start_collects_seldom_and_the_work_as_usual(
        bare_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    seen: dict[str, tuple[int, int, int]] = {}
    assembled, runbooks = Service.from_config, Service.runbooks

    def from_config(*args: Any, **kwargs: Any) -> Service:
        seen["assembling"] = gc.get_threshold()
        return assembled(*args, **kwargs)

    def listing(self: Service, *args: Any, **kwargs: Any) -> Any:
        seen["working"] = gc.get_threshold()
        return runbooks(self, *args, **kwargs)

    monkeypatch.setattr(Service, "from_config", staticmethod(from_config))
    monkeypatch.setattr(Service, "runbooks", listing)
    assert cli_here("list", env=bare_env).returncode == 0
    assert seen["assembling"][0] == cli.GC_WHILE_STARTING
    assert seen["working"] == cli.GC_THRESHOLDS == gc.get_threshold()


def test_a_command_without_a_service_gives_the_thresholds_back(
        bare_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    assert cli_here("completion", "bash", env=bare_env).returncode == 0
    assert gc.get_threshold() == cli.GC_THRESHOLDS
