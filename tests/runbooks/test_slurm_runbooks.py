"""The shipped Slurm runbooks end to end against the lab's real Slurm, MariaDB and slurmdbd:
drain and resume, maintenance reservations, swap-gpu (with a person confirming, and with a
failing health check), a driver rollback over several nodes (and its stop at the first
failure), restore-slurmdbd, a wait_idle timeout, and slurmctld stopped in the middle of a
run; guard-weakening parameters (a lower capacity floor, a higher max_parallel) need
break-glass, and no request goes under the site floor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.config import EngineConfig, GuardsConfig, PoolFloors, UserConfig, load_config
from bot.execution.engine import Engine
from bot.execution.executions import Execution
from bot.service import Service
from bot.store import audit
from kit.errors import Refused
from tests.lab.fixture import Lab, lab_command, slurm_clients

pytestmark = pytest.mark.lab


@pytest.fixture
def bot(lab: Lab, tmp_path: Path) -> Iterator[Service]:
    config = load_config(lab.dir / "bot.yaml")
    config = config.model_copy(update={
        "database_url": f"sqlite:///{tmp_path / 'bot.db'}",
        "engine": EngineConfig(lease_seconds=10, poll_seconds=0.1),
    })
    yield Service.from_config(config)


def run(bot: Service, name: str, params: dict[str, str], approvers: tuple[str, ...] = ("carol",),
        during: Callable[[Service, int], None] | None = None,
        break_glass: bool = False) -> Execution:
    """Request as alice, approve, drive to the end (``during`` runs beside the engine)."""
    execution_id = bot.request(name, params, "alice", break_glass=break_glass)
    for approver in approvers:
        if bot.get(execution_id).state == "awaiting_approval":
            bot.approve(execution_id, approver)
    engine = Engine(bot)
    result: dict[str, Execution] = {}
    worker = threading.Thread(target=lambda: result.update(ex=engine.drive(execution_id)))
    worker.start()
    try:
        if during is not None:
            during(bot, execution_id)
        worker.join(300)
    finally:
        engine.close()
    assert not worker.is_alive(), "the execution did not end"
    assert audit.verify(bot.db).ok
    return result["ex"]


def node(lab: Lab, name: str) -> dict[str, Any]:
    """The node's state and reason, once a job that just ended on it (a test's own srun, a
    health check) has finished completing: COMPLETING is Slurm's passing flag, not a state."""
    done = lab.run("scontrol", "show", "node", name, "-o")
    for _ in range(50):
        if "COMPLETING" not in done.stdout:
            break
        time.sleep(0.2)
        done = lab.run("scontrol", "show", "node", name, "-o")
    fields = dict(part.split("=", 1) for part in done.stdout.split() if "=" in part)
    reason = done.stdout.split("Reason=", 1)[1].split(" [")[0] if "Reason=" in done.stdout else ""
    return {"state": fields.get("State", ""), "reason": reason}


def reservations(lab: Lab) -> str:
    return lab.run("scontrol", "show", "reservation").stdout


def events(bot: Service, execution_id: int) -> list[dict[str, Any]]:
    with bot.db.connect() as conn:
        return list(audit.events(conn, execution_id=execution_id))


