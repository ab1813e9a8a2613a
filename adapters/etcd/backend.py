"""Talking to etcd: the ``EtcdBackend`` protocol and its implementation over etcdctl and
etcdutl, run as argument lists (never a shell) with a clean environment.

The password never goes in argv, and a save or restore cut short never leaves a file or a
data directory under the planned name.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from adapters.environment import child_environment
from adapters.etcd.config import EtcdConfig

MARKER = Path("member") / "restored-from.json"
PARTIAL = ".partial"
_ETCDCTL_DEFAULT_DIAL = 2.0
_ETCDCTL_DEFAULT_COMMAND = 5.0


class EtcdError(Exception):
    """etcd or its tools failed; the message says what happened and what to check."""


@dataclass(frozen=True)
class EndpointHealth:
    endpoint: str
    healthy: bool
    error: str | None = None
    took: str | None = None


@dataclass(frozen=True)
class SnapshotStatus:
    path: str
    hash: int
    revision: int
    total_keys: int
    total_size: int
    sha256: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class EtcdBackend(Protocol):
    """One method per operation. ``timeout`` caps the tool's run time, in seconds."""

    def health(self, *, timeout: float | None = None) -> dict[str, EndpointHealth]: ...

    def key_count(self, prefix: str = "", *, timeout: float | None = None) -> int: ...

    def get(self, key: str, *, timeout: float | None = None) -> str | None: ...

    def snapshot_save(self, path: Path, *, timeout: float | None = None) -> str:
        """Write a snapshot of the first healthy endpoint to ``path``; returns that endpoint."""
        ...

    def snapshot_status(self, path: Path, *, timeout: float | None = None) -> SnapshotStatus: ...

    def snapshot_restore(self, snapshot: Path, data_dir: Path, *,
                         timeout: float | None = None) -> SnapshotStatus:
        """Restore into a new ``data_dir`` (refused when it exists and is not empty).

        All or nothing: the snapshot is restored into ``DATA_DIR.partial``, a marker with the
        snapshot's sha256 is written into it (``member/restored-from.json``, where etcd does
        not look), and only then is it renamed to ``DATA_DIR``; so a crash leaves no
        half-restored ``DATA_DIR``, and a repeated restore of the same snapshot is seen."""
        ...

    def restored_from(self, data_dir: Path) -> dict[str, Any] | None:
        """The marker a restore left in ``data_dir``, if any."""
        ...


def _go_duration(value: float) -> str:
    """A flag value in Go's duration syntax, exact (``0.25s``): kit's format_duration is for
    people and rounds."""
    return f"{value:g}s"


