"""The lab's OTLP receiver (deploy/lab/otlpsink) as a lab daemon.

- `otlp` (port base +393): `python -m otlpsink` with the project's venv Python (it decodes
  with opentelemetry-proto; `RUNBOOK_LAB_PYTHON` names another), OTLP/HTTP at
  http://127.0.0.1:PORT/v1/logs; every record received is appended as one JSON line to
  $LAB/state/otlp-received.jsonl. Without that Python the lab runs without it.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from .daemons import Daemon, http_status
from .layout import REPO_DIR, Info, Layout, Ports
from .rsyslog import complete_lines

NAME = "otlp"
PYTHON_ENV = "RUNBOOK_LAB_PYTHON"
LAB_DIR = Path(__file__).resolve().parent.parent


@functools.cache
def python() -> str | None:
    """A Python that can import opentelemetry-proto, or None (asked once per process)."""
    chosen = os.environ.get(PYTHON_ENV) or str(REPO_DIR / ".venv" / "bin" / "python")
    if not Path(chosen).exists():
        return None
    probe = subprocess.run([chosen, "-c", "import opentelemetry.proto.logs.v1.logs_pb2"],
                           capture_output=True, stdin=subprocess.DEVNULL, check=False)
    return chosen if probe.returncode == 0 else None


def argv(interpreter: str, port: int, out: Path, log: Path) -> list[str]:
    return [interpreter, "-m", "otlpsink", "--port", str(port), "--out", str(out),
            "--log", str(log)]


def environment() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(LAB_DIR), PYTHONDONTWRITEBYTECODE="1")


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def ready(port: int) -> bool:
    return http_status(f"{url(port)}/_lab/health") == 200


def received_file(layout: Layout) -> Path:
    return layout.state / "otlp-received.jsonl"


def received(path: Path) -> list[dict[str, Any]]:
    """Every record received so far (none when the file does not exist yet)."""
    return [json.loads(line) for line in complete_lines(path)]


def daemon(layout: Layout, ports: Ports) -> Daemon | None:
    interpreter = python()
    if interpreter is None:
        return None
    port = ports.service(NAME)
    return Daemon(name=NAME, argv=argv(interpreter, port, received_file(layout),
                                       layout.log / "otlp.log"),
                  env=environment(), port=port,
                  logs=[layout.log / "otlp.log", layout.log / "otlp.out"],
                  ready=lambda: ready(port))


def info(layout: Layout, ports: Ports) -> Info:
    port = ports.service(NAME)
    return {"endpoint": url(port), "logs_url": f"{url(port)}/v1/logs",
            "received": str(received_file(layout)), "log": str(layout.log / "otlp.log"),
            "running_python": python() is not None}