def wait_for_event(bot: Service, execution_id: int, kind: str, step: str | None = None,
                   seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for event in events(bot, execution_id):
            if event["kind"] == kind and (step is None or event["data"].get("step") == step):
                return
        time.sleep(0.1)
    raise AssertionError(f"no {kind} event for {step}")


def resume_everything(lab: Lab, *nodes: str) -> None:
    """Back as the lab started, answering: Slurm marks a node it just resumed NOT_RESPONDING
    until its next ping (about half a second here), and a capacity guard reading it then
    counts its GPUs out."""
    for name in nodes:
        lab.run("scontrol", "update", f"NodeName={name}", "State=RESUME")
        lab.lab("fault", name, "clear")
    for line in reservations(lab).splitlines():
        if line.startswith("ReservationName="):
            lab.run("scontrol", "delete", f"ReservationName={line.split()[0].split('=')[1]}")
    deadline = time.monotonic() + 30
    while any("NOT_RESPONDING" in node(lab, name)["state"] for name in nodes):
        assert time.monotonic() < deadline, f"{nodes} still not responding 30 s after RESUME"
        time.sleep(0.2)


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


def test_drain_node_lower_floor_needs_break_glass_never_under_the_site_floor(
        lab: Lab, bot: Service) -> None:
    asked = {"node": "gpu01", "reason": "floor test", "min_free_gpus": "0"}
    with pytest.raises(Refused, match=r"min_free_gpus=0 weakens a guard .* lower than its "
                                      r"default 8\. To go ahead anyway ask for break-glass"):
        bot.request("drain-node", asked, "alice")
    sited = Service.from_config(bot.config.model_copy(update={
        "guards": GuardsConfig(min_free_gpus=PoolFloors(slurm=1000))}))
    with pytest.raises(Refused, match=r"the site floor: .*Slurm pool: \d+ free GPUs now, \d+ "
                                      r"after taking gpu01 out \(floor 1000, the site floor"):
        sited.request("drain-node", asked, "alice", break_glass=True)
    try:
        ex = run(bot, "drain-node", asked, approvers=("carol", "dave"), break_glass=True)
        assert ex.state == "succeeded", ex.error
        assert ex.approvals_required == 2 and "DRAIN" in node(lab, "gpu01")["state"]
    finally:
        resume_everything(lab, "gpu01")


def test_wait_idle_timeout_leaves_the_faulty_node_drained(lab: Lab, bot: Service) -> None:
    job = lab.run("sbatch", "--parsable", "-o", "/dev/null", "-w", "gpu02", "-N1",
                  "-J", "long-training", "--wrap", "sleep 120").stdout.strip()
    try:
        deadline = time.monotonic() + 30
        while "RUNNING" not in lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout:
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.2)
        ex = run(bot, "drain-node", {"node": "gpu02", "reason": "ECC", "timeout": "10s"})
        assert ex.state == "failed"
        assert "wait-idle failed" in (ex.error or "") and job in (ex.error or "")
        assert "completed steps left as they are" in (ex.error or "")
        assert "DRAIN" in node(lab, "gpu02")["state"]  # draining: no new job lands there
    finally:
        lab.run("scancel", job)
        resume_everything(lab, "gpu02")


def start_job(lab: Lab, node_name: str, seconds: int = 300) -> str:
    job = lab.run("sbatch", "--parsable", "-o", "/dev/null", "-w", node_name, "-N1",
                  "-J", "long-training", "--wrap", f"sleep {seconds}").stdout.strip()
    deadline = time.monotonic() + 30
    while "RUNNING" not in lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout:
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.2)
    return job


def test_cancel_of_a_drain_waiting_for_a_job_is_undone_within_seconds(lab: Lab,
                                                                     bot: Service) -> None:
    """The drain waits for a training job (hours in production); a cancel brings the node
    back into service at once and leaves the job alone."""
    job = start_job(lab, "gpu02")
    seen: dict[str, float] = {}

    def cancel_while_waiting(bot: Service, execution_id: int) -> None:
        wait_for_event(bot, execution_id, "step_started", "wait-idle")
        time.sleep(0.5)
        asked = time.monotonic()
        bot.cancel(execution_id, "alice")
        while "DRAIN" in node(lab, "gpu02")["state"]:
            assert time.monotonic() - asked < 10, "the node stayed drained"
            time.sleep(0.05)
        seen["back"] = time.monotonic() - asked

    try:
        ex = run(bot, "drain-node", {"node": "gpu02", "reason": "cancel me"},
                 during=cancel_while_waiting)
        assert ex.state == "cancelled", ex.error
        assert seen["back"] < 5
        assert "undone: slurm-drain" in (ex.error or "")
        assert "RUNNING" in lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout
    finally:
        lab.run("scancel", job)
        resume_everything(lab, "gpu02")


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


def swap_in_lab(bot: Service, execution_id: int) -> None:
    """What the DC technician does before saying yes: `lab swap NODE GPU` (a new serial and
    UUID) for the execution's node and GPU, in the lab the bot's configuration points at."""
    params = bot.get(execution_id).plan.params
    assert bot.config.slurm is not None and bot.config.slurm.slurm_conf is not None
    folder = Path(bot.config.slurm.slurm_conf).parents[1]
    done = lab_command("swap", str(params["node"]), str(params["gpu"]),
                       env=dict(os.environ, RUNBOOK_LAB_DIR=str(folder)))
    assert done.returncode == 0, done.stderr


