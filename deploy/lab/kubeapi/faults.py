"""The API's own lab fault, `lab fault kube api=500|hang|ok`, read from $LAB/faults/kube.json.

Checked on every request, so it re-reads the file only when its mtime changes."""
from __future__ import annotations

import json
import threading
from pathlib import Path

FAULT_NODE = "kube"  # the pseudo-node name `lab fault` uses for the API server
MODES = {"ok", "500", "hang"}


class FaultSwitch:
    def __init__(self, faults_dir: Path | None) -> None:
        self.path = faults_dir / f"{FAULT_NODE}.json" if faults_dir else None
        self._stamp: tuple[int, int, int] | None = None
        self._mode = "ok"
        self._lock = threading.Lock()

    def mode(self) -> str:
        if self.path is None:
            return "ok"
        try:
            st = self.path.stat()
        except OSError:
            return "ok"
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)  # `lab fault` replaces the file
        with self._lock:
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    value = str(json.loads(self.path.read_text()).get("api", "ok"))
                except (OSError, ValueError):
                    value = "ok"
                self._mode = value if value in MODES else "ok"
            return self._mode


def node_faults(faults_dir: Path | None, node: str) -> dict[str, str]:
    if faults_dir is None:
        return {}
    try:
        data = json.loads((faults_dir / f"{node}.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record_driver(faults_dir: Path | None, node: str, version: str) -> None:
    """Write the node's driver into its lab fault file, as `lab-driver-install` does."""
    if faults_dir is None:
        return
    data = node_faults(faults_dir, node) | {"driver": version, "node": node}
    faults_dir.mkdir(parents=True, exist_ok=True)
    tmp = faults_dir / f".{node}.json.kubeapi"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(faults_dir / f"{node}.json")
