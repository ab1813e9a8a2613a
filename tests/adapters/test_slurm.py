"""Contract tests of the Slurm adapter against the real lab cluster (Slurm 22.05 here).

Every test runs once per backend: ``cli`` always; ``pyslurm`` only where a pyslurm
matching the cluster's Slurm imports (it skips with the mismatch otherwise). Each test
leaves the lab as it found it: nodes resumed, its reservations deleted, faults cleared,
its jobs cancelled.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError, ActionStopped, ActionTimeout
from adapters.slurm import (
    CliBackend,
    PyslurmBackend,
    SlurmActions,
    SlurmBackend,
    SlurmConfig,
    SlurmctldUnreachable,
    SlurmError,
)
from adapters.slurm.cli import run_process
from tests.lab.fixture import Lab, SlurmClients, slurm_clients

pytestmark = pytest.mark.lab

PREFIX = "grb-test"


class RecordingRunner:
    """The real runner, recording every command line (to count scontrol calls)."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], *, env: Mapping[str, str],
                 timeout: float) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        return run_process(argv, env=env, timeout=timeout)

    def count(self, *words: str) -> int:
        return sum(1 for argv in self.calls
                   if [Path(argv[0]).name, *argv[1:len(words)]] == list(words))


@dataclass
class Slurm:
    lab: Lab
    backend: SlurmBackend
    config: SlurmConfig
    runner: RecordingRunner
    clients: SlurmClients  # the slurm.conf the backend's clients read
    actions: dict[str, Any] = field(default_factory=dict)

    def run(self, action_name: str, ctx: ActionContext | None = None, /,
            **arguments: Any) -> Any:
        action = self.actions[action_name]
        return action.run(action.Arguments(**arguments), ctx or context())

    def plan(self, action_name: str, /, **arguments: Any) -> list[str]:
        action = self.actions[action_name]
        lines: list[str] = action.plan(action.Arguments(**arguments))
        return lines


def context(seconds: float = 120, lines: list[str] | None = None) -> ActionContext:
    sink = lines if lines is not None else []
    return ActionContext(execution_id=1, step_id="test", deadline=time.monotonic() + seconds,
                         progress=sink.append)


def lab_config(lab: Lab, slurm_conf: Path | None = None) -> SlurmConfig:
    bin_dir = lab["bin_dir"]
    return SlurmConfig.model_validate({
        "slurm_conf": str(slurm_conf or lab["slurm_conf"]),
        "commands": {"health-check": {"argv": [f"{bin_dir}/dcgmi", "diag", "-r", "2"],
                                      "timeout": 60}},
    })


def restore(lab: Lab) -> None:
    """Undo whatever a test left: resume nodes, delete test reservations, cancel test jobs."""
    lab.run("scancel", "--name", PREFIX)
    for line in lab.run("scontrol", "show", "reservation", "-o").stdout.splitlines():
        if line.startswith(f"ReservationName={PREFIX}"):
            name = line.split()[0].split("=", 1)[1]
            lab.run("scontrol", "delete", f"ReservationName={name}")
    faults = Path(lab["faults_dir"])  # a node's faults are its file there: `clear` deletes it
    for node in lab["nodes"]:
        if (faults / f"{node}.json").exists():  # (a `lab` run per node costs 0.3 s of CPU)
            lab.lab("fault", node, "clear", timeout=30)
    nodes = ",".join(lab["nodes"])
    listing = lab.run("sinfo", "-h", "-N", "-n", nodes, "-o", "%N %T").stdout
    stuck = [line.split()[0] for line in listing.splitlines()
             if any(word in line.split()[1] for word in ("drain", "down"))]
    if stuck:
        lab.run("scontrol", "update", f"NodeName={','.join(stuck)}", "State=RESUME")


@pytest.fixture(params=["cli", "pyslurm"])
def slurm(request: pytest.FixtureRequest, lab: Lab, tmp_path: Path) -> Iterator[Slurm]:
    # the lab's slurm.conf, copied: a test that stops slurmctld makes its clients impatient
    clients = slurm_clients(lab, tmp_path / "slurm-clients")
    config = lab_config(lab, clients.path)
    runner = RecordingRunner()
    backend: SlurmBackend
    if request.param == "cli":
        backend = CliBackend(config, runner=runner)
    else:
        try:
            backend = PyslurmBackend(config.model_copy(update={"backend": "pyslurm"}))
        except SlurmError as exc:
            pytest.skip(str(exc))
    handle = Slurm(lab, backend, config, runner, clients,
                   SlurmActions(backend, config).by_name())
    restore(lab)
    try:
        yield handle
    except SlurmError as exc:  # pragma: no cover - only with a partial backend
        if "not supported by the pyslurm backend" in str(exc):
            pytest.skip(str(exc))
        raise
    finally:
        restore(lab)


def wait_for(predicate: Any, timeout: float = 30, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def submit(lab: Lab, *args: str) -> int:
    done = lab.run("sbatch", "--parsable", "-o", "/dev/null", "-J", PREFIX, *args)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip().split(";")[0])


