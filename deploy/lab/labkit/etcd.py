"""The lab's etcd: one real member (Debian's etcd-server, 3.4) on loopback.

Client port = port base +5, peer port = +6, member name `grblab`, so a snapshot restored
with `--name grblab --initial-cluster grblab=<peer url> --initial-advertise-peer-urls
<peer url>` starts as this member. The data directory in use is kept in
`$LAB/etcd/current` (default `$LAB/etcd/data`): `lab etcd-switch DIR` points the member at
another directory (a restored snapshot) and every later start uses it.

Readiness is `etcdctl endpoint health` (API 3). A member started on a data directory
without a `member/` folder is new: once healthy it gets the seed keys (SEED_KEYS), so
restore tests can check that known keys are back.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from . import procs
from .daemons import Daemon, run, start
from .layout import Info, LabError, Layout, Ports

NAME = "etcd"
MEMBER = "grblab"
SEED_KEYS = {f"/registry/grblab/config/{k}": v for k, v in
             (("a", "alpha"), ("b", "bravo"), ("c", "charlie"), ("d", "delta"), ("e", "echo"))}


def root(layout: Layout) -> Path:
    return layout.root / "etcd"


def default_data_dir(layout: Layout) -> Path:
    return root(layout) / "data"


def _choice_file(layout: Layout) -> Path:
    return root(layout) / "current"


def _seed_flag(layout: Layout) -> Path:
    return root(layout) / "seed-pending"


def data_dir(layout: Layout) -> Path:
    """The data directory the member runs on (`lab etcd-switch` changes it)."""
    try:
        chosen = _choice_file(layout).read_text().strip()
    except OSError:
        chosen = ""
    return Path(chosen) if chosen else default_data_dir(layout)


def choose(layout: Layout, path: Path) -> None:
    root(layout).mkdir(parents=True, exist_ok=True)
    tmp = _choice_file(layout).with_suffix(".tmp")
    tmp.write_text(f"{path}\n")
    tmp.replace(_choice_file(layout))


def client_url(ports: Ports) -> str:
    return f"http://127.0.0.1:{ports.service('etcd')}"


def peer_url(ports: Ports) -> str:
    return f"http://127.0.0.1:{ports.service('etcd_peer')}"


def clean_env() -> dict[str, str]:
    """Our environment without ETCD_*/ETCDCTL_* settings: etcd and etcdctl exit when an
    environment variable and a flag name the same option (`lab env` exports
    ETCDCTL_ENDPOINTS, and we pass --endpoints)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "ETCDCTL_"))}
    env["ETCDCTL_API"] = "3"
    return env


def etcdctl(ports: Ports, *args: str, timeout: float = 10) -> tuple[int, str]:
    result = run(["etcdctl", f"--endpoints={client_url(ports)}", *args], env=clean_env(),
                 timeout=timeout)
    return result.returncode, (result.stdout + result.stderr).strip()


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def healthy(ports: Ports) -> bool:
    # etcdctl waits out its whole timeout on a closed port: probe the port first.
    if not listening(ports.service("etcd")):
        return False
    return etcdctl(ports, "endpoint", "health", "--dial-timeout=1s", "--command-timeout=2s",
                   timeout=5)[0] == 0


def seed(ports: Ports) -> None:
    for key, value in SEED_KEYS.items():
        code, out = etcdctl(ports, "put", key, value)
        if code != 0:
            raise LabError(f"etcd: seeding {key} failed: {out}")


def daemon(layout: Layout, ports: Ports) -> Daemon:
    data = data_dir(layout)
    logs = [layout.log / "etcd.out"]

    def prepare() -> None:
        root(layout).mkdir(parents=True, exist_ok=True)
        if not (data / "member").is_dir():
            _seed_flag(layout).touch()  # a new member: seed it once it is healthy

    def ready() -> bool:
        if not healthy(ports):
            return False
        if _seed_flag(layout).exists():
            seed(ports)
            _seed_flag(layout).unlink()
        return True

    return Daemon(
        name=NAME,
        argv=["etcd", "--name", MEMBER, "--data-dir", str(data),
              "--listen-client-urls", client_url(ports),
              "--advertise-client-urls", client_url(ports),
              "--listen-peer-urls", peer_url(ports),
              "--initial-advertise-peer-urls", peer_url(ports),
              "--initial-cluster", f"{MEMBER}={peer_url(ports)}",
              "--initial-cluster-state", "new",
              # One member on loopback: elect itself in ~0.3 s after a restart, not ~1.5 s.
              "--heartbeat-interval", "25", "--election-timeout", "250",
              "--logger", "zap", "--log-outputs", "stderr"],
        env=clean_env(), port=ports.service("etcd"), logs=logs, ready=ready, prepare=prepare,
    )


def info(layout: Layout, ports: Ports) -> Info:
    return {
        "endpoint": client_url(ports), "data_dir": str(data_dir(layout)),
        "default_data_dir": str(default_data_dir(layout)), "name": MEMBER,
        "client_port": ports.service("etcd"), "peer_port": ports.service("etcd_peer"),
        "peer_url": peer_url(ports), "initial_cluster": f"{MEMBER}={peer_url(ports)}",
        "seed_keys": dict(SEED_KEYS), "log": str(layout.log / "etcd.out"),
    }


def check_switchable(path: Path) -> None:
    """A directory etcd would start as this member; anything else would come up empty."""
    if not (path / "member" / "snap").is_dir():
        raise LabError(f"{path} holds no etcd member (no member/snap): restore a snapshot "
                       "into it first (etcdctl snapshot restore ... --data-dir "
                       f"{path} --name {MEMBER} ...)")


def switch(layout: Layout, ports: Ports, path: Path) -> tuple[Path, float]:
    """Stop the member, point it at `path`, start it and wait until healthy.

    When it does not come up, the previous directory is put back (and started) and the
    error names both. Returns (previous directory, seconds taken)."""
    began = time.monotonic()
    path = path.resolve()
    check_switchable(path)
    previous = data_dir(layout)
    procs.stop(layout, [NAME])
    choose(layout, path)
    try:
        start(layout, daemon(layout, ports))
    except LabError as exc:
        procs.stop(layout, [NAME])
        choose(layout, previous)
        try:
            start(layout, daemon(layout, ports))
        except LabError as again:
            raise LabError(f"etcd did not start on {path}: {exc}\nand not on {previous} "
                           f"either: {again}") from exc
        raise LabError(f"etcd did not start on {path}; back on {previous}: {exc}") from exc
    return previous, time.monotonic() - began