def confirm_when_asked(yes: bool = True, swap: bool = True) -> Callable[[Service, int], None]:
    """Answer swap-gpu's "GPU replaced?" once asked; with ``swap`` (and yes), the GPU is
    swapped in the lab first, as the technician would have."""
    def answer(bot: Service, execution_id: int) -> None:
        wait_for_event(bot, execution_id, "confirmation_requested")
        if yes and swap:
            swap_in_lab(bot, execution_id)
        bot.confirm(execution_id, "alice", yes, "swapped by the DC technician")

    return answer


def test_swap_gpu_returns_the_node_to_service(lab: Lab, bot: Service) -> None:
    try:
        ex = run(bot, "swap-gpu", {"node": "gpu03", "gpu": "3", "reason": "XID 79"},
                 during=confirm_when_asked())
        assert ex.state == "succeeded", ex.error
        assert node(lab, "gpu03")["state"] == "IDLE"
        assert "swap-gpu03" not in reservations(lab)
        kinds = [e["kind"] for e in events(bot, ex.id)]
        assert "confirmed" in kinds
    finally:
        resume_everything(lab, "gpu03")


def test_swap_gpu_failed_health_check_leaves_the_node_drained(lab: Lab, bot: Service) -> None:
    lab.lab("fault", "gpu04", "health=fail")
    try:
        ex = run(bot, "swap-gpu", {"node": "gpu04", "gpu": "1", "reason": "XID 79"},
                 during=confirm_when_asked())
        assert ex.state == "failed"
        assert "health-check failed" in (ex.error or "")
        state = node(lab, "gpu04")
        assert "DRAIN" in state["state"], ex.error
        assert state["reason"].startswith("health check failed")
        assert "swap-gpu04" not in reservations(lab)  # the reservation was undone
    finally:
        resume_everything(lab, "gpu04")


def test_rollback_driver_over_two_nodes(lab: Lab, bot: Service) -> None:
    # max_parallel above its default weakens a guard: break-glass, a third approver
    bot.config.users["erin"] = UserConfig(groups=["gpu-leads"])
    asked = {"nodes": "gpu[01-02]", "version": "550.54.15", "max_parallel": "2"}
    with pytest.raises(Refused, match=r"max_parallel=2 weakens a guard .*--break-glass"):
        bot.request("rollback-driver", asked, "alice")
    try:
        ex = run(bot, "rollback-driver", asked, approvers=("carol", "dave", "erin"),
                 break_glass=True)
        assert ex.state == "succeeded", ex.error
        assert ex.approvals_required == 3 and ex.plan.break_glass
        for name in ("gpu01", "gpu02"):
            assert lab.lab("driver", name).stdout.strip() == "550.54.15"
            assert node(lab, name)["state"] == "IDLE"
        assert "driver-gpu0" not in reservations(lab)
        reboots = [e for e in events(bot, ex.id) if e["kind"] == "step_finished"
                   and e["data"]["step"] == "rollout"]
        assert reboots and reboots[0]["data"]["details"]["nodes"] == {
            "gpu01": "on driver 550.54.15", "gpu02": "on driver 550.54.15"}
    finally:
        for name in ("gpu01", "gpu02"):
            lab.lab("fault", name, f"driver={lab['default_driver_version']}")
        resume_everything(lab, "gpu01", "gpu02")


def test_rollback_driver_stops_at_the_first_failure(lab: Lab, bot: Service) -> None:
    lab.lab("fault", "gpu01", "health=fail")
    try:
        ex = run(bot, "rollback-driver", {"nodes": "gpu[01-02]", "version": "550.54.15"},
                 approvers=("carol", "dave"))
        assert ex.state == "failed"
        assert "gpu01: FAILED" in (ex.error or "") and "not started: gpu02" in (ex.error or "")
        state = node(lab, "gpu01")
        assert "DRAIN" in state["state"] and "driver 550.54.15 failed" in state["reason"]
        assert lab.lab("driver", "gpu02").stdout.strip() == lab["default_driver_version"]
    finally:
        lab.lab("fault", "gpu01", f"driver={lab['default_driver_version']}")
        resume_everything(lab, "gpu01", "gpu02")