def job_state(lab: Lab, job_id: int) -> str:
    return lab.run("squeue", "-h", "-j", str(job_id), "-o", "%T").stdout.strip()


def test_node_info_of_idle_nodes(slurm: Slurm) -> None:
    result = slurm.run("slurm.node_info", nodes="gpu[01-04]")
    assert not result.changed
    nodes = result.details["nodes"]
    assert [n["name"] for n in nodes] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    for node in nodes:
        assert node["state"] == "idle" and node["flags"] == []
        assert node["gpus_total"] == 8 and node["gpus_used"] == 0 and node["jobs"] == []
        assert not node["drained"] and not node["draining"]
    assert "gpu01: idle, 0/8 GPUs used" in result.summary


def test_drain_is_one_scontrol_call_then_no_change_then_resume(slurm: Slurm) -> None:
    assert slurm.plan("slurm.drain", nodes="gpu[01-02]", reason="XID 79") == [
        'scontrol update NodeName=gpu[01-02] State=DRAIN Reason="XID 79"']
    first = slurm.run("slurm.drain", nodes="gpu[01-02]", reason="XID 79")
    assert first.changed
    assert slurm.runner.count("scontrol", "update") == 1
    update = next(c for c in slurm.runner.calls if c[1:2] == ["update"])
    assert update[2:] == ["NodeName=gpu[01-02]", "State=DRAIN", "Reason=XID 79"]

    nodes = {n.name: n for n in slurm.backend.nodes(["gpu01", "gpu02", "gpu03"])}
    assert nodes["gpu01"].drained and nodes["gpu02"].drained and not nodes["gpu03"].drained
    assert nodes["gpu01"].reason == "XID 79" and nodes["gpu01"].reason_user == "root"
    assert nodes["gpu01"].reason_time and abs(nodes["gpu01"].reason_time - time.time()) < 300

    again = slurm.run("slurm.drain", nodes="gpu[01-02]", reason="XID 79")
    assert not again.changed and slurm.runner.count("scontrol", "update") == 1

    resumed = slurm.run("slurm.resume", nodes="gpu[01-02]")
    assert resumed.changed and slurm.runner.count("scontrol", "update") == 2
    after = slurm.backend.nodes(["gpu01", "gpu02"])
    assert all(not n.drained and n.responding and n.state == "idle" for n in after)
    assert not slurm.run("slurm.resume", nodes="gpu[01-02]").changed


def test_reservation_create_exists_delete(slurm: Slurm) -> None:
    name = f"{PREFIX}-maint"
    args = {"name": name, "nodes": "gpu[03-04]", "duration": "1h"}
    assert slurm.plan("slurm.reservation_create", **args) == [
        f"scontrol create reservation ReservationName={name} Nodes=gpu[03-04] StartTime=now "
        "Duration=01:00:00 Flags=MAINT,IGNORE_JOBS Users=root"]
    created = slurm.run("slurm.reservation_create", **args)
    assert created.changed
    found = {r.name: r for r in slurm.backend.reservations()}[name]
    assert found.nodes == ["gpu03", "gpu04"] and {"MAINT", "IGNORE_JOBS"} <= found.flags
    assert not slurm.run("slurm.reservation_create", **args).changed
    with pytest.raises(ActionError, match="already exists on gpu\\[03-04\\], not on gpu01"):
        slurm.run("slurm.reservation_create", name=name, nodes="gpu01", duration=600)
    assert slurm.run("slurm.reservation_delete", name=name).changed
    assert name not in {r.name for r in slurm.backend.reservations()}
    assert not slurm.run("slurm.reservation_delete", name=name).changed


def test_run_on_node_passes_and_fails_with_the_health_fault(slurm: Slurm) -> None:
    name = f"{PREFIX}-hc"
    slurm.run("slurm.reservation_create", name=name, nodes="gpu02", duration=600)
    assert slurm.plan("slurm.run_on_node", node="gpu02", reservation=name,
                      command="health-check")[0].startswith(
        f"srun -w gpu02 -N1 -n1 --export=PATH,HOME,USER,LOGNAME,LANG,LC_ALL,TZ "
        f"--reservation={name} -- ")
    ok = slurm.run("slurm.run_on_node", node="gpu02", reservation=name, command="health-check")
    assert ok.details["exit_code"] == 0 and "Pass" in ok.details["stdout"]
    try:
        assert slurm.lab.lab("fault", "gpu02", "health=fail", timeout=30).returncode == 0
        with pytest.raises(ActionError, match=r"exited 1 \(expected 0\) on gpu02: .*Fail"):
            slurm.run("slurm.run_on_node", node="gpu02", reservation=name,
                      command="health-check")
    finally:
        slurm.lab.lab("fault", "gpu02", "clear", timeout=30)
    again = slurm.run("slurm.run_on_node", node="gpu02", reservation=name,
                      command="health-check")
    assert again.details["exit_code"] == 0


