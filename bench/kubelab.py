"""A throw-away lab Kubernetes API for the Kubernetes benchmarks: the lab's own server
(``python3 -m kubeapi`` from deploy/lab) on a free loopback port, its state, request log
(``--audit-log``: one JSON line per request, with its user agent) and a kubeconfig in a
temporary folder; raw JSON requests for the set-up; the fleet's workload with its
PodDisruptionBudgets; a count of the requests in the log."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

LAB = Path(__file__).resolve().parent.parent / "deploy" / "lab"
SETUP_AGENT = "grb-bench-setup"  # the set-up's requests, told apart in the request log
NAMESPACE = "default"
SEED_RS = "/apis/apps/v1/namespaces/serving/replicasets/inference-7d9f8c6b5d"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Api:
    """Raw JSON requests on one kept-alive connection, for the set-up."""

    def __init__(self, url: str) -> None:
        self.conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=30)

    def __call__(self, method: str, path: str, body: Any = None,
                 ctype: str = "application/json", ok: tuple[int, ...] = ()) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        self.conn.request(method, path, body=data, headers={
            "Content-Type": ctype, "User-Agent": SETUP_AGENT, "Authorization": "Bearer x"})
        response = self.conn.getresponse()
        payload = response.read()
        if response.status >= 300 and response.status not in ok:
            raise RuntimeError(f"{method} {path}: {response.status} {payload[:300]!r}")
        return json.loads(payload or b"null")


class KubeLab:
    """The server process and its folder; ``stop`` ends it (the caller removes the folder)."""

    def __init__(self, folder: Path, nodes: list[str], pod_grace: float) -> None:
        self.folder = folder
        self.audit_log = folder / "requests.jsonl"
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with (folder / "kubeapi.out").open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kubeapi", "--port", str(port), "--state",
                 str(folder / "state.json"), "--faults", str(folder / "faults"), "--log",
                 str(folder / "kubeapi.log"), "--audit-log", str(self.audit_log),
                 "--nodes", ",".join(nodes), "--pod-ready", "0.1",
                 "--pod-grace", str(pod_grace)],
                cwd=LAB, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        self.kubeconfig = folder / "kubeconfig"
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "bench",
            "clusters": [{"name": "bench", "cluster": {"server": self.url}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
            "users": [{"name": "bench", "user": {"token": "bench"}}]}))

    def wait_up(self, seconds: float = 120) -> Api:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"kubeapi exited {self.process.returncode}: "
                                   + (self.folder / "kubeapi.out").read_text()[-2000:])
            try:
                urllib.request.urlopen(self.url + "/version", timeout=1).read()
                return Api(self.url)
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"kubeapi did not answer within {seconds:.0f} s")

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def requests(self, since: int = 0, where: Callable[[dict[str, Any]], bool] = bool,
                 ) -> tuple[list[dict[str, Any]], int]:
        """Request log entries after byte ``since`` that ``where`` keeps; and the new end."""
        with self.audit_log.open("rb") as log:
            log.seek(since)
            data = log.read()
        entries = [json.loads(line) for line in data.splitlines() if line.strip()]
        return [e for e in entries if where(e)], since + len(data)


def is_daemonset_pod(pod: dict[str, Any]) -> bool:
    return any(o.get("kind") == "DaemonSet" for o in pod["metadata"].get("ownerReferences") or [])


def workload_pods(api: Api, nodes: set[str]) -> dict[str, int]:
    """Pods a drain must evict (not DaemonSet's, not already going), per node."""
    have = dict.fromkeys(nodes, 0)
    for pod in api("GET", "/api/v1/pods")["items"]:
        node = pod["spec"].get("nodeName")
        if node in have and not pod["metadata"].get("deletionTimestamp") and \
                not is_daemonset_pod(pod):
            have[node] += 1
    return have