def test_restore_slurmdbd(lab: Lab, bot: Service, tmp_path: Path) -> None:
    maria = lab["mariadb"]
    backup = tmp_path / "slurm_acct_db.sql"
    with backup.open("w") as out:
        subprocess.run(["mariadb-dump", f"--socket={maria['socket']}", "--user=root",
                        "--single-transaction", "--databases", maria["database"]],
                       stdout=out, check=True, timeout=60)
    assert lab.run("sacctmgr", "-i", "add", "account", "added-after-backup").returncode == 0
    # The site's stop command; this one also runs a job while slurmdbd is down, so its
    # record must travel from slurmctld's queue once slurmdbd is back.
    stop_then_job = (
        "import os, subprocess, sys; subprocess.run([sys.argv[1], 'service', 'slurmdbd', "
        "'stop'], check=True); os.environ['SLURM_CONF'] = sys.argv[2]; subprocess.run(['srun',"
        " '-w', 'gpu03', '-J', 'while-dbd-down', 'true'], check=True)"
    )
    stop = bot.config.host_commands["slurmdbd-stop"]
    bot.config.host_commands["slurmdbd-stop"] = stop.model_copy(update={
        "argv": [sys.executable, "-c", stop_then_job, stop.argv[0], lab["slurm_conf"]]})
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
        lab.run("sacctmgr", "-i", "delete", "account", "added-after-backup")


def test_slurmctld_stopped_mid_run(lab: Lab, bot: Service, tmp_path: Path) -> None:
    """slurmctld dies while a person is swapping the GPU: the run fails with Slurm's words,
    the node stays drained, the audit log keeps every event."""
    # the bot's Slurm clients read a copy of the lab's slurm.conf, impatient while slurmctld
    # is stopped: each call that fails then costs 2 s of Slurm's retries rather than 9 s
    clients = slurm_clients(lab, tmp_path / "slurm-clients")
    assert bot.config.slurm is not None
    bot = Service.from_config(bot.config.model_copy(update={
        "slurm": bot.config.slurm.model_copy(update={"slurm_conf": str(clients.path)})}))

    def stop_controller_then_confirm(bot: Service, execution_id: int) -> None:
        wait_for_event(bot, execution_id, "confirmation_requested")
        clients.impatient()
        assert lab.lab("service", "slurmctld", "stop").returncode == 0
        bot.confirm(execution_id, "alice", True, None)

    try:
        ex = run(bot, "swap-gpu", {"node": "gpu02", "gpu": "0", "reason": "XID 48"},
                 during=stop_controller_then_confirm)
        assert ex.state == "failed"
        assert "slurmctld is not answering" in (ex.error or "")
        kinds = [e["kind"] for e in events(bot, ex.id)]
        assert kinds.count("step_finished") == 5 and "undo_failed" in kinds  # to the swap
    finally:
        clients.patient()
        assert lab.lab("service", "slurmctld", "start").returncode == 0
    assert "DRAIN" in node(lab, "gpu02")["state"]
    resume_everything(lab, "gpu02")
    details = json.dumps([e["data"] for e in events(bot, ex.id)])
    assert "swap GPU 0: XID 48" in details


def test_restore_slurmdbd_from_a_broken_backup_puts_everything_back(lab: Lab, bot: Service,
                                                                     tmp_path: Path) -> None:
    """A backup that breaks halfway: the safety copy goes back in and slurmdbd runs again."""
    backup = tmp_path / "broken.sql"
    backup.write_text("USE slurm_acct_db;\nDROP TABLE IF EXISTS acct_table;\nTHIS IS NOT SQL;\n")
    try:
        ex = run(bot, "restore-slurmdbd", {
            "backup": str(backup), "safety_copy": str(tmp_path / "safety.sql")},
            approvers=("carol", "dave"))
        assert ex.state == "failed"
        assert "step restore failed" in (ex.error or "")
        assert "undone: restore, stop-slurmdbd" in (ex.error or "")
        accounts = lab.run("sacctmgr", "-n", "-P", "list", "account", "format=account").stdout
        assert "ml-research" in accounts  # acct_table is back from the safety copy
    finally:
        lab.lab("service", "slurmdbd", "start")
