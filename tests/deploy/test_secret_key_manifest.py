"""The shipped Deployment gives every replica the key of secret runbook parameters from one
Secret, optional (without it a runbook with a secret parameter is refused), never inline."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.kustomize import OVERLAYS, render
from tests.deploy.test_manifests import env_of


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_secret_key_comes_from_a_secret(overlay: Any) -> None:
    env = env_of(render(overlay))
    assert env["RUNBOOK_SECRET_KEY"] == {"name": "RUNBOOK_SECRET_KEY", "valueFrom": {
        "secretKeyRef": {"name": "gpu-runbook-bot-secret-key", "key": "key", "optional": True}}}
