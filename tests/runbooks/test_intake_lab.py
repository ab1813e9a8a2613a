"""The shipped NHC-compatible health check (deploy/nhc/gpu-health-check) on real Slurm, run on
a lab node as slurmd runs a HealthCheckProgram (SLURMD_NODENAME set), with the lab's dcgmi as
its GPU check: `lab fault gpu02 health=fail` makes it drain gpu02 with an "NHC:" reason naming
the failing line; the bot's intake then proposes the lab's rule's repair (swap-gpu of the GPU
the reason names), once however often it scans; cleared, the script lifts its own drain and
the proposal resolves. A drain it did not make (a person's) is neither lifted nor erased:
its reason joins after theirs and comes off again."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bot.alerts import intake, proposing
from bot.service import Service
from tests.lab.fixture import Lab
from tests.runbooks.test_slurm_runbooks import bot, node, resume_everything

pytestmark = pytest.mark.lab
__all__ = ["bot"]  # the fixture, shared with the Slurm runbook tests

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "nhc" / "gpu-health-check"
HAND = "bob: PSU fan noise, ticket 4411"


def health_check(lab: Lab, name: str) -> subprocess.CompletedProcess[str]:
    """The script as slurmd runs it on ``name``."""
    env = {**lab.env, "SLURMD_NODENAME": name, "CONFIG": "/nonexistent",
           "GPU_CHECK": f"{lab['bin_dir']}/dcgmi diag -r 1"}  # scontrol: the lab's PATH
    return subprocess.run(["/bin/sh", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_nhc_drains_the_bot_proposes_and_nhc_lifts(lab: Lab, bot: Service) -> None:
    try:
        lab.lab("fault", "gpu02", "health=fail")
        done = health_check(lab, "gpu02")
        assert done.returncode == 0, done.stderr
        state = node(lab, "gpu02")
        assert "DRAIN" in state["state"]
        assert state["reason"].startswith("NHC: gpu-health-check: Page Retirement/Row Remap "
                                          "Fail - GPU: 3"), state["reason"]
        [proposal] = intake.scan(bot)
        assert (proposal.runbook, proposal.state) == ("swap-gpu", "open")
        assert proposal.params["node"] == "gpu02" and proposal.params["gpu"] == "3"
        assert proposal.labels["reason"] == state["reason"]
        assert health_check(lab, "gpu02").returncode == 0  # runs again: the same drain
        assert intake.scan(bot) == []
        lab.lab("fault", "gpu02", "clear")
        assert health_check(lab, "gpu02").returncode == 0
        assert "DRAIN" not in node(lab, "gpu02")["state"]  # its own drain, lifted
        [resolved] = intake.scan(bot)
        assert resolved.id == proposal.id and resolved.alert_status == "resolved"
        assert proposing.get(bot, proposal.id).state == "open"  # a person still decides
    finally:
        lab.lab("fault", "gpu02", "clear")
        resume_everything(lab, "gpu02")


def test_a_drain_someone_else_made_is_never_lifted(lab: Lab) -> None:
    try:
        assert lab.run("scontrol", "update", "nodename=gpu03", "state=drain",
                       f"reason={HAND}").returncode == 0
        assert health_check(lab, "gpu03").returncode == 0  # healthy: nothing to do
        assert node(lab, "gpu03")["reason"] == HAND
        lab.lab("fault", "gpu03", "health=fail")
        assert health_check(lab, "gpu03").returncode == 0
        joined = node(lab, "gpu03")["reason"]
        assert joined.startswith(f"{HAND} ++ NHC: gpu-health-check: "), joined
        lab.lab("fault", "gpu03", "clear")
        assert health_check(lab, "gpu03").returncode == 0
        state = node(lab, "gpu03")
        assert "DRAIN" in state["state"] and state["reason"] == HAND  # ours off, theirs kept
    finally:
        lab.lab("fault", "gpu03", "clear")
        resume_everything(lab, "gpu03")
