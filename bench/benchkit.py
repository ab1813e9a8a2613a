"""What every benchmark shares: its results file (bench/results/<script>.json, the final JSON
plus the machine it ran on, with no hostname or path), cleanup on SIGTERM/SIGHUP (turned
into SystemExit, so try/finally blocks run as they do on Ctrl-C) and a lab of its own.

Scripts import it as ``benchkit`` (bench/ is on sys.path when a script runs).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
LAB = Path(__file__).resolve().parent.parent / "deploy" / "lab" / "lab"


def _first_match(path: Path, pattern: str) -> str | None:
    try:
        found = re.search(pattern, path.read_text(errors="replace"), re.MULTILINE)
    except OSError:
        return None
    return found.group(1).strip() if found else None


def _slurm_version() -> str | None:
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        out = subprocess.run([scontrol, "--version"], capture_output=True, text=True,
                             timeout=10, check=False, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.strip().removeprefix("slurm ").strip() or None


def machine() -> dict[str, Any]:
    """The machine a figure was measured on: hardware and versions, nothing that names it."""
    kib = _first_match(Path("/proc/meminfo"), r"^MemTotal:\s+(\d+) kB")
    return {
        "cpu_model": _first_match(Path("/proc/cpuinfo"), r"^model name\s*:\s*(.+)$")
        or platform.processor() or None,
        "cores": os.cpu_count(),
        "ram_gib": round(int(kib) / 1024 / 1024, 1) if kib else None,
        "os": _first_match(Path("/etc/os-release"), r'^PRETTY_NAME="?([^"\n]+)"?$')
        or platform.system(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "slurm": _slurm_version(),
        # the machine is shared (two cores here): how busy it was when the run ended
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_results(script: str, figures: dict[str, Any], folder: Path = RESULTS) -> Path:
    """Write ``figures`` (the JSON line a benchmark prints last) and the machine to
    ``folder/<script>.json``; ``script`` is the benchmark's name, like ``slurm_drain``."""
    if not re.fullmatch(r"[a-z0-9_]+", script):
        raise ValueError(f"not a benchmark name: {script!r}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{script}.json"
    document = {"bench": script, "machine": machine(), "results": figures}
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return path


def finish(script: str, figures: dict[str, Any], folder: Path = RESULTS) -> None:
    """The end of a benchmark: its results file, then its JSON as the last line printed. A
    run that failed (``figures["error"]``) prints its JSON but keeps the last good file."""
    if "error" not in figures:
        path = write_results(script, figures, folder)
        print(f"results: bench/results/{path.name}")
    print(json.dumps(figures), flush=True)


def failed(figures: dict[str, Any], exc: BaseException) -> None:
    """Note in the figures why the run stopped (then the caller re-raises)."""
    figures["error"] = f"{type(exc).__name__}: {exc}"[:500]


def _exit_on(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def cleanup_on_signals() -> None:
    """SIGTERM and SIGHUP raise SystemExit (SIGINT already raises KeyboardInterrupt), so a
    benchmark stopped by `timeout`, a closed terminal or Ctrl-C runs its finally blocks."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _exit_on)


def lab(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``deploy/lab/lab ARGS`` in ``env`` (its RUNBOOK_LAB_DIR names the lab)."""
    return subprocess.run([str(LAB), *args], env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=900, check=False)


@contextmanager
def own_lab(prefix: str, *up_args: str,
            keep: bool = False) -> Iterator[tuple[Path, dict[str, str], dict[str, Any]]]:
    """A lab of the benchmark's own in a new temporary folder (``lab up UP_ARGS``): yields
    the folder, its clients' environment and its lab.json. It is stopped and the folder
    removed at the end, on failure too, unless ``keep``."""
    from tests.lab.fixture import client_env  # the repository root is on sys.path by now

    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o711)  # a 24.11/26.05 lab's slurmrestd runs as `slurm`: it must get through
    env = dict(os.environ, RUNBOOK_LAB_DIR=str(folder / "lab"))
    env.pop("SLURM_JWT", None)  # a developer's token is not the lab's
    try:
        up = lab(env, "up", *up_args)
        if up.returncode != 0:
            raise RuntimeError(f"lab up failed ({up.returncode}): "
                               f"{(up.stdout + up.stderr)[-3000:]}")
        info = json.loads((folder / "lab" / "lab.json").read_text())
        yield folder, client_env(info, env), info
    finally:
        if not keep:
            down = lab(env, "down")
            print(f"lab down: exit {down.returncode}")
            shutil.rmtree(folder, ignore_errors=True)
