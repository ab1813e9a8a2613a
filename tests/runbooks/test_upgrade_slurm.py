"""upgrade-slurm against the lab's real Slurm (the lab's installs check the version and
restart the daemon, `lab slurm-install`): over every node with a canary, a job running on
a node through its slurmd's restart; slurmctld's install failing (the documented stop: no
later stage, nothing rolled back); a cancel while slurmdbd is being installed."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.config import EngineConfig, load_config
from bot.execution.executions import Execution
from bot.service import Service
from bot.store import audit
from tests.lab.fixture import Lab
from tests.runbooks.test_slurm_runbooks import run as run_runbook

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def bot(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    config = load_config(lab.dir / "bot.yaml")
    config = config.model_copy(update={
        "database_url": f"sqlite:///{tmp_path_factory.mktemp('upgrade-slurm') / 'bot.db'}",
        "engine": EngineConfig(lease_seconds=10, poll_seconds=0.1),
    })
    yield Service.from_config(config)


def run(bot: Service, params: dict[str, str],
        during: Callable[[Service, int], None] | None = None) -> Execution:
    """Request as alice, approved by carol and dave, driven to the end."""
    return run_runbook(bot, "upgrade-slurm", params, approvers=("carol", "dave"), during=during)


def events(bot: Service, execution_id: int) -> list[dict[str, Any]]:
    with bot.db.connect() as conn:
        return list(audit.events(conn, execution_id=execution_id))


def steps(bot: Service, execution_id: int, kind: str) -> list[str]:
    return [e["data"]["step"] for e in events(bot, execution_id) if e["kind"] == kind]


def version(lab: Lab) -> str:
    return lab.run("sinfo", "--version").stdout.split()[-1]


def slurmd_starts(lab: Lab) -> dict[str, str]:
    starts = {}
    for line in lab.run("scontrol", "show", "node", "-o").stdout.splitlines():
        fields = dict(part.split("=", 1) for part in line.split() if "=" in part)
        starts[fields["NodeName"]] = fields.get("SlurmdStartTime", "")
    return starts


def pid(lab: Lab, daemon: str) -> str:
    return lab.lab("service", daemon, "status").stdout.strip()


def params(lab: Lab, tmp_path: Path, **more: str) -> dict[str, str]:
    return {"version": version(lab), "backup": str(tmp_path / "acct.sql"),
            "state_copy": str(tmp_path / "statesave"), "step_timeout": "60s", **more}


def test_upgrade_every_node_canary_first_a_running_job_survives(lab: Lab, bot: Service,
                                                                tmp_path: Path) -> None:
    job = lab.run("sbatch", "--parsable", "-o", "/dev/null", "-w", "gpu02", "-N1",
                  "-J", "through-the-upgrade", "--wrap", "sleep 30").stdout.strip()
    try:
        deadline = time.monotonic() + 20
        while "RUNNING" not in lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout:
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.2)
        before = slurmd_starts(lab)
        ex = run(bot, params(lab, tmp_path, canary="gpu03"))
        assert ex.state == "succeeded", ex.error
        after = slurmd_starts(lab)
        assert set(after) == set(before) and all(after[n] != before[n] for n in before), after
        finished = {e["data"]["step"]: e["data"] for e in events(bot, ex.id)
                    if e["kind"] == "step_finished"}
        assert list(finished) == ["window", "backup", "slurmdbd", "state-save-copy",
                                  "slurmctld", "slurmd"]
        assert finished["slurmd"]["details"]["nodes"][0] == "gpu03"  # the canary, alone first
        assert (tmp_path / "acct.sql").stat().st_size > 0
        assert (tmp_path / "statesave" / "node_state").is_file()
        state = lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
        assert state == "RUNNING", f"job {job} after the slurmd restarts: {state or 'gone'}"
    finally:
        lab.run("scancel", job)


def test_a_failed_slurmctld_install_stops_the_upgrade(lab: Lab, bot: Service,
                                                      tmp_path: Path) -> None:
    before, controller = slurmd_starts(lab), pid(lab, "slurmctld")
    assert lab.lab("fault", "slurmctld", "install=fail").returncode == 0
    try:
        ex = run(bot, params(lab, tmp_path, canary="gpu01"))
    finally:
        lab.lab("fault", "slurmctld", "clear")
    error = ex.error or ""
    assert ex.state == "failed"
    assert error.startswith("step slurmctld failed: slurmctld failed: ")
    assert "(lab fault install=fail)" in error
    assert ("Done before it: the accounting database backup, slurmdbd, the state save copy; "
            "not started: slurmd. Nothing is rolled back") in error
    assert "completed steps left as they are (on_failure: leave). state now: " in error
    assert "slurmd" not in steps(bot, ex.id, "step_started")
    assert pid(lab, "slurmctld") == controller and slurmd_starts(lab) == before


def test_a_cancel_during_the_slurmdbd_stage(lab: Lab, bot: Service, tmp_path: Path) -> None:
    """The install is slow here (2 s before the lab's): the cancel comes while it runs; the
    step stops once it returns and no later stage starts."""
    assert bot.config.slurm is not None
    commands = dict(bot.config.slurm.upgrade.commands)
    install = commands["slurmdbd-install"]
    commands["slurmdbd-install"] = install.model_copy(update={"argv": [
        sys.executable, "-c", "import subprocess, sys, time; time.sleep(2); "
        "sys.exit(subprocess.run(sys.argv[1:]).returncode)", *install.argv]})
    upgrade = bot.config.slurm.upgrade.model_copy(update={"commands": commands})
    slow = Service.from_config(bot.config.model_copy(update={
        "slurm": bot.config.slurm.model_copy(update={"upgrade": upgrade})}))
    controller = pid(lab, "slurmctld")

    def cancel_during_install(bot: Service, execution_id: int) -> None:
        deadline = time.monotonic() + 30
        while "slurmdbd" not in steps(bot, execution_id, "step_started"):
            assert time.monotonic() < deadline, "the slurmdbd stage never started"
            time.sleep(0.1)
        bot.cancel(execution_id, "alice")

    ex = run(slow, params(lab, tmp_path), during=cancel_during_install)
    assert ex.state == "cancelled", ex.error
    assert steps(slow, ex.id, "step_started") == ["window", "backup", "slurmdbd"]
    assert pid(lab, "slurmctld") == controller
    assert lab.run("sacctmgr", "-n", "list", "account").returncode == 0  # slurmdbd is back


def test_an_upgrade_past_the_window_is_refused_when_planned(lab: Lab, bot: Service,
                                                            tmp_path: Path) -> None:
    """22.05 to 26.05 is seven releases: refused at the request, before any approval, with
    the daemons' versions read then; nothing is requested, dumped or installed."""
    before = {daemon: pid(lab, daemon) for daemon in ("slurmdbd", "slurmctld")}
    def executions() -> int:
        with bot.db.connect() as conn:
            return len([e for e in audit.events(conn) if e["execution_id"] is not None])

    executions_before = executions()
    with pytest.raises(Exception, match=r"the version window refuses this upgrade: slurmdbd "
                                        r"runs 22\.05\.\d+, 7 releases behind 26\.05\.5"):
        bot.request("upgrade-slurm", params(lab, tmp_path, version="26.05.5"), "alice")
    assert executions() == executions_before
    assert {daemon: pid(lab, daemon) for daemon in before} == before
    assert not (tmp_path / "acct.sql").exists()
