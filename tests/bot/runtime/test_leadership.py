"""Leader election (bot.runtime.leadership): two electors on PostgreSQL and only one leads; a
leader whose session ends (pg_terminate_backend, SIGKILL of its process) hands over; SQLite
always leads (and a second replica is warned about); the Kubernetes Lease wrapper; and
leader-only tasks that stop when leadership is lost and start again when it is gained,
including an engine that hands its execution over at the next step boundary."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from adapters.kubernetes.backend import KubernetesConflict, KubernetesError, Lease
from bot.config import Config, ConfigError
from bot.runtime.leadership import (
    AlwaysLeader,
    KubernetesElector,
    Leadership,
    PostgresElector,
    choose_method,
    claim_sqlite,
    make_elector,
)
from bot.runtime.serving import serve
from bot.runtime.tasks import Task, engine_task
from bot.store import audit
from tests import postgres
from tests.bot import fakes
from tests.conftest import BotFactory


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


def wait_until(condition: Callable[[], Any], what: str, seconds: float = 10) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


# --- PostgreSQL ---------------------------------------------------------------------------


@pytest.fixture
def pg_url(postgres_server: postgres.PostgresServer) -> str:
    return postgres.fresh_database(postgres_server.url, f"t_{secrets.token_hex(6)}")


@pytest.fixture
def electors(pg_url: str) -> Iterator[tuple[PostgresElector, PostgresElector]]:
    a = PostgresElector(pg_url, "test-lock", replica="replica-a")
    b = PostgresElector(pg_url, "test-lock", replica="replica-b")
    yield a, b
    a.release()
    b.release()


def election_pid(url: str, replica: str) -> int:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(
                "SELECT pid FROM pg_stat_activity WHERE application_name = :name"),
                {"name": f"runbook-election {replica}"}).scalar_one())
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_two_electors_only_one_leads(electors: tuple[PostgresElector, PostgresElector]) -> None:
    a, b = electors
    assert a.campaign() is True
    assert b.campaign() is False and b.problem is None
    for _ in range(3):  # renewals keep it where it is
        assert a.campaign() is True and b.campaign() is False
    assert a.holder() == b.holder() == "replica-a"
    a.release()  # a graceful stop: the other leads at its next try
    assert b.campaign() is True and b.holder() == "replica-b"
    assert a.campaign() is False


@pytest.mark.postgres
def test_other_lock_names_do_not_compete(pg_url: str) -> None:
    one, other = PostgresElector(pg_url, "bot-one"), PostgresElector(pg_url, "bot-two")
    try:
        assert one.campaign() and other.campaign()
    finally:
        one.release()
        other.release()


@pytest.mark.postgres
def test_terminated_leader_session_hands_over(
        pg_url: str, electors: tuple[PostgresElector, PostgresElector]) -> None:
    a, b = electors
    assert a.campaign() and not b.campaign()
    engine = create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"),
                     {"pid": election_pid(pg_url, "replica-a")})
    engine.dispose()
    assert a.campaign() is False  # the renewal finds the connection dead: leadership lost
    assert a.problem and a.problem.startswith("PostgreSQL:")
    assert b.campaign() is True
    assert a.campaign() is False and a.problem is None  # reconnected, now a follower


@pytest.mark.postgres
def test_sigkilled_leader_process_hands_over(
        pg_url: str, electors: tuple[PostgresElector, PostgresElector]) -> None:
    _, b = electors
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from bot.runtime.leadership import PostgresElector\n"
         "e = PostgresElector(sys.argv[1], 'test-lock')\nprint(e.campaign(), flush=True)\n"
         "time.sleep(120)\n", pg_url], stdout=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "True"
        assert b.campaign() is False
        assert b.holder() == f"{socket.gethostname()}:{child.pid}"
        os.kill(child.pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_until(b.campaign, "b to take the lock", seconds=5)
        assert time.monotonic() - killed < 2  # PostgreSQL frees the lock when the socket closes
    finally:
        child.kill()
        child.communicate(timeout=10)


@pytest.mark.postgres
def test_leadership_log_lines(pg_url: str) -> None:
    lines: list[str] = []
    first = Leadership(PostgresElector(pg_url, "t", replica="r1"), [], log=lines.append)
    second = Leadership(PostgresElector(pg_url, "t", replica="r2"), [], log=lines.append)
    assert first.round() and not second.round()
    first.close()
    assert second.round()
    second.close()
    assert lines == [
        "leader election: r1 is now the leader (PostgreSQL advisory lock 't'); started: nothing",
        "leader election: r2 follows (PostgreSQL advisory lock 't'; leader: r1)",
        "leader election: r1 gives the leadership up (shutting down); stopped: nothing",
        "leader election: r2 is now the leader (PostgreSQL advisory lock 't'); started: nothing",
        "leader election: r2 gives the leadership up (shutting down); stopped: nothing",
    ]


@pytest.mark.postgres
def test_replicas_starting_together_on_a_new_database(pg_url: str, tmp_path: Any) -> None:
    """Each initialises the schema (as `serve --init-db` in every replica of the Deployment
    does), then records the runbook versions; none trips on another (before the advisory
    locks in bot.store.db and bot.runbooks.versions, most runs had one fail with a duplicate
    key)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    env.update(RUNBOOK_DB_URL=pg_url, XDG_STATE_HOME=str(tmp_path))
    for argv in (["db", "init"], ["list"]):
        starts = [subprocess.Popen([sys.executable, "-m", "bot", *argv], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                   stdin=subprocess.DEVNULL) for _ in range(3)]
        errors = [p.communicate(timeout=120)[1] for p in starts]
        assert [p.returncode for p in starts] == [0, 0, 0], (argv, errors)


