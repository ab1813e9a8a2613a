"""Two `runbook serve` replicas on one PostgreSQL database against the lab: the leader is
killed with SIGKILL in the middle of a drain-node (its wait-idle step is waiting for a
Slurm job), the other replica becomes the leader and finishes the execution without
repeating a finished step, and the audit chain verifies.

The helpers (HaCluster, hold_node) are shared with bench/failover.py.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

RUNBOOK = [sys.executable, "-m", "bot"]
NODE = "gpu03"  # in Slurm only: drain-node runs slurm-drain, skips k8s-drain, then wait-idle
LEASE_SECONDS = 3.0  # engine.lease_seconds for the replicas (the lab's bot.yaml says 10)
RETRY_SECONDS = 0.5  # leader_election.retry_seconds
POLL_SECONDS = 0.2  # engine.poll_seconds
# Kill to resumed: the dead engine's lease runs out (at most LEASE_SECONDS after its last
# renewal), then the new leader's engine loop finds the execution (POLL_SECONDS).
RESUME_WITHIN = LEASE_SECONDS + 3.0  # in the test; failover_once waits on the cluster's lease
LEAD_WITHIN = RETRY_SECONDS + 2.0  # PostgreSQL frees the lock when the killed socket closes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def parse_ts(ts: str) -> float:
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def wait_until(condition: Callable[[], Any], what: str, seconds: float,
               every: float = 0.05) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:g}s waiting for {what}")
        time.sleep(every)


@dataclass
class Replica:
    name: str
    port: int
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def healthz(self) -> dict[str, Any] | None:
        try:
            url = f"http://127.0.0.1:{self.port}/healthz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return dict(json.loads(response.read()))
        except (OSError, ValueError):
            return None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL to the replica and everything it started (its own session)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait(10)


@dataclass
class HaCluster:
    """`runbook serve` replicas on one PostgreSQL database, with the lab's configuration."""

    lab_env: dict[str, str]
    lab_dir: Path
    db_url: str
    folder: Path
    count: int = 2
    lease_seconds: float = LEASE_SECONDS
    retry_seconds: float = RETRY_SECONDS
    replicas: list[Replica] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        config = yaml.safe_load((self.lab_dir / "bot.yaml").read_text())
        config["engine"] = {**config.get("engine", {}), "lease_seconds": self.lease_seconds,
                            "poll_seconds": POLL_SECONDS}
        config["leader_election"] = {"method": "postgres", "retry_seconds": self.retry_seconds}
        (self.folder / "bot.yaml").write_text(yaml.safe_dump(config))
        self.env = {k: v for k, v in self.lab_env.items() if not k.startswith("SLACK_")}
        self.env.update(RUNBOOK_CONFIG=str(self.folder / "bot.yaml"), RUNBOOK_DB_URL=self.db_url)
        from bot.store import db

        # Not migrated here: the replicas start together on the new database and migrate it.
        self.db = db.connect(self.db_url, migrate=False)

    def start(self) -> None:
        self.replicas = [Replica(f"replica-{index + 1}", free_port(),
                                 self.folder / f"replica-{index + 1}.log")
                         for index in range(self.count)]
        for replica in self.replicas:
            self.launch(replica)
        for replica in self.replicas:
            self.wait_up(replica)

    def launch(self, replica: Replica) -> None:
        """Start (or start again) `runbook serve` for the replica, in its own session."""
        with replica.log.open("ab") as log:
            replica.process = subprocess.Popen(
                [*RUNBOOK, "serve", "--port", str(replica.port)], env=self.env,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)

    def wait_up(self, replica: Replica) -> None:
        wait_until(lambda: replica.healthz() or not replica.alive(), replica.name, 60)
        assert replica.alive(), self.logs()

    def leader(self, seconds: float = 30, among: list[Replica] | None = None) -> Replica:
        """The one replica whose /healthz says it leads (and no other says so)."""
        candidates = among or [r for r in self.replicas if r.alive()]

        def one() -> Replica | None:
            leading = [r for r in candidates if (r.healthz() or {}).get("leader")]
            return leading[0] if len(leading) == 1 else None

        found: Replica = wait_until(one, "exactly one leader", seconds, every=0.02)
        return found

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*RUNBOOK, *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, check=False)

    def request_drain(self, node: str, reason: str) -> int:
        done = self.cli("run", "drain-node", f"node={node}", f"reason={reason}", "--as", "alice")
        assert done.returncode == 0, done.stderr
        execution_id = int(done.stdout.split()[1])
        approved = self.cli("approve", str(execution_id), "--as", "carol")
        assert approved.returncode == 0, approved.stderr
        return execution_id

    def events(self, execution_id: int) -> list[dict[str, Any]]:
        from bot.store import audit

        with self.db.connect() as conn:
            return list(audit.events(conn, execution_id=execution_id))

    def wait_event(self, execution_id: int, kind: str, seconds: float, **data: Any,
                   ) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            for event in self.events(execution_id):
                if event["kind"] == kind and all(event["data"].get(k) == v
                                                 for k, v in data.items()):
                    return event
            return None

        event: dict[str, Any] = wait_until(found, f"{kind} {data or ''}", seconds)
        return event

    def state(self, execution_id: int) -> str:
        from bot.execution import executions

        with self.db.connect() as conn:
            return executions.get(conn, execution_id).state

    def lease_until(self, execution_id: int) -> float:
        from sqlalchemy import select

        from bot.store.schema import executions

        with self.db.connect() as conn:
            return float(conn.execute(select(executions.c.lease_until)
                                      .where(executions.c.id == execution_id)).scalar_one())

    def logs(self) -> str:
        return "\n".join(f"--- {r.name} (port {r.port}) ---\n"
                         + (r.log.read_text(errors="replace")[-3000:] if r.log.exists() else "")
                         for r in self.replicas)

    def stop(self) -> None:
        for replica in self.replicas:
            replica.kill()
        self.db.dispose()


