"""A throw-away PostgreSQL server from Debian's packages, for the store's tests.

Used when RUNBOOK_TEST_PG_URL names no server. PostgreSQL refuses to run as
root, so as root the data folder belongs to the ``postgres`` user and the
server runs under ``runuser``.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


class PostgresMissing(Exception):
    """No PostgreSQL server binaries are installed."""


@dataclass
class PostgresServer:
    url: str  # postgresql://postgres@127.0.0.1:PORT/postgres
    data: Path | None = None
    bindir: Path | None = None

    def stop(self) -> None:
        if self.data is None or self.bindir is None:
            return
        _as_postgres([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                      "-w", "stop"], check=False)
        shutil.rmtree(self.data.parent, ignore_errors=True)


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise PostgresMissing("PostgreSQL server binaries are missing "
                              "(apt-get install postgresql)")
    return Path(found[-1]).parent


def _as_postgres(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    if os.geteuid() == 0:
        argv = ["runuser", "-u", "postgres", "--", *argv]
    return subprocess.run(argv, check=check, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start() -> PostgresServer:
    configured = os.environ.get("RUNBOOK_TEST_PG_URL")
    if configured:
        return PostgresServer(url=configured)
    bindir = _bindir()
    top = Path(tempfile.mkdtemp(prefix="grb-pg-"))
    data = top / "data"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(top, "postgres")
        shutil.chown(data, "postgres")
    _as_postgres([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"])
    port = _free_port()
    done = _as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-o",
                         f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off",
                         "-l", str(top / "server.log"), "-w", "start"], check=False)
    if done.returncode != 0:
        log = (top / "server.log").read_text() if (top / "server.log").exists() else ""
        raise RuntimeError(f"PostgreSQL did not start: {done.stderr}\n{log[-2000:]}")
    return PostgresServer(url=f"postgresql://postgres@127.0.0.1:{port}/postgres", data=data,
                          bindir=bindir)


def fresh_database(server_url: str, name: str) -> str:
    """Create an empty database on the server; returns its URL."""
    import psycopg

    with psycopg.connect(server_url.replace("postgresql://", "postgresql://", 1),
                         autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return server_url.rsplit("/", 1)[0] + f"/{name}"
