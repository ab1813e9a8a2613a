"""Leader election: of several ``runbook serve`` replicas on one database, one leads and runs
the leader-only tasks (``Leadership``); the methods are the electors below.

No execution's safety rests on leadership: an engine acts on an execution only under its own
claim and lease (bot.execution.engine). Nothing here touches the bot's tables.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from bot.config import Config, ConfigError, LeaderElectionConfig
from kit import logs

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_LOCK_CLASS = 0x6772_6221  # first key of the two-key advisory lock: "grb!" (the leader lock)
_APP_PREFIX = "runbook-election "  # application_name of election connections (pg_stat_activity)


def identity() -> str:
    """This replica's name among replicas: ``hostname:pid`` (the pod name in Kubernetes)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class LeaderTask(Protocol):
    """What Leadership starts and stops (bot.runtime.serving.Task is one)."""

    @property
    def name(self) -> str: ...

    @property
    def run(self) -> Callable[[threading.Event], None]: ...


class Elector(Protocol):
    """One method of election, chosen by the ``leader_election`` section of the
    configuration (``make_elector``): ``PostgresElector``, ``KubernetesElector`` or
    ``AlwaysLeader``; ``auto``, the default, picks one (``choose_method``)."""

    method: str
    identity: str
    problem: str | None  # the last round's error, None when the round went through

    def campaign(self) -> bool:
        """One round: take the leadership or keep it; True when this replica leads after it."""
        ...

    def holder(self) -> str | None:
        """The identity of the leader, when known (None: nobody leads or it cannot be read)."""
        ...

    def release(self) -> None:
        """Give the leadership up (so another replica leads at once) and close connections."""
        ...

    def describe(self) -> str: ...


class AlwaysLeader:
    """``method: none``: this replica always leads: SQLite (which supports one replica
    only), or a site that runs exactly one replica."""

    method = "none"

    def __init__(self, name: str | None = None, *, why: str = "leader_election.method is none",
                 keep: IO[str] | None = None) -> None:
        self.identity = name or identity()
        self.problem: str | None = None
        self._why = why
        self._keep = keep  # the SQLite replica lock file, held open while serving

    def campaign(self) -> bool:
        return True

    def holder(self) -> str | None:
        return self.identity

    def release(self) -> None:
        if self._keep is not None:
            self._keep.close()
            self._keep = None

    def describe(self) -> str:
        return f"no election: {self._why}"