def test_run_on_a_drained_node_is_refused_at_once(slurm: Slurm) -> None:
    slurm.run("slurm.drain", nodes="gpu02", reason="test")
    with pytest.raises(ActionError, match="resume the node first"):
        slurm.run("slurm.run_on_node", node="gpu02", command="health-check")


def test_wait_idle_succeeds_on_idle_nodes(slurm: Slurm) -> None:
    result = slurm.run("slurm.wait_idle", nodes="gpu[01-04]", timeout=10)
    assert not result.changed and "no job runs on gpu[01-04]" in result.summary


def test_wait_idle_times_out_naming_the_running_job(slurm: Slurm) -> None:
    job = submit(slurm.lab, "-w", "gpu03", "--wrap", "sleep 30")
    try:
        wait_for(lambda: job_state(slurm.lab, job) == "RUNNING", what=f"job {job} to run")
        lines: list[str] = []
        began = time.monotonic()
        with pytest.raises(ActionTimeout) as caught:
            slurm.run("slurm.wait_idle", context(lines=lines), nodes="gpu03", timeout=3, poll=1)
        assert time.monotonic() - began < 15
        message = str(caught.value)
        assert f"{job} (user root, name {PREFIX}, running)" in message
        assert "gpu03" in message and any(str(job) in line for line in lines)
        node = slurm.backend.nodes(["gpu03"])[0]
        assert node.jobs == [job] and not node.idle_ish
    finally:
        slurm.lab.run("scancel", str(job))
    slurm.run("slurm.wait_idle", nodes="gpu03", timeout=30, poll=0.5)


def test_wait_idle_stops_within_a_second_and_leaves_the_job_running(slurm: Slurm) -> None:
    job = submit(slurm.lab, "-w", "gpu03", "--wrap", "sleep 300")
    try:
        wait_for(lambda: job_state(slurm.lab, job) == "RUNNING", what=f"job {job} to run")
        ctx = context(seconds=3600)
        timer = threading.Timer(1.0, ctx.request_stop, ["cancelled"])
        began = time.monotonic()
        timer.start()
        try:
            with pytest.raises(ActionStopped, match="waiting for jobs on gpu03: cancelled"):
                slurm.run("slurm.wait_idle", ctx, nodes="gpu03", timeout="1h", poll=30,
                          requeue=False)
        finally:
            timer.cancel()
        assert time.monotonic() - began < 3
        assert job_state(slurm.lab, job) == "RUNNING"
    finally:
        slurm.lab.run("scancel", str(job))


def test_reboot_plan_and_a_real_reboot(slurm: Slurm) -> None:
    assert slurm.plan("slurm.reboot", nodes="gpu04", reason="driver 550.54.15") == [
        'scontrol reboot ASAP nextstate=RESUME reason="driver 550.54.15" gpu04']
    before = slurm.backend.nodes(["gpu04"])[0]
    result = slurm.run("slurm.reboot", nodes="gpu04", reason="grb test reboot", wait=True,
                       wait_timeout=60, poll=0.5)
    assert result.changed and slurm.runner.count("scontrol", "reboot") == 1
    after = slurm.backend.nodes(["gpu04"])[0]
    assert after.state == "idle" and not after.flags
    assert before.boot_time is not None and after.boot_time is not None
    assert after.boot_time > before.boot_time


def test_slurmctld_stopped_gives_a_clear_error(slurm: Slurm) -> None:
    slurm.clients.impatient()  # each failing call below: 2 s of Slurm's retries, not 9 s
    try:
        stopped = slurm.lab.lab("service", "slurmctld", "stop", timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        with pytest.raises(SlurmctldUnreachable) as caught:
            slurm.run("slurm.node_info", nodes="gpu01")
        assert "slurmctld is not answering" in str(caught.value)
        assert "check that slurmctld runs" in str(caught.value)
        with pytest.raises(SlurmctldUnreachable, match="Unable to contact slurm controller"):
            slurm.backend.update_nodes(["gpu01"], "DRAIN", "x")
    finally:
        slurm.clients.patient()
        started = slurm.lab.lab("service", "slurmctld", "start", timeout=120)
        assert started.returncode == 0, started.stdout + started.stderr
    wait_for(lambda: all(n.responding for n in slurm.backend.nodes(None)),
             what="nodes to respond after the restart")


def test_accounting_has_a_row_for_the_lab_account(slurm: Slurm) -> None:
    account = slurm.lab["account"]
    start = datetime.now() - timedelta(minutes=5)
    job = submit(slurm.lab, "-A", account, "--gres=gpu:2", "-w", "gpu01", "--wrap", "sleep 1")
    wait_for(lambda: job_state(slurm.lab, job) == "", what=f"job {job} to finish")

    def row() -> Any:
        usage = slurm.backend.accounting(start, datetime.now() + timedelta(minutes=1))
        found = next((u for u in usage if u.account == account), None)
        return found if found is not None and found.gpu_hours > 0 else None

    usage = wait_for(row, timeout=60, what="sacct to report the job")
    assert usage.jobs >= 1 and usage.gpu_hours >= 2 * 1 / 3600 * 0.5
    assert usage.mean_queue_wait_seconds >= 0