def hold_node(env: dict[str, str], node: str, release: Path, name: str = "failover-hold") -> str:
    """A Slurm job named ``name`` on ``node`` that runs until ``release`` exists; its id."""
    done = subprocess.run(
        ["sbatch", "--parsable", "-o", "/dev/null", "-w", node, "-N1", "-J", name,
         "--wrap", f"while [ ! -e {release} ]; do sleep 0.2; done"],
        env=env, capture_output=True, text=True, timeout=30, check=True)
    job = done.stdout.strip().split(";")[0]
    wait_until(lambda: "RUNNING" in subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], env=env, capture_output=True, text=True,
        timeout=30).stdout, f"job {job} to run", 30, every=0.1)
    return job


def put_node_back(env: dict[str, str], node: str, job: str | None) -> None:
    if job:
        subprocess.run(["scancel", job], env=env, capture_output=True, timeout=30, check=False)
    subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=env,
                   capture_output=True, timeout=30, check=False)


@dataclass
class Failover:
    """What one failover run measured (seconds, wall clock, from the SIGKILL)."""

    execution_id: int
    killed: Replica
    survivor: Replica
    leadership_moved: float  # until the survivor's /healthz says it leads
    resumed: float  # until the survivor's engine recorded "resumed" (it owns the execution)
    step_restarted: float  # until the interrupted step started again
    lease_left: float  # the dead engine's lease on the execution still ran this long
    finished: float = 0.0  # until the execution succeeded (after the job was released)

    @property
    def after_lease(self) -> float:
        """From the end of the dead engine's lease to the execution resumed."""
        return self.resumed - self.lease_left


def failover_once(cluster: HaCluster, release: Path, node: str = NODE,
                  delay: float = 0.3) -> Failover:
    """Request and approve drain-node on a node held by a job; SIGKILL the leader ``delay``
    seconds into wait-idle; measure the takeover; release the job so the execution can end."""
    execution_id = cluster.request_drain(node, "failover test")
    cluster.wait_event(execution_id, "step_finished", 60, step="slurm-drain")
    cluster.wait_event(execution_id, "step_started", 30, step="wait-idle")
    killed = cluster.leader(seconds=5)
    survivor = next(r for r in cluster.replicas if r is not killed and r.alive())
    time.sleep(delay)  # inside the step (0.3 s: its first squeue poll has run)
    kill_at = time.time()
    killed.kill()
    lease_until = cluster.lease_until(execution_id)  # final: the dead engine renews no more
    cluster.leader(seconds=LEAD_WITHIN + 10, among=[survivor])
    moved = time.time() - kill_at
    resumed = cluster.wait_event(execution_id, "resumed", cluster.lease_seconds + 20)
    restarted = cluster.wait_event(execution_id, "step_started", 10, step="wait-idle",
                                   attempt=2)
    result = Failover(execution_id, killed, survivor, moved, parse_ts(resumed["ts"]) - kill_at,
                      parse_ts(restarted["ts"]) - kill_at, lease_until - kill_at)
    release.touch()
    wait_until(lambda: cluster.state(execution_id) in ("succeeded", "failed", "cancelled"),
               "the execution to end", 60, every=0.1)
    result.finished = time.time() - kill_at
    return result


