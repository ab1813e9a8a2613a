"""swap-gpu's evidence on the lab: the GPU's UUID and serial as DCGM reported them before the
swap, and as nvidia-smi reads them on the node afterwards (cross-checked with DCGM), with
`lab swap NODE GPU` standing in for the technician. A swap that happened passes and both
readings are in the step's result and the audit log; a "yes" with the old GPU still in
leaves the node drained, naming the GPU that was not replaced."""

from __future__ import annotations

from typing import Any

import pytest

from bot.service import Service
from tests.lab.fixture import Lab
from tests.runbooks.test_slurm_runbooks import (
    bot,
    confirm_when_asked,
    events,
    node,
    resume_everything,
    run,
)

pytestmark = pytest.mark.lab
__all__ = ["bot"]  # the fixture, shared with the Slurm runbook tests


def identity(lab: Lab, name: str, gpu: int) -> dict[str, str]:
    """GPU ``gpu`` of ``name`` as the lab's nvidia-smi reads it on the node."""
    done = lab.run("srun", "-w", name, "-N1", "-n1", f"{lab['bin_dir']}/nvidia-smi",
                   "--query-gpu=index,serial,uuid", "--format=csv,noheader", "-i", str(gpu))
    index, serial, uuid = (f.strip() for f in done.stdout.strip().split(","))
    assert index == str(gpu), done.stdout
    return {"uuid": uuid, "serial": serial}


def evidence(bot: Service, execution_id: int) -> Any:
    finished = [e["data"] for e in events(bot, execution_id)
                if e["kind"] == "step_finished" and e["data"]["step"] == "health-check"]
    return finished[0]["details"]["swap_evidence"]


def test_a_swapped_gpu_passes_with_both_readings_in_the_audit_log(lab: Lab,
                                                                   bot: Service) -> None:
    old = identity(lab, "gpu03", 2)
    try:
        ex = run(bot, "swap-gpu", {"node": "gpu03", "gpu": "2", "reason": "XID 79"},
                 during=confirm_when_asked())
        assert ex.state == "succeeded", ex.error
        new = identity(lab, "gpu03", 2)
        assert new["uuid"] != old["uuid"] and new["serial"] != old["serial"]
        found = evidence(bot, ex.id)
        assert found["before"] == [old] and found["after"] == new and new in found["dcgm"]
        assert node(lab, "gpu03")["state"] == "IDLE"
    finally:
        resume_everything(lab, "gpu03")


def test_the_old_gpu_still_in_leaves_the_node_drained(lab: Lab, bot: Service) -> None:
    old = identity(lab, "gpu04", 1)
    try:
        ex = run(bot, "swap-gpu", {"node": "gpu04", "gpu": "1", "reason": "XID 79"},
                 during=confirm_when_asked(swap=False))
        assert ex.state == "failed"
        state = node(lab, "gpu04")
        assert "DRAIN" in state["state"]
        assert state["reason"].startswith(f"GPU swap: GPU 1 still reports UUID {old['uuid']}")
        assert state["reason"].endswith(f"(execution {ex.id}: failed check)")
        assert "it was not replaced" in (ex.error or "")
    finally:
        resume_everything(lab, "gpu04")
