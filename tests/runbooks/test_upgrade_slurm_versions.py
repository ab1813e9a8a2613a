"""upgrade-slurm across releases in labs of their own started at Slurm 24.11: to 26.05.5 with a
job running through it (the accounting database converted by slurmdbd 26.05 first, then
slurmctld, then slurmd canary and batches); a failed slurmctld install stopping the rest in a
mixed cluster, and the same run finishing once the cause is fixed (`lab slurm-install`)."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.config import EngineConfig, load_config
from bot.execution.executions import Execution
from bot.service import Service
from tests.lab.fixture import Lab, lab_command, lab_log_tails, start_lab
from tests.lab.test_lab_versions import need_a_root
from tests.runbooks.test_slurm_runbooks import events
from tests.runbooks.test_slurm_runbooks import run as run_runbook

pytestmark = pytest.mark.ownlab  # its own folder and ports: runs beside the shared lab
TARGET = "26.05.5"
PROBE_ACCOUNT = "upgrade-probe"  # made at 24.11: sacctmgr must still read it at 26.05


@pytest.fixture
def lab24() -> Iterator[Lab]:
    need_a_root("24.11")
    need_a_root("26.05")
    folder = tempfile.mkdtemp(prefix="grb-u-")  # short: unix socket paths stay < 108 bytes
    env = dict(os.environ, RUNBOOK_LAB_DIR=folder)
    env.pop("RUNBOOK_LAB_PORT_BASE", None)
    try:
        lab = start_lab(env, "--slurm", "24.11", "--no-install")
        yield lab
        # `lab down` misses a slurmstepd that outlived its slurmd (its environ, where the
        # lab's marker was, holds its process title): end the jobs first
        lab.lab("reset")
    finally:
        lab_command("down", "--purge", env=env)


@pytest.fixture
def bot(lab24: Lab, tmp_path: Path) -> Service:
    config = load_config(lab24.dir / "bot.yaml")  # slurm.bin_dir: the lab's 24.11 clients
    return Service.from_config(config.model_copy(update={
        "database_url": f"sqlite:///{tmp_path / 'bot.db'}",
        "engine": EngineConfig(lease_seconds=10, poll_seconds=0.1)}))


def upgrade(bot: Service, tmp_path: Path, **more: str) -> Execution:
    params = {"version": TARGET, "backup": str(tmp_path / "acct.sql"),
              "state_copy": str(tmp_path / "statesave"), "step_timeout": "120s", **more}
    return run_runbook(bot, "upgrade-slurm", params, approvers=("carol", "dave"))


def fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


def versions(lab: Lab) -> dict[str, str]:
    """What each daemon itself reports."""
    dbd = lab.run("sacctmgr", "-n", "show", "configuration").stdout
    ctld = lab.run("scontrol", "show", "config").stdout
    seen = {"slurmdbd": dbd.split("SLURMDBD_VERSION", 1)[-1].split("=", 1)[-1].split()[0],
            "slurmctld": ctld.split("SLURM_VERSION", 1)[-1].split("=", 1)[-1].split()[0]}
    for line in lab.run("scontrol", "show", "node", "-o").stdout.splitlines():
        node = fields(line)
        if node["NodeName"] in lab["slurmd_nodes"]:
            seen[node["NodeName"]] = node.get("Version", "")
    return seen


def accounting_before(lab: Lab) -> str:
    """An account and association made at 24.11, and a finished job in the history."""
    added = lab.run("sacctmgr", "-i", "add", "account", PROBE_ACCOUNT, "Cluster=grblab",
                    "Description=before-the-upgrade", "Organization=lab")
    assert added.returncode == 0, added.stdout + added.stderr
    added = lab.run("sacctmgr", "-i", "add", "user", "root", f"Account={PROBE_ACCOUNT}",
                    "Cluster=grblab")
    assert added.returncode == 0, added.stdout + added.stderr
    done = lab.run("sbatch", "--parsable", "--wait", "-o", "/dev/null", "-w",
                   lab["slurmd_nodes"][0], "--wrap", "true")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def job_table_keys(lab: Lab) -> set[str]:
    """The indexes of the job table in the real accounting database (26.05 adds `sluid`)."""
    done = lab.run("mariadb", "--no-defaults", f"--socket={lab['mariadb']['socket']}", "-u",
                   "root", "-N", "-B", "-e", "SHOW INDEX FROM grblab_job_table",
                   lab["mariadb"]["database"])
    assert done.returncode == 0, done.stderr
    return {line.split("\t")[2] for line in done.stdout.splitlines()}


def sleeping_job(lab: Lab, node: str) -> str:
    job = lab.run("sbatch", "--parsable", "-o", "/dev/null", "-w", node, "-N1",
                  "-J", "across-the-upgrade", "--wrap", "sleep 600").stdout.strip()
    deadline = time.monotonic() + 30
    while job_state(lab, job) != "RUNNING":
        assert time.monotonic() < deadline, f"job {job} never started: {job_state(lab, job)}"
        time.sleep(0.2)
    return job


def job_state(lab: Lab, job: str) -> str:
    return lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()


def finished_steps(bot: Service, ex: Execution) -> dict[str, dict[str, Any]]:
    return {e["data"]["step"]: e["data"] for e in events(bot, ex.id)
            if e["kind"] == "step_finished"}


def dbd_started_before_ctld(lab: Lab) -> bool:
    def started(log: str) -> str:
        lines = (lab.dir / "log" / log).read_text().splitlines()
        return next(line[:25] for line in lines if f"version {TARGET} started" in line)
    return started("slurmdbd.log") < started("slurmctld.log")


def test_upgrade_24_11_to_26_05_with_a_job_running(lab24: Lab, bot: Service,
                                                   tmp_path: Path) -> None:
    lab = lab24
    history_job = accounting_before(lab)
    assert "sluid" not in job_table_keys(lab)
    job = sleeping_job(lab, "gpu02")
    assert "DBD Agent queue size: 0" in lab.run("sdiag").stdout  # the runbook checks it after
    began = time.monotonic()
    ex = upgrade(bot, tmp_path, canary="gpu03")  # max_parallel above 1 needs break-glass
    took = time.monotonic() - began
    assert ex.state == "succeeded", f"{ex.error}\n{lab_log_tails(lab)}"
    checks = {e["data"]["check"]: e["data"]["passed"] for e in events(bot, ex.id)
              if e["kind"] == "check_evaluated"}
    assert checks == {"slurmdbd answers before we start": True,
                      "slurmctld's queue to slurmdbd is empty before slurmdbd stops": True,
                      "sacctmgr lists the accounts": True,
                      "slurmctld's queue to slurmdbd is empty": True}, checks
    finished = finished_steps(bot, ex)
    assert list(finished) == ["window", "backup", "slurmdbd", "state-save-copy", "slurmctld",
                              "slurmd"], finished
    assert finished["slurmd"]["details"]["nodes"] == ["gpu03", "gpu01", "gpu02", "gpu04",
                                                      "gpu05"]  # canary alone, then 1 by 1
    assert dbd_started_before_ctld(lab)
    assert "sluid" in job_table_keys(lab)  # slurmdbd 26.05 converted the real database
    assert (tmp_path / "acct.sql").stat().st_size > 0
    assert (tmp_path / "statesave" / "node_state").is_file()
    assert set(versions(lab).values()) == {TARGET}, versions(lab)
    lab.reload()
    assert set(lab["slurm_daemons"].values()) == {TARGET} and lab["slurm_version"] == TARGET
    assert job_state(lab, job) == "RUNNING", f"job {job} after the upgrade"
    assoc = lab.run("sacctmgr", "-n", "-P", "show", "assoc", f"account={PROBE_ACCOUNT}",
                    "format=account,user").stdout.split()
    assert f"{PROBE_ACCOUNT}|root" in assoc, assoc
    history = lab.run("sacct", "-n", "-X", "-P", "-j", history_job, "-o", "jobid,state")
    assert history.stdout.split() == [f"{history_job}|COMPLETED"], history.stdout + history.stderr
    assert "DBD Agent queue size: 0" in lab.run("sdiag").stdout
    print(f"upgrade-slurm 24.11.5 -> {TARGET}: {took:.1f}s")
    lab.run("scancel", job)


def test_a_failed_slurmctld_install_stops_the_rest_then_a_rerun_finishes(
        lab24: Lab, bot: Service, tmp_path: Path) -> None:
    lab = lab24
    job = sleeping_job(lab, "gpu01")
    assert lab.lab("fault", "slurmctld", "install=fail").returncode == 0
    ex = upgrade(bot, tmp_path, canary="gpu01")
    error = ex.error or ""
    assert ex.state == "failed"
    assert error.startswith("step slurmctld failed: slurmctld failed: "), error
    assert "(lab fault install=fail)" in error
    assert ("Done before it: the accounting database backup, slurmdbd, the state save copy; "
            "not started: slurmd. Nothing is rolled back (Slurm does not downgrade): fix the "
            "cause and run upgrade-slurm again") in error
    assert "slurmd" not in finished_steps(bot, ex)
    mixed = versions(lab)
    assert mixed.pop("slurmdbd") == TARGET and set(mixed.values()) == {"24.11.5"}, mixed
    status = {line.split()[0]: line.split()[-1] for line in lab.lab("status").stdout.splitlines()
              if line.startswith("  slurm") and "running" in line}
    assert (status["slurmdbd"], status["slurmctld"]) == (TARGET, "24.11.5"), status
    downgrade = lab.lab("slurm-install", "slurmdbd", "24.11.5")
    assert downgrade.returncode == 1 and "downgrade" in downgrade.stderr
    assert lab.lab("fault", "slurmctld", "clear").returncode == 0
    again = upgrade(bot, tmp_path, canary="gpu01")
    assert again.state == "succeeded", f"{again.error}\n{lab_log_tails(lab)}"
    assert set(versions(lab).values()) == {TARGET}, versions(lab)
    assert job_state(lab, job) == "RUNNING"
    lab.run("scancel", job)
    # How to go back: the dump taken first (restore-slurmdbd) and the state save copy. The
    # error says only "Nothing is rolled back (Slurm does not downgrade): fix the cause and
    # run upgrade-slurm again" (adapters/slurm/slurm_upgrade.py stage_error).
    assert str(tmp_path / "acct.sql") in error and "restore-slurmdbd" in error, (
        f"the failed run's error does not say how to go back: {error}")