def _key_args(key: str) -> list[str]:
    # A key starting with "-" would be read as a flag.
    return ["--", key] if key.startswith("-") else [key]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class EtcdCommands:
    """The argument lists for one configuration (shared by ``plan()`` and the backend), so
    ``plan()`` shows exactly what runs."""

    def __init__(self, config: EtcdConfig,
                 which: Callable[[str], str | None] = shutil.which) -> None:
        self.config = config
        self._which = which

    def connection(self, endpoints: list[str] | None = None) -> list[str]:
        c = self.config
        argv = [f"--endpoints={','.join(endpoints or c.endpoints)}"]
        argv += [f"--{name}={value}" for name, value in
                 (("cacert", c.cacert), ("cert", c.cert), ("key", c.key)) if value]
        # Only when they differ from etcdctl's defaults, so plans read like what people type.
        if c.dial_timeout != _ETCDCTL_DEFAULT_DIAL:
            argv.append(f"--dial-timeout={_go_duration(c.dial_timeout)}")
        if c.command_timeout != _ETCDCTL_DEFAULT_COMMAND:
            argv.append(f"--command-timeout={_go_duration(c.command_timeout)}")
        return argv

    def offline_tool(self) -> str:
        """etcdutl when configured and on PATH, else etcdctl: etcd 3.4 (Debian 12) has no
        etcdutl and saves, inspects and restores snapshots with ``ETCDCTL_API=3 etcdctl``."""
        if self.config.etcdutl and self._which(self.config.etcdutl):
            return self.config.etcdutl
        return self.config.etcdctl

    def health(self) -> list[str]:
        return [self.config.etcdctl, *self.connection(), "endpoint", "health", "-w", "json"]

    def count(self, prefix: str) -> list[str]:
        # 3.4 has no --count-only: the JSON answer's "count" is the number of keys in
        # the range whatever the limit.
        return [self.config.etcdctl, *self.connection(), "get", "--prefix", "--keys-only",
                "--limit=1", "-w", "json", *_key_args(prefix)]

    def get(self, key: str) -> list[str]:
        return [self.config.etcdctl, *self.connection(), "get", "-w", "json", *_key_args(key)]

    def snapshot_save(self, path: Path | str, endpoint: str | None = None) -> list[str]:
        endpoints = [endpoint or self.config.endpoints[0]]
        return [self.config.etcdctl, *self.connection(endpoints), "snapshot", "save", str(path)]

    def snapshot_status(self, path: Path | str) -> list[str]:
        return [self.offline_tool(), "snapshot", "status", str(path), "-w", "json"]

    def snapshot_restore(self, snapshot: Path | str, data_dir: Path | str) -> list[str]:
        try:
            name, cluster, peer_urls = self.config.restore_member()
        except ValueError as exc:
            raise EtcdError(str(exc)) from exc
        argv = [self.offline_tool(), "snapshot", "restore", str(snapshot),
                "--data-dir", str(data_dir), "--name", name, "--initial-cluster", cluster,
                "--initial-advertise-peer-urls", peer_urls]
        if self.config.initial_cluster_token:
            argv += ["--initial-cluster-token", self.config.initial_cluster_token]
        return argv

    def shown(self, argv: list[str]) -> str:
        """The command line as a person would type it."""
        prefix = "ETCDCTL_API=3 " if argv[0] == self.config.etcdctl else ""
        return prefix + shlex.join(argv)

    def env(self, argv: list[str]) -> dict[str, str]:
        """The child's environment: clean, plus what the bot sets for this tool.

        None of an operator's ``ETCDCTL_*`` settings reach the tool (etcdctl exits when such
        a variable and a flag name the same option). etcdctl gets ``ETCDCTL_API=3`` and, with
        ``user``/``password_env`` configured, ``ETCDCTL_USER`` and ``ETCDCTL_PASSWORD`` for
        the commands that talk to etcd: etcdctl reads the password from no file."""
        own: dict[str, str] = {}
        if argv[0] == self.config.etcdctl:
            own["ETCDCTL_API"] = "3"
            options = argv[1:argv.index("--")] if "--" in argv else argv[1:]
            online = any(arg.startswith("--endpoints=") for arg in options)
            if online and self.config.user is not None:
                own["ETCDCTL_USER"] = self.config.user
                own["ETCDCTL_PASSWORD"] = self._password()
        return child_environment(own)

    def _password(self) -> str:
        name = self.config.password_env
        value = os.environ.get(name) if name else None
        if value is None:
            raise EtcdError(f"etcd.password_env names {name}, which is not set in the bot's "
                            "environment")
        return value


