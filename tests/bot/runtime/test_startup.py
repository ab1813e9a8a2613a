"""``runbook serve`` assembled (bot.runtime.startup), with the server itself left out: what
the surfaces plug in reaches it (routes, mounts, their tasks before the leader's own, each
execution's lines to every reader), the start line names every path, a check that refuses
the start creates no database, and runtime imports no surface to do it.
"""

from __future__ import annotations

import gc
import signal
from pathlib import Path
from typing import Any

import pytest

from bot.config import Config
from bot.runtime import startup
from bot.runtime.startup import Options, Plugin, StartError
from bot.runtime.tasks import Task
from bot.service import Service
from kit import logs


def _config(tmp_path: Path, **extra: Any) -> Config:
    return Config.model_validate({"database_url": f"sqlite:///{tmp_path / 'bot.db'}",
                                  "database": {"create": True}, **extra})


def test_the_plugins_reach_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    served: dict[str, Any] = {}
    monkeypatch.setattr(startup, "serve", lambda service, host, port, report, stop, **kw:
                        served.update(kw, host=host, port=port, report=report))
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # pytest keeps its SIGTERM
    heard: list[tuple[int, str]] = []
    chat_task = Task("chat", lambda stop: None, leader_only=False)

    def plugins(service: Service) -> list[Plugin]:
        return [Plugin(routes={"/slack/events": object()}, tasks=[chat_task],  # type: ignore[dict-item]
                       report=lambda i, line: heard.append((i, line)),
                       note="; Slack in http mode"),
                Plugin(mounts={"/ui": object()}, shown=["/ui/"])]  # type: ignore[dict-item]

    startup.run(_config(tmp_path), Options(port=9999), Service.from_config, plugins)
    logs.uninstall()
    out = capsys.readouterr().out
    assert ("serving on http://127.0.0.1:9999 (/alerts, /healthz, /metrics, /slack/events, "
            "/ui/); Slack in http mode") in out
    assert list(served["routes"]) == ["/slack/events"] and list(served["mounts"]) == ["/ui"]
    assert [t.name for t in served["tasks"]][:3] == ["chat", "scheduler", "intake"]
    served["report"](7, "step 1 done")
    assert heard == [(7, "step 1 done")] and "[7] step 1 done" in capsys.readouterr().out


def test_a_refused_start_creates_nothing(tmp_path: Path) -> None:
    config = _config(tmp_path, server={"host": "0.0.0.0"})  # /alerts open to the network
    with pytest.raises(StartError, match="alerts"):
        startup.run(config, Options(init_db=True), Service.from_config, lambda s: [])
    logs.uninstall()
    assert not (tmp_path / "bot.db").exists()


def test_what_the_start_made_is_frozen_before_serving(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    frozen: list[int] = []
    monkeypatch.setattr(startup, "serve", lambda *args, **kw: frozen.append(gc.get_freeze_count()))
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # pytest keeps its SIGTERM
    gc.unfreeze()
    try:
        startup.run(_config(tmp_path), Options(port=9999), Service.from_config, lambda s: [])
    finally:
        logs.uninstall()
        gc.unfreeze()  # this test process collects as before
    assert frozen and frozen[0] > 10_000, frozen  # the modules' and models' objects at least
