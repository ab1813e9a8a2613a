"""``runbook serve`` assembled (bot.runtime.startup), with the server itself left out: what
the surfaces plug in reaches it (routes, mounts, their tasks before the leader's own, each
execution's lines to every reader), the start line names every path, a check that refuses
the start creates no database, and runtime imports no surface to do it.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import subprocess
import sys
import threading
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


def test_sigterm_stops_and_arms_an_exit_with_the_stacks_after_the_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    handlers: dict[int, Any] = {}
    stops: list[threading.Event] = []
    armed: list[tuple[float, bool]] = []
    monkeypatch.setattr(startup, "serve", lambda service, host, port, report, stop, **kw:
                        stops.append(stop))
    monkeypatch.setattr(signal, "signal",
                        lambda number, handler: handlers.update({number: handler}))
    monkeypatch.setattr(faulthandler, "dump_traceback_later",
                        lambda seconds, exit=False: armed.append((seconds, exit)))
    config = _config(tmp_path, server={"shutdown_grace_seconds": 20})
    startup.run(config, Options(port=9999), Service.from_config, lambda s: [])
    logs.uninstall()
    assert not stops[0].is_set() and armed == []
    handlers[signal.SIGTERM](signal.SIGTERM, None)
    assert stops[0].is_set()
    assert armed == [(57.0, True)]  # 20 s grace + 5 s for uvicorn + 30 s for the tasks + 2
    handlers[signal.SIGTERM](signal.SIGTERM, None)  # a second SIGTERM, later
    assert armed == [(57.0, True)]  # the deadline stays where the first put it
    assert startup.exit_deadline(config) == 57.0


WATCHDOG = """
import signal, threading, time
from bot.runtime.startup import on_sigterm
signal.signal(signal.SIGTERM, on_sigterm(threading.Event(), 1))
threading.Thread(target=time.sleep, args=(60,), name="never-ends").start()
print("up", flush=True)
time.sleep(60)
"""


def test_a_process_still_running_at_the_deadline_writes_its_stacks_and_exits() -> None:
    child = subprocess.Popen([sys.executable, "-c", WATCHDOG], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert child.stdout is not None and child.stdout.readline() == "up\n"
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert child.returncode == 1, err
    assert "Timeout (0:00:01)!" in err and err.count("Thread 0x") == 2, err  # both threads
    assert 'File "<string>", line 7' in err, err  # the main thread, where it waits