def _error_text(stderr: str) -> str:
    """etcdctl's own "Error: ..." lines, else the last lines (3.4 mixes in JSON logs)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line.removeprefix("Error: ") for line in lines if line.startswith("Error:")]
    text = "; ".join(errors) if errors else " | ".join(lines[-3:])
    return text[-2000:] or "no error output"


def _explain(error: str) -> str:
    if "deadline exceeded" in error or "connection refused" in error:
        return f"{error} (no answer: is etcd running and listening there?)"
    return error


class EtcdctlBackend:
    """``EtcdBackend`` over the etcdctl (and etcdutl) command-line tools."""

    def __init__(self, config: EtcdConfig,
                 which: Callable[[str], str | None] = shutil.which) -> None:
        self.config = config
        self.commands = EtcdCommands(config, which)

    def _run(self, argv: list[str], timeout: float | None,
             check: bool = True) -> subprocess.CompletedProcess[str]:
        limit = min(self.config.timeout, timeout) if timeout is not None else self.config.timeout
        shown = self.commands.shown(argv)
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  env=self.commands.env(argv), timeout=max(limit, 0.1),
                                  check=False)
        except FileNotFoundError as exc:
            raise EtcdError(f"{argv[0]} not found: install the etcd client tools "
                            f"(Debian: etcd-client) or configure its path ({shown})") from exc
        except subprocess.TimeoutExpired as exc:
            raise EtcdError(f"{shown}: no result after {limit:g}s") from exc
        if check and done.returncode != 0:
            raise EtcdError(f"{shown} failed (exit {done.returncode}): "
                            f"{_explain(_error_text(done.stderr))}")
        return done

    def health(self, *, timeout: float | None = None) -> dict[str, EndpointHealth]:
        done = self._run(self.commands.health(), timeout, check=False)
        try:
            rows = json.loads(done.stdout)
        except ValueError:
            rows = None
        if not isinstance(rows, list):
            error = _explain(_error_text(done.stderr))
            return {e: EndpointHealth(e, False, error) for e in self.config.endpoints}
        result = {}
        for row in rows:
            endpoint = str(row.get("endpoint", "?"))
            error = row.get("error")
            result[endpoint] = EndpointHealth(endpoint, bool(row.get("health")),
                                              _explain(str(error)) if error else None,
                                              row.get("took"))
        for endpoint in self.config.endpoints:  # fail closed: an endpoint not reported is down
            result.setdefault(endpoint, EndpointHealth(endpoint, False, "not reported"))
        return result

    def key_count(self, prefix: str = "", *, timeout: float | None = None) -> int:
        answer = json.loads(self._run(self.commands.count(prefix), timeout).stdout)
        return int(answer.get("count", 0))

    def get(self, key: str, *, timeout: float | None = None) -> str | None:
        answer = json.loads(self._run(self.commands.get(key), timeout).stdout)
        kvs = answer.get("kvs") or []
        if not kvs:
            return None
        return base64.b64decode(kvs[0].get("value", "")).decode(errors="replace")

    def snapshot_save(self, path: Path, *, timeout: float | None = None) -> str:
        began = time.monotonic()
        health = self.health(timeout=timeout)
        endpoint = next((e for e in self.config.endpoints if health[e].healthy), None)
        if endpoint is None:
            problems = "; ".join(f"{h.endpoint}: {h.error}" for h in health.values())
            raise EtcdError(f"no healthy etcd endpoint to take a snapshot from ({problems}); "
                            "nothing was saved")
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + PARTIAL)
        partial.unlink(missing_ok=True)
        left = None if timeout is None else max(0.1, timeout - (time.monotonic() - began))
        try:
            self._run(self.commands.snapshot_save(partial, endpoint), left)
        except EtcdError:
            partial.unlink(missing_ok=True)
            partial.with_name(partial.name + ".part").unlink(missing_ok=True)  # etcdctl's own
            raise
        partial.replace(path)  # a snapshot cut short never stands at PATH
        return endpoint

    def snapshot_status(self, path: Path, *, timeout: float | None = None) -> SnapshotStatus:
        if not path.is_file():
            raise EtcdError(f"snapshot {path} does not exist")
        answer = json.loads(self._run(self.commands.snapshot_status(path), timeout).stdout)
        return SnapshotStatus(path=str(path), hash=int(answer["hash"]),
                              revision=int(answer["revision"]),
                              total_keys=int(answer["totalKey"]),
                              total_size=int(answer["totalSize"]), sha256=sha256_of(path))

    def snapshot_restore(self, snapshot: Path, data_dir: Path, *,
                         timeout: float | None = None) -> SnapshotStatus:
        if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
            raise EtcdError(f"{data_dir} exists and is not empty: restore into a new data "
                            "directory (nothing was changed)")
        try:
            self.config.restore_member()
        except ValueError as exc:
            raise EtcdError(str(exc)) from exc
        status = self.snapshot_status(snapshot, timeout=timeout)
        partial = data_dir.with_name(data_dir.name + PARTIAL)
        if partial.exists():
            leftovers = {p.name for p in partial.iterdir()} if partial.is_dir() else {"?"}
            if not leftovers <= {"member"}:
                raise EtcdError(f"{partial} exists and was not left by a restore; remove it "
                                "or choose another data directory")
            shutil.rmtree(partial)  # an earlier restore cut short
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._run(self.commands.snapshot_restore(snapshot, partial), timeout)
            marker = {"snapshot": str(snapshot), "sha256": status.sha256,
                      "revision": status.revision, "hash": status.hash,
                      "restored_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            (partial / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        if data_dir.exists():
            data_dir.rmdir()  # empty (checked above); rename needs it gone
        partial.rename(data_dir)
        return status

    def restored_from(self, data_dir: Path) -> dict[str, Any] | None:
        try:
            marker: dict[str, Any] = json.loads((data_dir / MARKER).read_text())
        except (OSError, ValueError):
            return None
        return marker
