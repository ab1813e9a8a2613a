"""Deployment tests: the container image, the kustomize manifests, and the RBAC audit.

Tests marked ``rbac_audit`` judge the requests the whole session sent to the lab's Kubernetes
API, so they run after every other test of the session, wherever they were collected.
"""

from __future__ import annotations

import time

import pytest

# When this session began collecting: the RBAC audit reads only the requests sent since.
SESSION_STARTED = time.time()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    audits = [item for item in items if item.get_closest_marker("rbac_audit")]
    if audits:
        items[:] = [item for item in items if item not in audits] + audits