class PostgresElector:
    """``method: postgres``: a session-level advisory lock (``pg_try_advisory_lock``) taken
    on a connection of its own, held for as long as the replica leads.

    Every round the leader checks on that connection that it still holds the lock; a failed
    check (the connection broke, the server restarted) is a lost leadership. PostgreSQL
    releases the lock as soon as the leader's session ends, so when its process dies (even
    by SIGKILL: the kernel closes the socket) a follower gets the lock at its next try. TCP
    keepalives are set on both ends of the connection, so a leader cut off by the network is
    noticed in seconds, not hours.
    """

    method = "postgres"

    def __init__(self, url: str | URL, name: str = "gpu-runbook-bot", *,
                 replica: str | None = None, timeout: float = 5.0) -> None:
        self.identity = replica or identity()
        self.name = name
        self.problem: str | None = None
        self._keys = {"a": _LOCK_CLASS, "b": zlib.crc32(name.encode()) & 0x7FFF_FFFF}
        parsed = make_url(url)
        if parsed.drivername == "postgresql":  # psycopg 3, as bot.store.db uses
            parsed = parsed.set(drivername="postgresql+psycopg")
        seconds = max(1, round(timeout))
        self._engine: Engine = create_engine(parsed, poolclass=NullPool, connect_args={
            "application_name": (_APP_PREFIX + self.identity)[:63],
            "connect_timeout": seconds,
            # client side: a dead server or network is noticed within seconds
            "keepalives": 1, "keepalives_idle": seconds, "keepalives_interval": 1,
            "keepalives_count": 3, "tcp_user_timeout": seconds * 2000,
        })
        self._timeout = seconds
        self._conn: Connection | None = None
        self._leading = False
        self._guard = threading.Lock()

    def describe(self) -> str:
        return f"PostgreSQL advisory lock {self.name!r}"

    def campaign(self) -> bool:
        with self._guard:
            try:
                conn = self._connection()
                if self._leading:
                    # Renewal: the session is alive and still holds the lock.
                    held = bool(conn.execute(text(
                        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
                        "AND pid = pg_backend_pid() AND granted AND objsubid = 2 "
                        "AND classid::bigint = :a AND objid::bigint = :b)"), self._keys).scalar())
                    if not held:
                        self._drop()
                        self.problem = "the advisory lock was released on the server"
                        self._leading = False
                        return False
                else:
                    self._leading = bool(conn.execute(
                        text("SELECT pg_try_advisory_lock(:a, :b)"), self._keys).scalar())
            except SQLAlchemyError as exc:
                self._drop()
                self._leading = False
                self.problem = f"PostgreSQL: {_first_line(exc)}"
                return False
            self.problem = None
            return self._leading

    def holder(self) -> str | None:
        try:
            with self._engine.connect() as conn:
                name = conn.execute(text(
                    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a "
                    "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                    "AND l.objsubid = 2 AND l.classid::bigint = :a AND l.objid::bigint = :b "
                    "AND l.database = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database())"), self._keys).scalar()
        except SQLAlchemyError:
            return None
        if not isinstance(name, str):
            return None
        return name.removeprefix(_APP_PREFIX)

    def release(self) -> None:
        with self._guard:
            if self._conn is not None and self._leading:
                with contextlib.suppress(SQLAlchemyError):
                    self._conn.execute(text("SELECT pg_advisory_unlock(:a, :b)"), self._keys)
            self._leading = False
            self._drop()
        self._engine.dispose()

    def _connection(self) -> Connection:
        if self._conn is None:
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            # Server side too: PostgreSQL ends a cut-off leader's session (and so frees the
            # lock) in seconds instead of the OS default of hours.
            for setting, value in (("tcp_keepalives_idle", self._timeout),
                                   ("tcp_keepalives_interval", 1), ("tcp_keepalives_count", 3),
                                   ("tcp_user_timeout", self._timeout * 2000),
                                   ("statement_timeout", self._timeout * 1000)):
                with contextlib.suppress(SQLAlchemyError):
                    conn.execute(text(f"SET {setting} = {int(value)}"))
            self._conn = conn
        return self._conn

    def _drop(self) -> None:
        """Close the election connection; closing ends the session, so the lock goes too."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.invalidate()
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


class KubernetesElector:
    """``method: kubernetes``: a coordination.k8s.io/v1 Lease through
    adapters.kubernetes.leader.LeaseElector, the way client-go elects. A dead leader's Lease
    expires after ``lease_seconds``."""

    method = "kubernetes"

    def __init__(self, backend: Any, name: str, namespace: str, lease_seconds: int, *,
                 replica: str | None = None) -> None:
        from adapters.kubernetes.leader import LeaseElector

        self.identity = replica or identity()
        self.problem: str | None = None
        self._backend = backend
        self._elector = LeaseElector(backend, name, namespace, self.identity, lease_seconds)

    def describe(self) -> str:
        e = self._elector
        return f"Kubernetes Lease {e.namespace}/{e.name} ({e.lease_seconds}s)"

    def campaign(self) -> bool:
        from adapters.kubernetes.backend import KubernetesError

        try:
            leading = self._elector.try_acquire()
        except KubernetesError as exc:
            # As client-go does: a leader keeps leading through API errors until its own
            # lease would have run out (no other replica can have taken it before).
            self.problem = (f"Kubernetes API: {_first_line(exc)} (the service account needs "
                            "get, create and update on coordination.k8s.io leases)")
            return self._elector.is_leader()
        self.problem = None
        return leading

    def holder(self) -> str | None:
        try:
            lease = self._backend.get_lease(self._elector.namespace, self._elector.name)
        except Exception:
            return None
        return None if lease is None else lease.holder

    def release(self) -> None:
        with contextlib.suppress(Exception):
            self._elector.release()


# --- choosing the method ---------------------------------------------------------------


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def choose_method(config: Config) -> str:
    """The method ``auto`` stands for with this configuration (or the one configured):
    ``none`` on SQLite; ``kubernetes`` when running in a cluster (KUBERNETES_SERVICE_HOST)
    with a ``kubernetes`` section; else ``postgres`` on PostgreSQL."""
    wanted = config.leader_election.method
    backend = make_url(config.resolved_database_url()).get_backend_name()
    if wanted != "auto":
        return wanted
    if backend == "sqlite":
        return "none"
    if in_cluster() and config.kubernetes is not None:
        return "kubernetes"
    return "postgres" if backend == "postgresql" else "none"


def lease_namespace(settings: LeaderElectionConfig) -> str:
    if settings.namespace:
        return settings.namespace
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def make_elector(config: Config, kubernetes_backend: Any = None) -> Elector:
    """The elector the configuration asks for (``kubernetes_backend``: the bot's, if any)."""
    settings = config.leader_election
    method = choose_method(config)
    url = config.resolved_database_url()
    if method == "postgres":
        if make_url(url).get_backend_name() != "postgresql":
            raise ConfigError("leader_election.method is postgres but the database is not "
                             "PostgreSQL: set database_url to a PostgreSQL database, or use "
                             "method kubernetes or none")
        return PostgresElector(url, settings.lease_name)
    if method == "kubernetes":
        if kubernetes_backend is None:
            if config.kubernetes is None:
                raise ConfigError("leader_election.method is kubernetes but the configuration "
                                 "has no kubernetes section (how to reach the API)")
            from adapters.kubernetes.client import make_backend

            kubernetes_backend = make_backend(config.kubernetes)
        return KubernetesElector(kubernetes_backend, settings.lease_name,
                                 lease_namespace(settings), settings.lease_seconds)
    if make_url(url).get_backend_name() == "sqlite":
        keep, other = claim_sqlite(url)
        if other is not None:
            logs.liner(__name__, "warning: ", logging.WARNING, sys.stderr)(other)
        return AlwaysLeader(why="SQLite supports one replica", keep=keep)
    return AlwaysLeader()


def claim_sqlite(url: str) -> tuple[IO[str] | None, str | None]:
    """Mark this process as the ``runbook serve`` of a SQLite database (a lock file beside it).

    Returns the open lock file (keep it open while serving) and, when another process
    already serves the database, a warning naming it.
    """
    database = make_url(url).database
    if not database or database == ":memory:":
        return None, None
    path = Path(f"{database}.serve.lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a+")
    except OSError:
        return None, None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        other = handle.read().strip() or "another process"
        handle.close()
        return None, (f"{other} already serves the SQLite database {database}: several "
                      "replicas are not supported on SQLite and would both run executions "
                      "and schedules; use PostgreSQL (database_url) for several replicas")
    handle.seek(0)
    handle.truncate()
    handle.write(f"runbook serve {identity()}\n")
    handle.flush()
    return handle, None


# --- running the leader-only tasks -------------------------------------------------------


def stderr_line(line: str) -> None:
    """A line on stderr; a record once the logs are JSON (kit.logs)."""
    logs.liner(__name__, stream=sys.stderr)(line)


class Leadership:
    """Campaigns every ``retry_seconds``; runs ``tasks`` during each term of leadership.

    A term starts when the elector says this replica leads: every task gets a thread and
    the term's own stop event. It ends when the elector says otherwise (or at shutdown):
    the event is set and the threads are joined for up to ``stop_timeout`` seconds (an
    engine in the middle of a step finishes that step first, then hands its executions
    over). Each change is one line through ``log`` (stderr by default).

    The tasks are the leader-only ones (the engine loop, the scheduler, the chat progress
    poster); every replica answers HTTP (Slack, /alerts, /healthz, /metrics) whoever leads.
    No execution depends on leadership alone for its safety: an engine drives an execution
    only while it holds the execution's lease (bot.execution.engine), so a leader that lost
    its leadership but still runs a step keeps that execution until the step ends, then
    hands it over; a leader that died leaves its executions to the new leader once their
    leases run out (``engine.lease_seconds``). That lease, not the election, dominates
    failover time.
    """

    def __init__(self, elector: Elector, tasks: Sequence[LeaderTask], *,
                 retry_seconds: float = 2.0, stop_timeout: float = 10.0,
                 log: Callable[[str], None] = stderr_line) -> None:
        self.elector = elector
        self.tasks = list(tasks)
        self.retry_seconds = retry_seconds
        self.stop_timeout = stop_timeout
        self.log = log
        self.terms = 0  # terms started, for tests and /healthz
        self.since: float | None = None  # time.time() this replica became leader
        self._term_stop: threading.Event | None = None
        self._threads: list[threading.Thread] = []
        self._leading = False
        self._problem: str | None = None
        self._announced_follower = False
        self._lock = threading.Lock()

    @property
    def is_leader(self) -> bool:
        return self._leading

    def status(self) -> dict[str, Any]:
        """For /healthz: this replica, whether it leads, and who does."""
        leading = self._leading
        return {"leader": leading, "replica": self.elector.identity,
                "election": self.elector.method,
                "leader_replica": self.elector.identity if leading else self.elector.holder(),
                **({"election_problem": self._problem} if self._problem else {})}

    def run(self, stop: threading.Event) -> None:
        """Campaign until ``stop`` is set; then end the term and give the leadership up."""
        try:
            while not stop.is_set():
                self.round()
                stop.wait(self.retry_seconds)
        finally:
            self.close("shutting down")

    def round(self) -> bool:
        """One campaign round and what follows from it; True when this replica leads."""
        with self._lock:
            try:
                leading = self.elector.campaign()
            except Exception as exc:  # an elector bug must cost the leadership, not the loop
                self.elector.problem = f"{type(exc).__name__}: {exc}"
                leading = False
            problem = self.elector.problem
            if problem != self._problem:
                if problem:
                    self.log(f"leader election: {self.elector.identity}: {problem}; "
                             f"trying again every {self.retry_seconds:g}s")
                self._problem = problem
            if leading and not self._leading:
                self._start_term()
            elif not leading and self._leading:
                self._end_term(f"lost the leadership ({problem or 'another replica leads'})")
            elif not leading and not self._announced_follower:
                holder = self.elector.holder()
                self.log(f"leader election: {self.elector.identity} follows "
                         f"({self.elector.describe()}; leader: {holder or 'unknown'})")
                self._announced_follower = True
            return leading

    def close(self, why: str = "shutting down") -> None:
        with self._lock:
            if self._leading:
                self._end_term(f"gives the leadership up ({why})")
            self.elector.release()

    def _start_term(self) -> None:
        self._leading = True
        self._announced_follower = False
        self.terms += 1
        self.since = time.time()
        self._term_stop = threading.Event()
        self._threads = [threading.Thread(target=task.run, args=(self._term_stop,), daemon=True,
                                          name=f"{task.name}-term{self.terms}")
                         for task in self.tasks]
        for thread in self._threads:
            thread.start()
        names = ", ".join(task.name for task in self.tasks) or "nothing"
        self.log(f"leader election: {self.elector.identity} is now the leader "
                 f"({self.elector.describe()}); started: {names}")

    def _end_term(self, why: str) -> None:
        self._leading = False
        self.since = None
        if self._term_stop is not None:
            self._term_stop.set()
        deadline = time.monotonic() + self.stop_timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        busy = [t.name.rsplit("-term", 1)[0] for t in self._threads if t.is_alive()]
        stopped = [task.name for task in self.tasks if task.name not in busy]
        line = (f"leader election: {self.elector.identity} {why}; "
                f"stopped: {', '.join(stopped) or 'nothing'}")
        if busy:
            line += (f"; still finishing: {', '.join(busy)} (an execution in the middle of a "
                     "step keeps its lease until the step ends, then is handed over)")
        self.log(line)
        self._threads = []
        self._term_stop = None
        self._announced_follower = True  # the line above says it; no second line


def _first_line(exc: BaseException) -> str:
    lines = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]


__all__ = ["AlwaysLeader", "Elector", "KubernetesElector", "Leadership", "PostgresElector",
           "choose_method", "identity", "make_elector"]
