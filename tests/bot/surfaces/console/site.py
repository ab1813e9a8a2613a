"""A small site for the console's browser tests and screenshots: a configuration (basic and a
proxy trusted on loopback), runbooks that need no cluster, executions run for real by the
bot's engine at times spread over two days, and `runbook serve` started on it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import time_machine
import yaml

from bot.config import load_config
from bot.execution.engine import Engine
from bot.service import Service
from bot.store import checkpoints, db
from bot.surfaces.console.passwords import hash_password

PASSWORD = "lab-only console password"  # for carol and alice; never a real one
# what no page may show: a secret parameter's default, and the value one request gave it
SECRET_DEFAULT = "default-bmc-Secret-4711"
SECRET = "hunter2-BMC-Secret-0815"
NODES = [f"gpu{n:02d}" for n in range(1, 9)]
START = datetime(2026, 11, 30, 6, 0, tzinfo=UTC)  # the first seeded request
HOST_COMMANDS = {
    "gpu-probe": {"argv": ["echo", "GPUs answered on"], "accepts_args": True,
                  "description": "ask the node's GPUs"},
    "burn-in": {"argv": ["sh", "-c", "echo 'GPU 3: ECC double-bit error'; exit 3"],
                "description": "a short burn-in"},
    "health": {"argv": ["true"], "description": "the node's health check"},
    "burn-start": {"argv": ["echo", "burn-in started on"], "accepts_args": True},
    "burn-stop": {"argv": ["echo", "burn-in stopped on"], "accepts_args": True},
}


def probe_node(version: str, extra_step: bool) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [
        {"id": "announce", "action": "chat.notify",
         "with": {"message": "probing {{ node }}"}},
        {"id": "probe", "action": "host.run",
         "with": {"command": "gpu-probe", "args": ["{{ node }}"]}, "timeout": "30s"}]
    if extra_step:
        steps.append({"id": "report", "action": "chat.notify",
                      "with": {"message": "{{ node }} probed"}})
    return {"name": "probe-node", "version": version, "risk": "low",
            "summary": "Ask a node's GPUs whether they answer.",
            "params": {"node": {"type": "node", "required": True}},
            "locks": ["node:{{ node }}"],
            "pre_checks": [{"name": "the node is healthy", "command": "health",
                            "expect": "== 0"}],
            "steps": steps,
            "post_checks": [{"name": "still healthy", "command": "health", "expect": "== 0"}]}


def burn_in() -> dict[str, Any]:
    return {"name": "burn-in", "version": "2.0.0", "risk": "medium",
            "summary": "Put GPU nodes through a short burn-in; undone when it fails.",
            "params": {"nodes": {"type": "nodes", "required": True},
                       "force": {"type": "bool", "default": False,
                                 "weakens_guard": "changed"},
                       "bmc_password": {"type": "text", "default": SECRET_DEFAULT}},
            "locks": ["runbook:burn-in"],
            "steps": [{"id": "start", "action": "host.run",
                       "with": {"command": "burn-start", "args": [
                           "{{ nodes }}", "--bmc-password", "{{ bmc_password }}"]},
                       "undo": {"action": "host.run",
                                "with": {"command": "burn-stop", "args": ["{{ nodes }}"]}}}],
            "post_checks": [{"name": "GPUs pass the burn-in", "command": "burn-in",
                             "expect": "== 0", "when": "{{ not force }}"}]}


@dataclass
class Site:
    folder: Path
    config_file: Path
    db_file: Path
    ids: dict[str, int] = field(default_factory=dict)  # what each seeded execution shows

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
        env.update(RUNBOOK_CONFIG=str(self.config_file),
                   XDG_STATE_HOME=str(self.folder / "state"))
        return env

    def bot(self) -> Service:
        return Service.from_config(load_config(self.config_file))

    def runbook(self, body: dict[str, Any]) -> None:
        (self.folder / "runbooks" / f"{body['name']}.yaml").write_text(
            yaml.safe_dump(body, sort_keys=False))


def make(folder: Path) -> Site:
    """The configuration and runbooks in ``folder``; no execution yet (see ``seed``)."""
    (folder / "runbooks").mkdir(parents=True)
    hashed = hash_password(PASSWORD)
    config = {
        "lab": True, "database_url": f"sqlite:///{folder / 'bot.db'}",
        "runbook_paths": ["runbooks"],
        "users": {"alice": {"groups": ["oncall"]}, "bob": {"groups": ["oncall"]},
                  "carol": {"groups": ["gpu-leads"]}, "dave": {"groups": ["gpu-leads"]},
                  "erin": {"groups": ["audit"]}},
        "requesters": ["group:oncall", "group:gpu-leads"],
        "approvers": ["group:gpu-leads"],
        "inventory": {"nodes": NODES, "discover": False},
        "host_commands": HOST_COMMANDS,
        "engine": {"poll_seconds": 0.2},
        "server": {"shutdown_grace_seconds": 1},
        "audit": {"checkpoint_file": "audit.checkpoints"},  # the head, kept apart
        "console": {"proxy": {"trusted": ["127.0.0.1"]},
                    "basic": {"carol": hashed, "alice": hashed},
                    "auditors": ["user:carol", "group:audit"], "page_size": 50},
    }
    site = Site(folder, folder / "bot.yaml", folder / "bot.db")
    site.config_file.write_text(yaml.safe_dump(config, sort_keys=False))
    db.init(f"sqlite:///{folder / 'bot.db'}")  # `runbook db init`: commands never create it
    site.runbook(probe_node("1.0.0", extra_step=False))
    site.runbook(burn_in())
    return site


def _run(bot: Service, at: datetime, name: str, params: dict[str, str], user: str,
         source: str = "cli", approvers: tuple[str, ...] = (), **options: Any) -> int:
    """One execution requested at ``at`` (the clock moves on from there), approved by
    ``approvers`` and driven by the bot's engine to its end."""
    with time_machine.travel(at, tick=True):
        execution_id = bot.request(name, params, user, source, **options)
        for approver in approvers:
            bot.approve(execution_id, approver)
        engine = Engine(bot, sleep=lambda seconds: None)
        try:
            engine.drive(execution_id)
        finally:
            engine.close()
    return execution_id