# --- choosing the method; SQLite -----------------------------------------------------------


def config(url: str, **extra: Any) -> Config:
    return Config.model_validate({"database_url": url, **extra})


def test_auto_method(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("RUNBOOK_DB_URL", raising=False)
    pg = "postgresql://bot@db.example/bot"
    sqlite = f"sqlite:///{tmp_path}/bot.db"
    kube = {"kubernetes": {"kubeconfig": "/nonexistent"}}
    assert choose_method(config(sqlite)) == "none"
    assert choose_method(config(pg)) == "postgres"
    assert choose_method(config(pg, **kube)) == "postgres"  # not running in a cluster
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert choose_method(config(pg, **kube)) == "kubernetes"
    assert choose_method(config(pg)) == "postgres"  # no kubernetes section
    assert choose_method(config(sqlite, **kube)) == "none"  # one replica: no Lease, no RBAC
    assert choose_method(config(pg, leader_election={"method": "none"})) == "none"


def test_misconfigured_method_is_refused(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNBOOK_DB_URL", raising=False)
    with pytest.raises(ConfigError, match="not PostgreSQL"):
        make_elector(config(f"sqlite:///{tmp_path}/bot.db",
                            leader_election={"method": "postgres"}))
    with pytest.raises(ConfigError, match="no kubernetes section"):
        make_elector(config(f"sqlite:///{tmp_path}/bot.db",
                            leader_election={"method": "kubernetes"}))
    with pytest.raises(ValueError, match="retry_seconds must be less than lease_seconds"):
        config("sqlite://", leader_election={"lease_seconds": 2, "retry_seconds": 2})


def test_sqlite_always_leads_and_a_second_replica_is_warned(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("RUNBOOK_DB_URL", raising=False)
    url = f"sqlite:///{tmp_path}/bot.db"
    first = make_elector(config(url))
    assert isinstance(first, AlwaysLeader) and first.campaign() and first.campaign()
    assert capsys.readouterr().err == ""
    # Another process serving the same file: flock is per open file, so a child shows it.
    child = subprocess.run(
        [sys.executable, "-c", "import sys\nfrom bot.runtime.leadership import claim_sqlite\n"
         "keep, warning = claim_sqlite(sys.argv[1])\nprint(warning)", url],
        capture_output=True, text=True, timeout=60, check=True)
    assert f"runbook serve {socket.gethostname()}:{os.getpid()} already serves the SQLite " \
           f"database {tmp_path}/bot.db" in child.stdout
    assert "use PostgreSQL" in child.stdout
    first.release()  # the lock file is free again
    keep, warning = claim_sqlite(url)
    assert keep is not None and warning is None
    keep.close()


# --- Kubernetes Lease ------------------------------------------------------------------------


class MemoryLeases:
    """coordination.k8s.io Leases in memory, with resourceVersion conflicts; can fail."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], Lease] = {}
        self.version = 0
        self.failing: KubernetesError | None = None

    def _check(self) -> None:
        if self.failing is not None:
            raise self.failing

    def _store(self, lease: Lease) -> Lease:
        self.version += 1
        stored = replace(lease, resource_version=str(self.version))
        self.leases[(lease.namespace, lease.name)] = stored
        return stored

    def get_lease(self, namespace: str, name: str) -> Lease | None:
        self._check()
        return self.leases.get((namespace, name))

    def create_lease(self, lease: Lease) -> Lease:
        self._check()
        if (lease.namespace, lease.name) in self.leases:
            raise KubernetesConflict("exists", status=409)
        return self._store(lease)

    def replace_lease(self, lease: Lease) -> Lease:
        self._check()
        current = self.leases.get((lease.namespace, lease.name))
        if current is None or current.resource_version != lease.resource_version:
            raise KubernetesConflict("stale", status=409)
        return self._store(lease)


def test_kubernetes_lease_elector() -> None:
    backend = MemoryLeases()
    a = KubernetesElector(backend, "bot", "ops", 2, replica="pod-a")
    b = KubernetesElector(backend, "bot", "ops", 2, replica="pod-b")
    assert a.campaign() and not b.campaign()
    assert b.holder() == "pod-a" and a.describe() == "Kubernetes Lease ops/bot (2s)"
    backend.failing = KubernetesError("leases is forbidden", status=403)
    assert a.campaign() is True  # an API error: a leader leads on until its lease runs out
    assert a.problem and "forbidden" in a.problem and "coordination.k8s.io leases" in a.problem
    assert wait_until(lambda: not a.campaign(), "a's own lease to run out", seconds=5)
    backend.failing = None
    a.release()
    assert b.campaign() and not a.campaign()
    assert backend.leases[("ops", "bot")].holder == "pod-b"


# --- leader-only tasks -------------------------------------------------------------------


@dataclass
class Switch:
    """An elector a test turns on and off."""

    identity: str = "replica-1"
    method: str = "switch"
    problem: str | None = None
    leading: bool = False
    released: int = 0

    campaigns: int = 0

    def campaign(self) -> bool:
        self.campaigns += 1
        return self.leading

    def holder(self) -> str | None:
        return self.identity if self.leading else "replica-2"

    def release(self) -> None:
        self.released += 1

    def describe(self) -> str:
        return "a test switch"


class Recorder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.started = 0
        self.stopped = 0
        self.running = threading.Event()

    def run(self, stop: threading.Event) -> None:
        self.started += 1
        self.running.set()
        stop.wait()
        self.running.clear()
        self.stopped += 1


def test_leader_only_tasks_stop_on_loss_and_start_on_gain() -> None:
    switch = Switch()
    task = Recorder("scheduler")
    lines: list[str] = []
    leadership = Leadership(switch, [Task("scheduler", task.run)], log=lines.append)
    assert not leadership.round() and task.started == 0
    assert lines == ["leader election: replica-1 follows (a test switch; leader: replica-2)"]
    switch.leading = True
    assert leadership.round() and task.running.wait(5) and leadership.is_leader
    assert leadership.round() and task.started == 1  # a renewal starts nothing new
    switch.leading = False
    assert not leadership.round()
    assert task.stopped == 1 and not task.running.is_set()  # stopped and joined
    switch.leading = True
    assert leadership.round() and task.running.wait(5) and task.started == 2
    leadership.close()
    assert task.stopped == 2 and switch.released == 1 and leadership.terms == 2
    assert lines[1:] == [
        "leader election: replica-1 is now the leader (a test switch); started: scheduler",
        "leader election: replica-1 lost the leadership (another replica leads); "
        "stopped: scheduler",
        "leader election: replica-1 is now the leader (a test switch); started: scheduler",
        "leader election: replica-1 gives the leadership up (shutting down); stopped: scheduler",
    ]


def test_a_task_that_does_not_stop_in_time_is_named() -> None:
    switch = Switch(leading=True)
    release = threading.Event()
    lines: list[str] = []

    def deaf(stop: threading.Event) -> None:  # ignores its stop
        release.wait(10)

    leadership = Leadership(switch, [Task("engine", deaf)], stop_timeout=0.1, log=lines.append)
    leadership.round()
    switch.leading = False
    leadership.round()
    release.set()
    assert lines[-1].startswith("leader election: replica-1 lost the leadership "
                                "(another replica leads); stopped: nothing; still finishing: "
                                "engine")


def gated_runbook() -> dict[str, Any]:
    return {
        "name": "demo", "version": "1.0.0", "summary": "leadership test", "risk": "low",
        "params": {"node": {"type": "node", "required": True}},
        "locks": ["node:{{ node }}"],
        "steps": [
            {"id": "first", "action": "test.record", "with": {"key": "first"}},
            {"id": "slow", "action": "test.gate", "with": {"key": "slow", "seconds": 30}},
            {"id": "last", "action": "test.record", "with": {"key": "last"}},
        ],
    }


def test_engine_hands_over_at_the_step_boundary_and_resumes_on_gain(make_bot: BotFactory) -> None:
    """Leadership lost mid-step: that step ends, the next one is not started; the execution
    is let go and runs on (without repeating a step) when leadership comes back."""
    bot = make_bot({"demo": gated_runbook()})
    switch = Switch(leading=True)
    lines: list[str] = []
    leadership = Leadership(switch, [engine_task(bot, lambda i, line: None)],
                            stop_timeout=0.2, log=lines.append)
    leadership.round()
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    assert fakes.STARTED.setdefault("slow", threading.Event()).wait(10)
    switch.leading = False
    leadership.round()  # the engine is inside "slow": it is named as still finishing
    assert "still finishing: engine" in lines[-1]
    fakes.GATES["slow"].set()
    wait_until(lambda: bot.get(execution_id).owner is None, "the execution to be let go")
    assert fakes.JOURNAL == [("test.record", "first"), ("test.gate", "slow")]
    assert bot.get(execution_id).state == "running"
    switch.leading = True
    leadership.round()
    wait_until(lambda: bot.get(execution_id).state == "succeeded", "the execution to end")
    leadership.close()
    assert fakes.JOURNAL == [("test.record", "first"), ("test.gate", "slow"),
                             ("test.record", "last")]
    with bot.db.connect() as conn:
        kinds = [e["kind"] for e in audit.events(conn, execution_id=execution_id)]
    assert kinds.count("step_finished") == 3 and "resumed" in kinds
    assert audit.verify(bot.db).ok


def healthz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
        assert response.status == 200
        return dict(json.loads(response.read()))


def test_serve_runs_leader_tasks_only_while_leading(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": {**gated_runbook(), "steps": gated_runbook()["steps"][:1]}},
                   leader_election={"retry_seconds": 0.05})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    switch = Switch()
    everywhere = Recorder("everywhere")
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(bot, "127.0.0.1", port, lambda i, s: None,
                                                  stop),
                              kwargs={"tasks": [Task("everywhere", everywhere.run,
                                                     leader_only=False)],
                                      "elector": switch}, daemon=True)
    thread.start()
    try:
        wait_until(lambda: _answers(port), "/healthz")
        assert healthz(port) == {"status": "ok", "leader": False, "replica": "replica-1",
                                 "election": "switch", "leader_replica": "replica-2"}
        assert everywhere.running.wait(5)  # not leader-only: runs in a follower too
        execution_id = bot.request("demo", {"node": "gpu02"}, "alice")
        asked = switch.campaigns
        wait_until(lambda: switch.campaigns >= asked + 3, "three rounds as a follower")
        assert bot.get(execution_id).state == "approved"  # no engine in a follower
        switch.leading = True
        wait_until(lambda: healthz(port)["leader"], "leadership")
        wait_until(lambda: bot.get(execution_id).state == "succeeded", "the execution")
        assert healthz(port)["leader_replica"] == "replica-1"
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive() and switch.released == 1 and everywhere.stopped == 1


def _answers(port: int) -> bool:
    try:
        healthz(port)
    except OSError:
        return False
    return True

