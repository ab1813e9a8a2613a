"""Start detached daemons and stop them again, by pid files we own."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from .layout import MARKER_ENV, Layout


def pid_file(layout: Layout, name: str) -> Path:
    return layout.pids / f"{name}.pid"


def _alive(pid: int) -> bool:
    """True for a live process; zombies count as dead (pid 1 may not reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _ours(pid: int, layout: Layout) -> bool:
    """The pid carries our marker, so a recycled pid is never signalled."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER_ENV}={layout.root}".encode() in environ.split(b"\0")


def running_pid(layout: Layout, name: str) -> int | None:
    try:
        pid = int(pid_file(layout, name).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) and _ours(pid, layout) else None


def spawn(layout: Layout, name: str, argv: list[str], env: dict[str, str]) -> int:
    """Run argv in its own session, detached from our stdio, and record its pid."""
    out = layout.log / f"{name}.out"
    with open(out, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**env, MARKER_ENV: str(layout.root)},
            start_new_session=True,
            close_fds=True,
            cwd=layout.root,
        )
    pid_file(layout, name).write_text(f"{proc.pid}\n")
    # Let the Popen object go without a ResourceWarning: the daemon outlives us.
    proc.returncode = 0
    return proc.pid


def stop(layout: Layout, names: list[str], timeout: float = 15.0) -> None:
    """SIGTERM every named daemon, wait, then SIGKILL the stragglers."""
    pids = {n: p for n in names if (p := running_pid(layout, n))}
    for pid in pids.values():
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids.values():
        if _alive(pid):
            _signal(pid, signal.SIGKILL)
    for name in names:
        pid_file(layout, name).unlink(missing_ok=True)


def sweep(layout: Layout, timeout: float = 5.0) -> list[int]:
    """Kill leftovers that carry our marker (e.g. slurmstepd of a running job)."""
    me = os.getpid()
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    ours = [p for p in pids if p != me and _alive(p) and _ours(p, layout)]
    for pid in ours:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in ours) and time.monotonic() < deadline:
        time.sleep(0.05)
    return ours


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
