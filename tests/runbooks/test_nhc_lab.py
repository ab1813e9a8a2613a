"""Slurm's own node health check on the lab: slurm.conf's HealthCheckProgram is the shipped
deploy/nhc/gpu-health-check, its GPU check the lab's dcgmi judged by the node's `nhc` fault.
`lab fault gpu02 nhc=fail` makes Slurm drain gpu02 with an "NHC:" reason naming the failing
line within its interval; the bot's intake proposes the lab's rule's repair (swap-gpu of the
GPU the reason names) once however often it scans; cleared, NHC lifts its own drain and the
proposal resolves. A person's drain is neither lifted nor erased. A node that boots with a
failing GPU registers drained. swap-gpu, approved for NHC's drain, lifts it once its own
health check passes (slurm.health_check_drains); a person's drain beside it still stays."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from bot.alerts import intake, proposing
from bot.service import Service
from tests.lab.fixture import Lab
from tests.runbooks.test_slurm_runbooks import bot, node, run, swap_in_lab, wait_for_event

pytestmark = pytest.mark.lab
__all__ = ["bot"]  # the fixture, shared with the Slurm runbook tests

HAND = "bob: PSU fan noise, ticket 4411"
NHC = "NHC: gpu-health-check: Page Retirement/Row Remap Fail - GPU: 3"
INTERVAL = 15  # the lab's HealthCheckInterval (deploy/lab/labkit/faults.py)


def until(lab: Lab, name: str, wanted: Callable[[dict[str, Any]], bool],
          seconds: float = 4 * INTERVAL) -> dict[str, Any]:
    """The node once ``wanted`` holds, waiting up to a few of NHC's passes."""
    deadline = time.monotonic() + seconds
    state = node(lab, name)
    while not wanted(state):
        assert time.monotonic() < deadline, f"{name} is still {state}"
        time.sleep(1)
        state = node(lab, name)
    return state


def drained(state: dict[str, Any]) -> bool:
    return "DRAIN" in state["state"]


def back(lab: Lab, *names: str) -> None:
    """Faults first (NHC would drain again), then resumed, then out of drain."""
    for name in names:
        lab.lab("fault", name, "clear")
        lab.run("scontrol", "update", f"NodeName={name}", "State=RESUME")
    for name in names:
        until(lab, name, lambda s: not drained(s) and "REBOOT" not in s["state"])


def test_slurm_drains_the_bot_proposes_and_nhc_lifts(lab: Lab, bot: Service) -> None:
    try:
        lab.lab("fault", "gpu02", "nhc=fail")
        state = until(lab, "gpu02", drained)
        assert state["reason"] == NHC
        [proposal] = intake.scan(bot)
        assert (proposal.runbook, proposal.state) == ("swap-gpu", "open")
        assert proposal.params["node"] == "gpu02" and proposal.params["gpu"] == "3"
        assert proposal.labels["reason"] == state["reason"]
        time.sleep(INTERVAL + 2)  # another pass of NHC: the same drain, no new proposal
        assert node(lab, "gpu02")["reason"] == NHC and intake.scan(bot) == []
        lab.lab("fault", "gpu02", "nhc=pass")
        until(lab, "gpu02", lambda s: not drained(s))  # its own drain, lifted by NHC
        [resolved] = intake.scan(bot)
        assert resolved.id == proposal.id and resolved.alert_status == "resolved"
        assert proposing.get(bot, proposal.id).state == "open"  # a person still decides
    finally:
        back(lab, "gpu02")


def test_a_drain_someone_else_made_is_never_lifted(lab: Lab) -> None:
    try:
        assert lab.run("scontrol", "update", "nodename=gpu03", "state=drain",
                       f"reason={HAND}").returncode == 0
        lab.lab("fault", "gpu03", "nhc=fail")
        joined = until(lab, "gpu03", lambda s: NHC in s["reason"])["reason"]
        assert joined == f"{HAND} ++ {NHC}"
        lab.lab("fault", "gpu03", "nhc=pass")
        state = until(lab, "gpu03", lambda s: s["reason"] != joined)
        assert drained(state) and state["reason"] == HAND  # ours off, theirs kept
    finally:
        back(lab, "gpu03")


def test_a_node_that_boots_with_a_failing_gpu_registers_drained(lab: Lab) -> None:
    booted = lab.run("scontrol", "show", "node", "gpu05", "-o").stdout.split("BootTime=")[1]
    try:
        lab.lab("fault", "gpu05", "nhc=fail")
        assert lab.run("scontrol", "reboot", "gpu05").returncode == 0
        seen = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # every state on the way, until it is back
            done = lab.run("scontrol", "show", "node", "gpu05", "-o").stdout
            seen.append(node(lab, "gpu05"))
            if done.split("BootTime=")[1].split()[0] != booted.split()[0] and seen[-1]["reason"]:
                break
            time.sleep(0.5)
        assert seen[-1] == {"state": "IDLE+DRAIN", "reason": NHC}, seen[-1]
        assert not [s for s in seen if s["state"] in ("IDLE", "MIXED", "ALLOCATED")], seen
        lab.lab("fault", "gpu05", "nhc=pass")  # back once NHC passes (and Slurm pings it)
        until(lab, "gpu05", lambda s: s["state"] == "IDLE" and not s["reason"])
    finally:
        back(lab, "gpu05")


def technician_swaps_and_nhc_passes(lab: Lab) -> Callable[[Service, int], None]:
    """The technician replaces the GPU; NHC's check passes from then on."""
    def answer(bot: Service, execution_id: int) -> None:
        wait_for_event(bot, execution_id, "confirmation_requested")
        swap_in_lab(bot, execution_id)
        lab.lab("fault", "gpu04", "nhc=pass")
        bot.confirm(execution_id, "alice", True, "swapped by the DC technician")

    return answer


def test_swap_gpu_lifts_nhcs_drain_once_its_own_check_passes(lab: Lab, bot: Service) -> None:
    try:
        lab.lab("fault", "gpu04", "nhc=fail")
        assert until(lab, "gpu04", drained)["reason"] == NHC
        ex = run(bot, "swap-gpu", {"node": "gpu04", "gpu": "3", "reason": "NHC: row remap"},
                 during=technician_swaps_and_nhc_passes(lab))
        assert ex.state == "succeeded", ex.error
        [check] = [s for s in ex.plan.steps if s.id == "health-check"]
        assert any(f'a node health check, which this health check answers: "{NHC}"' in line
                   for line in check.operations), check.operations
        assert node(lab, "gpu04")["state"] == "IDLE"
    finally:
        back(lab, "gpu04")


def test_a_persons_drain_beside_nhcs_still_stays(lab: Lab, bot: Service) -> None:
    try:
        assert lab.run("scontrol", "update", "nodename=gpu04", "state=drain",
                       f"reason={HAND}").returncode == 0
        lab.lab("fault", "gpu04", "nhc=fail")
        assert until(lab, "gpu04", lambda s: NHC in s["reason"])["reason"] == f"{HAND} ++ {NHC}"
        lab.lab("fault", "gpu04", "nhc=pass")
        ex = run(bot, "resume-node", {"node": "gpu04"})
        assert ex.state == "failed"
        assert "drained by someone else (not the bot)" in (ex.error or ""), ex.error
        assert HAND in node(lab, "gpu04")["reason"]  # nothing was lifted
    finally:
        back(lab, "gpu04")
