"""Real Prometheus and Alertmanager (Debian's packages) for the adapter tests.

Each test module starts its own daemons in a module-scoped fixture: a temporary folder,
free loopback ports, Prometheus scraping a tiny ``/metrics`` server run here (its values
can be changed by the tests), Alertmanager with gossip off. Daemons run detached (own
session, output to log files) and are stopped by the fixture's finaliser; their log
tails are attached to failing tests (``tests/adapters/conftest.py``).

When the binaries are missing they are installed with apt-get as root (as in CI), else
the tests are skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

PACKAGES = ("prometheus", "prometheus-alertmanager")
TAIL_LINES = 30


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def binaries() -> tuple[str, str]:
    """Paths of prometheus and alertmanager, installing Debian's packages as root if needed."""
    def found() -> tuple[str | None, str | None]:
        return (shutil.which("prometheus"),
                shutil.which("prometheus-alertmanager") or shutil.which("alertmanager"))

    prometheus, alertmanager = found()
    if prometheus and alertmanager:
        return prometheus, alertmanager
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("needs Debian's prometheus and prometheus-alertmanager packages (not "
                    "installed, and not root to install them: apt-get install "
                    "--no-install-recommends prometheus prometheus-alertmanager)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends",
               "-o", "DPkg::Lock::Timeout=300", *PACKAGES]
    done = subprocess.run(install, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=900, check=False)
    if done.returncode != 0:  # an old or missing package list: update once and try again
        subprocess.run(["apt-get", "update", "-q", "-o", "DPkg::Lock::Timeout=300"], env=env,
                       capture_output=True, stdin=subprocess.DEVNULL, timeout=600, check=False)
        done = subprocess.run(install, env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=900, check=False)
    prometheus, alertmanager = found()
    if not (prometheus and alertmanager):
        pytest.fail(f"installing {' '.join(PACKAGES)} failed: {done.stderr[-2000:]}")
    return prometheus, alertmanager


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def http_json(url: str, body: Any = None, method: str | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        raw = response.read()
    return json.loads(raw) if raw.strip() else None


@dataclass
class Daemon:
    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self, cwd: Path) -> Daemon:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def tail(self, lines: int = TAIL_LINES) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            text = ["(no log)"]
        return f"--- {self.name} ({self.log.name}) ---\n" + "\n".join(text)


def wait_for(what: str, check: Callable[[], bool], timeout: float,
             daemons: Sequence[Daemon] = ()) -> None:
    """Poll ``check`` until true; fail with the daemons' log tails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        dead = [d for d in daemons if not d.alive()]
        if dead or time.monotonic() > deadline:
            why = f"{', '.join(d.name for d in dead)} exited" if dead else f"{timeout:g}s passed"
            raise RuntimeError(f"{what}: not reached ({why})\n"
                               + "\n".join(d.tail() for d in daemons))
        time.sleep(0.05)


class MetricsServer:
    """A stdlib HTTP server answering ``/metrics`` with gauges the tests can change."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.scrapes = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = owner.render().encode()
                with owner._lock:
                    owner.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def set(self, metric: str, labels: dict[str, str], value: float) -> None:
        with self._lock:
            self._values[(metric, tuple(sorted(labels.items())))] = value

    def render(self) -> str:
        def escaped(value: str) -> str:  # the exposition format's own escaping
            return value.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")

        with self._lock:
            items = sorted(self._values.items())
        lines, typed = [], set()
        for (metric, labels), value in items:
            if metric not in typed:
                lines.append(f"# TYPE {metric} gauge")
                typed.add(metric)
            inner = ",".join(f'{k}="{escaped(v)}"' for k, v in labels)
            lines.append(f"{metric}{{{inner}}} {value!r}")
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Monitoring:
    """Daemons started for one test module; ``stop()`` stops them all."""

    dir: Path
    daemons: list[Daemon] = field(default_factory=list)
    metrics: MetricsServer | None = None
    prometheus_url: str = ""
    alertmanager_url: str = ""

    def log_tails(self) -> str:
        return "\n".join(d.tail() for d in self.daemons)

    def stop(self) -> None:
        for daemon in self.daemons:
            daemon.stop()
        if self.metrics is not None:
            self.metrics.stop()


def start_prometheus(folder: Path, binary: str, targets: list[str],
                     rules: str | None = None, name: str = "prometheus") -> tuple[Daemon, str]:
    """A Prometheus on a free loopback port scraping ``targets`` every second; ready."""
    folder.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                              "scrape_configs": []}
    if targets:
        config["scrape_configs"].append({"job_name": "dcgm",
                                         "static_configs": [{"targets": targets}]})
    if rules is not None:
        (folder / "rules.yml").write_text(rules)
        config["rule_files"] = [str(folder / "rules.yml")]
    (folder / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    daemon = Daemon(name, [binary, f"--config.file={folder / 'prometheus.yml'}",
                           f"--storage.tsdb.path={folder / 'data'}",
                           f"--web.listen-address=127.0.0.1:{port}"],
                    folder / f"{name}.log").start(folder)
    try:
        wait_for(f"{name} ready at {url}", lambda: http_get(f"{url}/-/ready")[0] == 200, 30,
                 [daemon])
    except BaseException:
        daemon.stop()
        raise
    return daemon, url


def start_alertmanager(folder: Path, binary: str) -> tuple[Daemon, str]:
    """An Alertmanager (gossip off) with one receiver that sends nothing; ready."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "alertmanager.yml").write_text(json.dumps({
        "route": {"receiver": "null", "group_wait": "1s"},
        "receivers": [{"name": "null"}]}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    daemon = Daemon("alertmanager", [binary, f"--config.file={folder / 'alertmanager.yml'}",
                                     f"--storage.path={folder / 'data'}",
                                     f"--web.listen-address=127.0.0.1:{port}",
                                     "--cluster.listen-address="],
                    folder / "alertmanager.log").start(folder)
    try:
        wait_for(f"alertmanager ready at {url}",
                 lambda: http_get(f"{url}/-/ready")[0] == 200, 30, [daemon])
    except BaseException:
        daemon.stop()
        raise
    return daemon, url
