"""Rendering deploy/kubernetes overlays with real `kubectl kustomize` (for the deploy tests)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE = REPO / "deploy" / "kubernetes"
OVERLAYS = ["single", "ha"]


def kubectl() -> str:
    """Real kubectl with a kustomize that knows `labels:` and `patches:` (v4 or later).

    Missing, it skips the test with the reason, or fails it in CI (CI must render them)."""
    found = shutil.which("kubectl")
    why = None
    if found is None:
        why = "kubectl is not installed (Debian 12 images ship it; elsewhere kubernetes-client)"
    else:
        out = subprocess.run([found, "version", "--client", "-o", "json"], capture_output=True,
                             text=True, check=False, stdin=subprocess.DEVNULL, timeout=60)
        version = json.loads(out.stdout or "{}").get("kustomizeVersion", "")
        if not re.match(r"v?([4-9]|\d\d)\.", version):
            why = f"{found} has kustomize {version or 'unknown'}; the overlays need v4 or later"
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    assert found is not None
    return found


def render(overlay: str) -> list[dict[str, Any]]:
    """Every object `kubectl kustomize deploy/kubernetes/overlays/OVERLAY` prints."""
    out = subprocess.run([kubectl(), "kustomize", str(KUSTOMIZE / "overlays" / overlay)],
                         capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
                         timeout=60)
    assert out.returncode == 0, f"kubectl kustomize overlays/{overlay} failed:\n{out.stderr}"
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]