def seed(site: Site) -> Site:
    """Executions of every kind the pages show: succeeded, failed with an undo, denied,
    break-glass with two approvals, one awaiting approval; two versions of probe-node."""
    bot = site.bot()
    hours = iter(range(0, 48, 3))

    def at() -> datetime:
        return START + timedelta(hours=next(hours), minutes=7)

    ids = site.ids
    ids["probe-gpu01"] = _run(bot, at(), "probe-node", {"node": "gpu01"}, "alice")
    ids["probe-gpu02"] = _run(bot, at(), "probe-node", {"node": "gpu02"}, "bob", "chat")
    ids["burn-failed"] = _run(bot, at(), "burn-in", {"nodes": "gpu[03-04]",
                                                     "bmc_password": SECRET},
                              "alice", "alert", approvers=("carol",))
    ids["burn-glass"] = _run(bot, at(), "burn-in", {"nodes": "gpu05", "force": "true"},
                             "bob", approvers=("carol", "dave"), break_glass=True)
    with time_machine.travel(at(), tick=True):
        ids["burn-denied"] = bot.request("burn-in", {"nodes": "gpu06"}, "alice")
        bot.deny(ids["burn-denied"], "dave", "not during the training run")
    site.runbook(probe_node("1.1.0", extra_step=True))
    bot = site.bot()  # reads the runbooks again: probe-node 1.1.0 is first seen now
    ids["probe-v11"] = _run(bot, at(), "probe-node", {"node": "gpu01"}, "carol", "schedule")
    ids["probe-gpu07"] = _run(bot, at(), "probe-node", {"node": "gpu07"}, "bob", "window")
    ids["probe-gpu08"] = _run(bot, at(), "probe-node", {"node": "gpu08"}, "alice")
    ids["burn-waiting"] = bot.request("burn-in", {"nodes": "gpu[07-08]"}, "bob")
    assert bot.config.audit.checkpoint_file is not None
    checkpoints.record(bot.db, bot.config.audit.checkpoint_file)
    bot.db.dispose()
    return site


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextmanager
def serve(site: Site, port: int | None = None) -> Iterator[str]:
    """`runbook serve` on the site, on loopback; yields its base URL once /healthz answers
    and stops it (SIGTERM) at the end."""
    port = port or free_port()
    log = (site.folder / f"serve-{port}.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "bot", "serve", "--port", str(port)],
                              env=site.env(), stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, cwd=site.folder)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_up(base, server, site.folder / f"serve-{port}.log")
        yield base
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def _wait_up(base: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"runbook serve did not answer: {log.read_text()[-2000:]}")
        time.sleep(0.1)