# --- the test ----------------------------------------------------------------------------


@pytest.fixture
def cluster(lab: Any, postgres_server: Any, tmp_path: Path) -> Iterator[HaCluster]:
    from tests import postgres

    url = postgres.fresh_database(postgres_server.url, f"ha_{secrets.token_hex(6)}")
    ha = HaCluster(lab.env, lab.dir, url, tmp_path / "ha")
    try:
        ha.start()
        yield ha
    finally:
        ha.stop()


@pytest.mark.lab
@pytest.mark.postgres
def test_leader_killed_mid_drain_the_other_replica_finishes(
        lab: Any, cluster: HaCluster, tmp_path: Path) -> None:
    release = tmp_path / "release-job"
    job = None
    try:
        first = cluster.leader()
        assert [(r.healthz() or {}).get("leader") for r in cluster.replicas].count(True) == 1
        assert (first.healthz() or {})["leader_replica"] == f"{socket.gethostname()}:{first.pid}"
        job = hold_node(lab.env, NODE, release)
        result = failover_once(cluster, release)
        print(f"\nfailover: leadership moved in {result.leadership_moved:.2f}s, execution "
              f"resumed {result.resumed:.2f}s ({result.after_lease:.2f}s after the dead "
              f"engine's lease ran out) and wait-idle restarted {result.step_restarted:.2f}s "
              f"after the SIGKILL; finished {result.finished:.2f}s after it")
        assert result.killed is first and not first.alive()
        assert result.leadership_moved < LEAD_WITHIN, result
        assert 0 < result.resumed < RESUME_WITHIN, result
        # Resumed once the dead engine's lease ran out (never before), within a poll or two.
        assert -0.1 < result.after_lease < 2.0, result
        assert cluster.state(result.execution_id) == "succeeded", cluster.logs()

        events = cluster.events(result.execution_id)
        steps = [(e["kind"], e["data"].get("step"), e["data"].get("attempt")) for e in events
                 if e["kind"].startswith("step_")]
        # Each finished step ran once; only the interrupted wait-idle ran again (attempt 2).
        assert steps == [
            ("step_started", "slurm-drain", 1), ("step_finished", "slurm-drain", 1),
            ("step_skipped", "k8s-drain", None),
            ("step_started", "wait-idle", 1),  # the killed leader's: never finished
            ("step_started", "wait-idle", 2), ("step_finished", "wait-idle", 2),
        ], steps
        started = next(e for e in events if e["kind"] == "started")
        resumed = next(e for e in events if e["kind"] == "resumed")
        assert f":{first.pid}:" in started["data"]["engine"]
        assert resumed["data"]["previous_engine"] == started["data"]["engine"]
        assert resumed["data"]["stage"] == "steps"
        with cluster.db.connect() as conn:
            from bot.execution import executions

            states = executions.step_states_of(conn, result.execution_id)
        assert {key: (s.state, s.attempt) for key, s in states.items()} == {
            ("do", "slurm-drain"): ("succeeded", 1), ("do", "k8s-drain"): ("skipped", 0),
            ("do", "wait-idle"): ("succeeded", 2)}

        verify = cluster.cli("audit", "verify")
        assert verify.returncode == 0, verify.stdout + verify.stderr
        shown = subprocess.run(["scontrol", "show", "node", NODE, "-o"], env=lab.env,
                               capture_output=True, text=True, timeout=30).stdout
        assert "DRAIN" in shown and "Reason=failover test" in shown
        assert (result.survivor.healthz() or {}).get("leader") is True
        log = result.survivor.log.read_text()
        assert f"{socket.gethostname()}:{result.survivor.pid} is now the leader" in log
        assert f"[{result.execution_id}] resuming after engine" in log
    except BaseException:
        print(cluster.logs(), file=sys.stderr)
        raise
    finally:
        put_node_back(lab.env, NODE, job)
