"""``runbook node`` against the lab's real Slurm, fake Kubernetes API and Prometheus: the
quick command (bot.surfaces.nodeparts: no full bot built) shows what a full bot's node view
shows, for a node both pools know."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from bot.config import load_config
from bot.service import Service
from bot.surfaces import nodeview
from tests.lab.fixture import Lab

pytestmark = pytest.mark.lab


def steady(view: dict[str, Any]) -> dict[str, Any]:
    """The view without the GPU readings, which the exporter changes between scrapes."""
    return {**view, "gpus": {gpu: values.get("driver") for gpu, values in view["gpus"].items()}}


def test_the_quick_command_shows_what_a_full_bot_shows(lab: Lab) -> None:
    done = subprocess.run([sys.executable, "-m", "bot", "node", "gpu05", "gpu01", "--json"],
                          env=lab.env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    quick = [steady(view) for view in json.loads(done.stdout)]
    bot = Service.from_config(load_config(lab.env["RUNBOOK_CONFIG"]))
    full = [steady(json.loads(json.dumps(view.__dict__, default=str)))
            for view in nodeview.build(bot, ["gpu05", "gpu01"])]
    assert quick == full
    assert quick[0]["slurm"]["gpus_total"] == 8 and quick[0]["kubernetes"]["ready"]
    assert len(quick[0]["gpus"]) == 8 and quick[0]["pools"] == ["slurm", "kubernetes"]
