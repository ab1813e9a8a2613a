"""The lab's daemons: how each starts and how we know it is ready."""
from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import procs, roots
from .layout import (
    ACCOUNT,
    CAPPED_QOS,
    CAPPED_QOS_GPUS,
    CLUSTER,
    QOS,
    SECOND_ACCOUNT,
    LabError,
    Layout,
    Ports,
)
from .render import MARIADB_DATABASE, MARIADB_PASSWORD, MARIADB_USER

READY_TIMEOUT = float(os.environ.get("RUNBOOK_LAB_TIMEOUT", "60"))
REST_VERSIONS = ["v0.0.38", "v0.0.39", "v0.0.40", "v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44",
                 "v0.0.45"]
TOKEN_LIFESPAN = 7 * 24 * 3600
# Compact sinfo states of a registered node; a trailing * means not responding.


def responding(state: str | None) -> bool:
    """A registered slurmd: any state without the not-responding `*` (after a reboot or a
    slurmctld restart a node may also show comp, boot, plnd ...), but not unknown or down."""
    return bool(state) and "*" not in str(state) and not str(state).startswith(("unk", "down"))


@dataclass
class Daemon:
    name: str
    argv: list[str]
    port: int | None
    logs: list[Path]
    ready: Callable[[], bool]
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[[], None] | None = None


def slurm_env(layout: Layout) -> dict[str, str]:
    env = dict(os.environ, SLURM_CONF=str(layout.slurm_conf))
    env.pop("SLURM_JWT", None)  # would switch clients from munge to JWT auth
    if roots.current(layout):  # the root's clients: $LAB/bin/scontrol ... (labkit/roots.py)
        env["PATH"] = f"{layout.bin}{os.pathsep}{env.get('PATH', os.defpath)}"
    return env


def run(argv: list[str], env: dict[str, str] | None = None,
        timeout: float = 20) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=timeout, check=False,
        )
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out: {exc}")


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def log_tails(logs: list[Path], lines: int = 30) -> str:
    parts = [f"--- {p} ---\n{tail(p, lines)}" for p in logs if p.exists()]
    return "\n".join(parts) or "(no log output)"


