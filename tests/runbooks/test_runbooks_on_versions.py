"""The shipped Slurm runbooks on Slurm 24.11 and 26.05, one lab of each release in a folder of
its own for this module (one after the other): drain-node then resume-node, drain-nodes then
resume-nodes, open- then close-maintenance, reset-gpu's reboot path (`reset=fail`) and
restore-slurmdbd, asserting what the 22.05 tests (test_slurm_runbooks.py...) assert."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.slurm.config import SlurmConfig
from bot.service import Service
from tests.lab.fixture import Lab, version_lab
from tests.lab.kubehelp import wait_until
from tests.runbooks.test_monitoring_path import prometheus_sees
from tests.runbooks.test_reset_gpu import reset_details
from tests.runbooks.test_slurm_runbooks import bot, node, reservations, resume_everything, run

pytestmark = pytest.mark.ownlab  # its own folders and ports: runs beside the shared lab
RELEASES = ["24.11", "26.05"]
__all__ = ["bot"]  # the fixture, on this module's lab


@pytest.fixture(scope="module", params=RELEASES)
def lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    with version_lab(request.param, prefix="grb-rv-") as handle:
        assert handle["slurm"]["version"] == request.param
        # resume-node's and reset-gpu's GPU gate reads DCGM in Prometheus: a lab just up has
        # not scraped yet (its targets come ~5 s after it starts)
        wait_until(lambda: all(prometheus_sees(handle, f'count(DCGM_FI_DEV_GPU_TEMP{{Hostname='
                                                    f'"{name}"}}) == 8')
                               for name in handle["slurmd_nodes"]),
                   "Prometheus to hold every Slurm node's GPUs", timeout=60, every=0.5)
        yield handle
        handle.lab("reset")  # ends the jobs first: `lab down` misses an orphaned slurmstepd


def test_drain_node_then_resume_node(lab: Lab, bot: Service) -> None:
    try:
        ex = run(bot, "drain-node", {"node": "gpu01", "reason": "XID 79 on GPU 3"})
        assert ex.state == "succeeded", ex.error
        state = node(lab, "gpu01")
        assert "DRAIN" in state["state"]
        assert state["reason"] == f"XID 79 on GPU 3 (execution {ex.id})"  # the bot's mark
        ex = run(bot, "resume-node", {"node": "gpu01"})
        assert ex.state == "succeeded", ex.error
        assert node(lab, "gpu01")["state"] == "IDLE"
        assert "resume-gpu01" not in reservations(lab)
    finally:
        resume_everything(lab, "gpu01")


def test_drain_nodes_then_resume_nodes(lab: Lab, bot: Service) -> None:
    names = ("gpu02", "gpu03")
    try:
        ex = run(bot, "drain-nodes", {"nodes": "gpu[02-03]", "reason": "rack 1 work",
                                      "timeout": "1m"})
        assert ex.state == "succeeded", ex.error
        for name in names:
            state = node(lab, name)
            assert "DRAIN" in state["state"]
            assert state["reason"] == f"rack 1 work (execution {ex.id})"
        ex = run(bot, "resume-nodes", {"nodes": "gpu[02-03]"})
        assert ex.state == "succeeded", ex.error
        assert [node(lab, name)["state"] for name in names] == ["IDLE", "IDLE"]
    finally:
        resume_everything(lab, *names)


def test_open_and_close_maintenance(lab: Lab, bot: Service) -> None:
    try:
        ex = run(bot, "open-maintenance", {"name": "rack12", "nodes": "gpu[03-04]",
                                           "duration": "1h"})
        assert ex.state == "succeeded", ex.error
        shown = reservations(lab)
        assert "ReservationName=rack12" in shown and "Nodes=gpu[03-04]" in shown
        assert "MAINT" in shown and "IGNORE_JOBS" in shown
        ex = run(bot, "close-maintenance", {"name": "rack12"})
        assert ex.state == "succeeded", ex.error
        assert "rack12" not in reservations(lab)
    finally:
        resume_everything(lab, "gpu03", "gpu04")  # a node the gate kept out too


def test_a_failing_reset_falls_back_to_a_reboot(lab: Lab, bot: Service) -> None:
    assert lab.lab("fault", "gpu04", "reset=fail").returncode == 0
    try:
        ex = run(bot, "reset-gpu", {"node": "gpu04", "gpu": "1", "reason": "XID 94"})
        assert ex.state == "succeeded", ex.error
        details = reset_details(bot, ex.id)
        assert details["method"] == "reboot"
        assert "Unable to reset this GPU" in details["attempts"][0]["error"]
        assert node(lab, "gpu04")["state"] == "IDLE"
        assert "reset-gpu04" not in reservations(lab)
    finally:
        resume_everything(lab, "gpu04")


def test_restore_slurmdbd(lab: Lab, bot: Service, tmp_path: Path) -> None:
    maria = lab["mariadb"]
    backup = tmp_path / "slurm_acct_db.sql"
    with backup.open("w") as out:
        subprocess.run(["mariadb-dump", f"--socket={maria['socket']}", "--user=root",
                        "--single-transaction", "--databases", maria["database"]],
                       stdout=out, check=True, timeout=60)
    assert lab.run("sacctmgr", "-i", "add", "account", "added-after-backup").returncode == 0
    # The site's stop command, then a job while slurmdbd is down (its record must travel
    # from slurmctld's queue once slurmdbd is back); host commands get a clean environment:
    # the release's srun by its path
    stop_then_job = (
        "import os, subprocess, sys; subprocess.run([sys.argv[1], 'service', 'slurmdbd', "
        "'stop'], check=True); os.environ['SLURM_CONF'] = sys.argv[2]; subprocess.run("
        "[sys.argv[3], '-w', 'gpu03', '-J', 'while-dbd-down', 'true'], check=True)"
    )
    stop = bot.config.host_commands["slurmdbd-stop"]
    bot.config.host_commands["slurmdbd-stop"] = stop.model_copy(update={
        "argv": [sys.executable, "-c", stop_then_job, stop.argv[0], lab["slurm_conf"],
                 str(Path(lab["bin_dir"]) / "srun")]})
    rebuilt = Service.from_config(bot.config)
    try:
        ex = run(rebuilt, "restore-slurmdbd", {
            "backup": str(backup), "safety_copy": str(tmp_path / "safety.sql")},
            approvers=("carol", "dave"))
        assert ex.state == "succeeded", ex.error
        accounts = lab.run("sacctmgr", "-n", "-P", "list", "account", "format=account").stdout
        assert "ml-research" in accounts and "added-after-backup" not in accounts
        assert (tmp_path / "safety.sql").stat().st_size > 0
        jobs = lab.run("sacct", "-n", "-X", "-P", "--name=while-dbd-down", "-o", "JobName,State",
                       "-S", "now-1hour").stdout
        assert "while-dbd-down|COMPLETED" in jobs
    finally:
        lab.lab("service", "slurmdbd", "start")


@pytest.fixture
def rest_bot(lab: Lab, bot: Service, tmp_path: Path) -> Service:
    """The same bot on the rest backend: slurmrestd with the lab's JWT key, and a folder the
    nodes and the bot share for the output of the batch jobs run_on_node submits."""
    outputs = Path(lab["lab_dir"]) / "job-output"
    outputs.mkdir(exist_ok=True)
    assert bot.config.slurm is not None
    slurm = bot.config.slurm.model_dump()
    slurm.update(backend="rest", rest={
        "url": lab["slurmrestd"]["url"], "user": lab["jwt"]["user"],
        "key_file": lab["jwt"]["key_file"], "job_output_dir": str(outputs)})
    return Service.from_config(bot.config.model_copy(update={
        "slurm": SlurmConfig.model_validate(slurm)}))


def test_resume_node_through_slurmrestd(lab: Lab, rest_bot: Service) -> None:
    """The health check runs as a batch job pinned to the node inside its reservation and is
    judged by the job's exit code and output; 24.11's slurmrestd has no reservation writes,
    so there the request is refused before approval."""
    if lab["slurm"]["version"] == "24.11":
        with pytest.raises(Exception, match=r"reservation create.*v0\.0\.43"):
            rest_bot.request("resume-node", {"node": "gpu01"}, "alice")
        return
    outputs = Path(lab["lab_dir"]) / "job-output"
    try:
        ex = run(rest_bot, "drain-node", {"node": "gpu01", "reason": "XID 79 on GPU 3"})
        assert ex.state == "succeeded", ex.error
        ex = run(rest_bot, "resume-node", {"node": "gpu01"})
        assert ex.state == "succeeded", ex.error
        assert node(lab, "gpu01")["state"] == "IDLE"
        assert "resume-gpu01" not in reservations(lab)
        ex = run(rest_bot, "drain-node", {"node": "gpu01", "reason": "XID 79 again"})
        assert ex.state == "succeeded", ex.error
        assert lab.lab("fault", "gpu01", "health=fail").returncode == 0
        ex = run(rest_bot, "resume-node", {"node": "gpu01"})
        assert ex.state == "failed"
        assert "Fail" in (ex.error or "")  # the diagnostic's own line, from the job's output
        state = node(lab, "gpu01")
        assert "DRAIN" in state["state"] and "failed check" in state["reason"]
        assert list(outputs.iterdir()) == []  # each job's output read and removed
    finally:
        resume_everything(lab, "gpu01")