def wait_for(check: Callable[[], bool], what: str, logs: list[Path],
             timeout: float = READY_TIMEOUT, pid: int | None = None) -> None:
    """Poll `check` until true; fail early if the daemon died, with log tails."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while time.monotonic() < deadline:
        if check():
            return
        if pid is not None and not procs._alive(pid):
            raise LabError(f"{what} exited during start-up\n{log_tails(logs)}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    raise LabError(f"{what} not ready after {timeout:g}s\n{log_tails(logs)}")


# --- munge ---------------------------------------------------------------

def munge(layout: Layout) -> Daemon:
    key = layout.etc / "munge.key"

    def prepare() -> None:
        if not key.exists():
            key.touch(mode=0o600)
            key.write_bytes(os.urandom(1024))

    def ready() -> bool:
        return run(["munge", "-n", "-S", str(layout.munge_socket)]).returncode == 0

    return Daemon(
        name="munge",
        argv=["munged", "--foreground", "--force", "--num-threads=2",
              f"--socket={layout.munge_socket}", f"--key-file={key}",
              f"--pid-file={layout.run}/munged.pid", f"--log-file={layout.log}/munged.log",
              f"--seed-file={layout.state}/munged.seed"],
        port=None, logs=[layout.log / "munged.log", layout.log / "munge.out"],
        ready=ready, prepare=prepare,
    )


# --- MariaDB ---------------------------------------------------------------

def mariadb_client(layout: Layout, sql: str) -> subprocess.CompletedProcess[str]:
    return run(["mariadb", "--no-defaults", f"--socket={layout.mariadb_socket}",
                "-u", "root", "-e", sql])


def mariadb(layout: Layout, ports: Ports) -> Daemon:
    logs = [layout.log / "mariadb.log", layout.log / "mariadb.out"]

    def prepare() -> None:
        if (layout.mysql / "mysql").is_dir():
            return
        result = run(["mariadb-install-db", "--no-defaults", "--user=root",
                      f"--datadir={layout.mysql}", "--auth-root-authentication-method=socket",
                      "--skip-test-db"], timeout=120)
        if result.returncode != 0:
            raise LabError(f"mariadb-install-db failed:\n{result.stdout}\n{result.stderr}")

    def ready() -> bool:
        return run(["mariadb-admin", "--no-defaults", f"--socket={layout.mariadb_socket}",
                    "-u", "root", "ping"]).returncode == 0

    return Daemon(
        name="mariadb",
        # --user=root: mariadbd refuses root otherwise; the lab owns all files.
        argv=["mariadbd", "--no-defaults", "--user=root", f"--datadir={layout.mysql}",
              f"--socket={layout.mariadb_socket}", f"--port={ports.service('mariadb')}",
              "--bind-address=127.0.0.1", "--skip-name-resolve",
              f"--pid-file={layout.run}/mariadb.pid", f"--log-error={logs[0]}",
              "--innodb-buffer-pool-size=32M", "--innodb-lock-wait-timeout=900",
              # Throw-away data: skip fsyncs, which make slurmdbd's table
              # creation take seconds.
              "--innodb-flush-log-at-trx-commit=0", "--innodb-doublewrite=0",
              "--innodb-flush-method=nosync",
              "--performance-schema=OFF"],
        port=ports.service("mariadb"), logs=logs, ready=ready, prepare=prepare,
    )


def grant_slurm_user(layout: Layout) -> None:
    sql = (
        f"CREATE DATABASE IF NOT EXISTS {MARIADB_DATABASE};"
        f"CREATE USER IF NOT EXISTS '{MARIADB_USER}'@'127.0.0.1' "
        f"IDENTIFIED BY '{MARIADB_PASSWORD}';"
        f"GRANT ALL ON {MARIADB_DATABASE}.* TO '{MARIADB_USER}'@'127.0.0.1';"
    )
    result = mariadb_client(layout, sql)
    if result.returncode != 0:
        raise LabError(f"MariaDB setup failed: {result.stderr.strip()}")


# --- Slurm ---------------------------------------------------------------

def slurmdbd(layout: Layout, ports: Ports) -> Daemon:
    env = slurm_env(layout)

    def ready() -> bool:
        return run(["sacctmgr", "-n", "-P", "list", "cluster"], env=env).returncode == 0

    return Daemon(
        name="slurmdbd", argv=roots.daemon_argv(layout, ["slurmdbd", "-D"], "slurmdbd"),
        env=env, port=ports.service("slurmdbd"),
        logs=[layout.log / "slurmdbd.log", layout.log / "slurmdbd.out"], ready=ready,
    )


def ensure_accounting(layout: Layout) -> None:
    """Cluster, account, QOS and root's association; each only when missing.

    Two lists and one batched sacctmgr: every sacctmgr call costs ~0.2 s and
    every add ~0.5 s (slurmdbd creates tables), so a fresh lab pays once."""
    env = slurm_env(layout)
    assoc = run(["sacctmgr", "-n", "-P", "list", "assoc", "format=cluster,account,user"], env=env)
    qos = run(["sacctmgr", "-n", "-P", "list", "qos", "format=name"], env=env)
    if assoc.returncode != 0 or qos.returncode != 0:
        raise LabError(f"sacctmgr list failed: {assoc.stderr}{qos.stderr}")
    rows = {tuple(line.split("|")) for line in assoc.stdout.splitlines()}
    commands = []
    if not any(row[0] == CLUSTER for row in rows):
        commands.append(f"add cluster {CLUSTER}")
    if not any(row[1] == ACCOUNT for row in rows):
        commands.append(f"add account {ACCOUNT} Description=lab-gpu-research "
                        f"Organization=lab Cluster={CLUSTER}")
    if QOS not in qos.stdout.split():
        commands.append(f"add qos {QOS} Priority=10")
    if (CLUSTER, ACCOUNT, "root") not in rows:
        commands.append(f"add user root Account={ACCOUNT} Cluster={CLUSTER} QOS=normal,{QOS}")
    _sacctmgr_adds(env, commands)


def _sacctmgr_adds(env: dict[str, str], commands: list[str]) -> None:
    """sacctmgr reads commands from stdin: one process for all adds."""
    if not commands:
        return
    result = subprocess.run(["sacctmgr", "-i"], input="\n".join(commands) + "\n", env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise LabError(f"sacctmgr failed ({'; '.join(commands)}):\n{result.stdout}{result.stderr}")


def ensure_fairshare_accounting(layout: Layout) -> None:
    """fairshare-review's second account and its QOS with a GPU limit, when missing. After
    slurmctld: a fresh slurmdbd knows the gres/gpu TRES only once slurmctld registered it
    (AccountingStorageTRES), and refuses a GrpTRES on it before."""
    env = slurm_env(layout)
    tres = ["sacctmgr", "-n", "-P", "list", "tres", "format=type,name"]
    wait_for(lambda: "gres|gpu" in run(tres, env=env).stdout.split(),
             "the gres/gpu TRES in slurmdbd (slurmctld registers it)",
             [layout.log / "slurmctld.log"])
    assoc = run(["sacctmgr", "-n", "-P", "list", "assoc", "format=cluster,account,user"], env=env)
    qos = run(["sacctmgr", "-n", "-P", "list", "qos", "format=name"], env=env)
    if assoc.returncode != 0 or qos.returncode != 0:
        raise LabError(f"sacctmgr list failed: {assoc.stderr}{qos.stderr}")
    rows = {tuple(line.split("|")) for line in assoc.stdout.splitlines()}
    _sacctmgr_adds(env, _fairshare_accounting(rows, qos.stdout.split()))


def _fairshare_accounting(rows: set[tuple[str, ...]], qos: list[str]) -> list[str]:
    commands = []
    if not any(row[1] == SECOND_ACCOUNT for row in rows):
        commands.append(f"add account {SECOND_ACCOUNT} Description=lab-vision "
                        f"Organization=lab Cluster={CLUSTER}")
    if CAPPED_QOS not in qos:
        commands.append(f"add qos {CAPPED_QOS} Priority=5 GrpTRES=gres/gpu={CAPPED_QOS_GPUS}")
    if (CLUSTER, SECOND_ACCOUNT, "root") not in rows:
        commands.append(f"add user root Account={SECOND_ACCOUNT} Cluster={CLUSTER} "
                        f"QOS=normal,{CAPPED_QOS}")
    return commands


def slurmctld(layout: Layout, ports: Ports) -> Daemon:
    env = slurm_env(layout)

    def ready() -> bool:
        return "UP" in run(["scontrol", "ping"], env=env).stdout

    return Daemon(
        name="slurmctld", argv=roots.daemon_argv(layout, ["slurmctld", "-D"], "slurmctld"),
        env=env, port=ports.service("slurmctld"),
        logs=[layout.log / "slurmctld.log", layout.log / "slurmctld.out"], ready=ready,
    )


def node_states(layout: Layout) -> dict[str, str]:
    """node -> compact sinfo state (idle, idle*, down*, drain, ...)."""
    out = run(["sinfo", "-h", "-N", "-o", "%N %t"], env=slurm_env(layout)).stdout
    return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)


def slurmd(layout: Layout, ports: Ports, node: str, index: int) -> Daemon:
    env = slurm_env(layout)

    def ready() -> bool:
        return responding(node_states(layout).get(node))

    return Daemon(
        name=f"slurmd-{node}", argv=roots.daemon_argv(layout, ["slurmd", "-D", "-N", node],
                                                    f"slurmd-{node}"),
        env=env,
        port=ports.slurmd(index),
        logs=[layout.log / f"slurmd-{node}.log", layout.log / f"slurmd-{node}.out"],
        ready=ready,
    )


def slurmrestd(layout: Layout, ports: Ports) -> Daemon:
    port = ports.service("slurmrestd")
    env = slurm_env(layout)
    # Root is refused unless the user check is off; SLURM_JWT=daemon makes it
    # accept the X-SLURM-USER-TOKEN header.
    env.update(SLURM_JWT="daemon", SLURMRESTD_SECURITY="disable_user_check")
    argv = ["slurmrestd", "-a", "rest_auth/jwt", f"127.0.0.1:{port}"]
    if roots.current(layout):  # 26.05 refuses root even with the check off: the root's
        # `slurm` user (from its packages) once the socket is open
        env.pop("SLURMRESTD_SECURITY")
        argv[1:1] = ["-u", "slurm", "-g", "slurm"]

    def ready() -> bool:
        return http_status(f"http://127.0.0.1:{port}/openapi") is not None

    return Daemon(
        name="slurmrestd",
        argv=roots.daemon_argv(layout, argv, "slurmrestd"),
        env=env, port=port,
        logs=[layout.log / "slurmrestd.out"], ready=ready,
    )


def http_status(url: str, headers: dict[str, str] | None = None) -> int | None:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


def make_token(layout: Layout) -> tuple[str, int]:
    result = run(["scontrol", "token", "username=root", f"lifespan={TOKEN_LIFESPAN}"],
                 env=slurm_env(layout))
    token = result.stdout.strip().partition("SLURM_JWT=")[2]
    if result.returncode != 0 or not token:
        raise LabError(f"scontrol token failed: {result.stdout}{result.stderr}")
    return token, int(time.time()) + TOKEN_LIFESPAN


def rest_api_version(url: str, token: str) -> str:
    """The first openapi version whose ping answers 200 (22.05: v0.0.38)."""
    headers = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token}
    for version in REST_VERSIONS:
        if http_status(f"{url}/slurm/{version}/ping", headers) == 200:
            return version
    raise LabError(f"slurmrestd at {url} answers no known API version {REST_VERSIONS}")


def launch(layout: Layout, daemon: Daemon) -> tuple[int, bool]:
    """Spawn a daemon unless it already runs. Returns (pid, started)."""
    pid = procs.running_pid(layout, daemon.name)
    if pid is not None:
        return pid, False
    if daemon.prepare:
        daemon.prepare()
    return procs.spawn(layout, daemon.name, daemon.argv, daemon.env or dict(os.environ)), True


def start(layout: Layout, daemon: Daemon) -> bool:
    """Start one daemon unless it runs; wait until ready. True if started."""
    pid, started = launch(layout, daemon)
    wait_for(daemon.ready, daemon.name, daemon.logs, pid=pid)
    return started
