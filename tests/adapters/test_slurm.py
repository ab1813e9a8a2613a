"""Contract tests of the Slurm adapter against the real lab cluster (the shared lab: 22.05;
test_slurm_versions.py runs them on 24.11 and 26.05 labs of their own).

Every test runs once per backend: ``cli``; ``rest`` (the lab's slurmrestd, with a token
the backend mints from the lab's jwt key); ``pyslurm`` only where a pyslurm matching the
cluster imports (it skips naming the mismatch otherwise). Each test names the operations
it needs (``@needs``): on a backend that lacks one it checks the clear refusal instead.
Each test leaves the lab as it found it."""

from __future__ import annotations

import functools
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError, ActionStopped, ActionTimeout
from adapters.slurm.actions import SlurmActions
from adapters.slurm.backend import (
    OPERATIONS,
    SlurmBackend,
    SlurmctldUnreachable,
    SlurmError,
    unsupported,
)
from adapters.slurm.config import SlurmConfig
from adapters.slurm.transports.cli import CliBackend, run_process
from adapters.slurm.transports.pyslurm.backend import PyslurmBackend
from adapters.slurm.transports.rest.backend import RestBackend
from tests.lab.fixture import Lab, SlurmClients, slurm_clients

pytestmark = pytest.mark.lab

PREFIX = "grb-test"
BACKENDS = ["cli", "rest", "pyslurm"]


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
    kind: str  # cli, rest or pyslurm
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


def lab_config(lab: Lab, slurm_conf: Path | None = None, backend: str = "cli",
               **rest: Any) -> SlurmConfig:
    bin_dir = lab["bin_dir"]
    # a lab on a Debian root (24.11, 26.05) has its version's clients there; 22.05's are on PATH
    clients = bin_dir if (lab.info.get("slurm") or {}).get("root") else None
    return SlurmConfig.model_validate({
        "backend": backend,
        "slurm_conf": str(slurm_conf or lab["slurm_conf"]),
        "bin_dir": clients,
        "commands": {"health-check": {"argv": [f"{bin_dir}/dcgmi", "diag", "-r", "2"],
                                      "timeout": 60}},
        "rest": {"url": lab["slurmrestd"]["url"], "user": lab["jwt"]["user"], **rest},
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


def make(kind: str, lab: Lab, config: SlurmConfig, runner: RecordingRunner) -> SlurmBackend:
    if kind == "cli":
        return CliBackend(config, runner=runner)
    if kind == "rest":
        outputs = Path(lab["lab_dir"]) / "job-output"  # the nodes' and the bot's shared folder
        outputs.mkdir(exist_ok=True)
        rest = config.model_copy(update={"backend": "rest", "rest": config.rest.model_copy(
            update={"key_file": lab["jwt"]["key_file"], "job_output_dir": str(outputs)})})
        return RestBackend(SlurmConfig.model_validate(rest.model_dump()))
    try:
        return PyslurmBackend(config.model_copy(update={"backend": "pyslurm"}))
    except SlurmError as exc:
        pytest.skip(f"pyslurm backend unavailable here: {exc}")


def slurm_handle(kind: str, lab: Lab, tmp_path: Path) -> Iterator[Slurm]:
    """The ``slurm`` fixture's body: a backend of ``kind`` on ``lab``, restored around."""
    # the lab's slurm.conf, copied: a test that stops slurmctld makes its clients impatient
    clients = slurm_clients(lab, tmp_path / "slurm-clients")
    config = lab_config(lab, clients.path)
    runner = RecordingRunner()
    backend = make(kind, lab, config, runner)
    handle = Slurm(lab, kind, backend, config, runner, clients,
                   SlurmActions(backend, config).by_name())
    restore(lab)
    try:
        yield handle
    finally:
        restore(lab)


@pytest.fixture(params=BACKENDS)
def slurm(request: pytest.FixtureRequest, lab: Lab, tmp_path: Path) -> Iterator[Slurm]:
    yield from slurm_handle(request.param, lab, tmp_path)


# -- capability: what a test needs, and the refusal a backend without it must give ----------

# A harmless call of each operation, made only where the backend says it refuses it.
REFUSAL_CALLS: dict[str, Callable[[SlurmBackend], object]] = {
    "nodes": lambda b: b.nodes(["gpu01"]),
    "update_nodes": lambda b: b.update_nodes(["gpu01"], "DRAIN", "refusal check"),
    "update_features": lambda b: b.update_features(["gpu01"], [f"{PREFIX}-refused"]),
    "jobs": lambda b: b.jobs(["gpu01"]),
    "requeue": lambda b: b.requeue([999999]),
    "reservations": lambda b: b.reservations(),
    "create_reservation": lambda b: b.create_reservation(
        f"{PREFIX}-refused", ["gpu01"], "now", 600, ["MAINT", "IGNORE_JOBS"], ["root"]),
    "delete_reservation": lambda b: b.delete_reservation(f"{PREFIX}-refused"),
    "reboot": lambda b: b.reboot(["gpu01"], "RESUME", "refusal check"),
    "run_on_node": lambda b: b.run_on_node("gpu01", None, ["true"], 10),
    "run_on_nodes": lambda b: b.run_on_nodes(["gpu01", "gpu02"], None, ["true"], 10),
    "accounting": lambda b: b.accounting(datetime.now() - timedelta(hours=1), datetime.now()),
    "accounts": lambda b: b.accounts(),
    "dbd_queue": lambda b: b.dbd_queue(),
}


def lab_state(lab: Lab) -> list[str]:
    """Nodes (state, reason, features), reservations and jobs, as Slurm's clients show them.
    A node's "not responding" mark (a trailing * on its state) is left out: it follows the
    lab's slurmd answering slurmctld's pings under load, not anything a backend call does."""
    listed = lab.run("sinfo", "-h", "-N", "-o", "%N %T %E %b %f").stdout.splitlines()
    nodes = [re.sub(r"^(\S+ \S+?)\*", r"\1", line) for line in listed]
    reservations = lab.run("scontrol", "show", "reservation", "-o").stdout.splitlines()
    jobs = lab.run("squeue", "-h", "-o", "%i %T %r").stdout.splitlines()
    return sorted(nodes) + reservations + sorted(jobs)


def assert_refused(slurm: Slurm, operation: str, reason: str) -> None:
    """The operation raises SlurmError with the backend's reason and changes nothing."""
    before = lab_state(slurm.lab)
    with pytest.raises(SlurmError) as caught:
        REFUSAL_CALLS[operation](slurm.backend)
    assert reason in str(caught.value)
    assert "slurm.backend: cli" in reason  # says what would do it
    assert lab_state(slurm.lab) == before


Test = Callable[..., None]


def needs(*operations: str) -> Callable[[Test], Test]:
    """The test needs these backend operations: where one is unsupported, the test checks
    that each missing one is refused clearly (and changes nothing) instead of running."""
    unknown = set(operations) - set(OPERATIONS)
    assert not unknown, f"not SlurmBackend operations: {unknown}"

    def wrap(test: Test) -> Test:
        @functools.wraps(test)
        def run(slurm: Slurm, *args: Any, **kwargs: Any) -> None:
            refused = {op: reason for op in operations
                       if (reason := unsupported(slurm.backend, op)) is not None}
            for operation, reason in refused.items():
                assert_refused(slurm, operation, reason)
            if not refused:
                test(slurm, *args, **kwargs)

        run.needs = operations  # type: ignore[attr-defined]
        return run

    return wrap


def test_every_operation_is_needed_by_some_contract_test() -> None:
    needed = {op for value in globals().values() for op in getattr(value, "needs", ())}
    assert needed == set(OPERATIONS), set(OPERATIONS) - needed
    assert set(REFUSAL_CALLS) == set(OPERATIONS)


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


@needs("nodes")
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


@needs("update_nodes", "nodes")
def test_drain_is_one_scontrol_call_then_no_change_then_resume(slurm: Slurm) -> None:
    assert slurm.plan("slurm.drain", nodes="gpu[01-02]", reason="XID 79")[0] == (
        'scontrol update NodeName=gpu[01-02] State=DRAIN Reason="XID 79 (execution <this '
        'execution>)"')
    first = slurm.run("slurm.drain", nodes="gpu[01-02]", reason="XID 79")
    assert first.changed
    updates = slurm.runner.count("scontrol", "update")  # 0 where no scontrol runs (rest)
    assert updates == (1 if slurm.kind == "cli" else 0)
    if slurm.kind == "cli":
        update = next(c for c in slurm.runner.calls if c[1:2] == ["update"])
        assert update[2:] == ["NodeName=gpu[01-02]", "State=DRAIN",
                              "Reason=XID 79 (execution 1)"]

    nodes = {n.name: n for n in slurm.backend.nodes(["gpu01", "gpu02", "gpu03"])}
    assert nodes["gpu01"].drained and nodes["gpu02"].drained and not nodes["gpu03"].drained
    assert nodes["gpu01"].reason == "XID 79 (execution 1)"  # the bot's mark, read back
    assert nodes["gpu01"].reason_user == "root"
    assert nodes["gpu01"].reason_time and abs(nodes["gpu01"].reason_time - time.time()) < 300

    again = slurm.run("slurm.drain", nodes="gpu[01-02]", reason="XID 79")
    assert not again.changed and slurm.runner.count("scontrol", "update") == updates

    resumed = slurm.run("slurm.resume", nodes="gpu[01-02]")
    assert resumed.changed and slurm.runner.count("scontrol", "update") == 2 * updates
    after = slurm.backend.nodes(["gpu01", "gpu02"])
    assert all(not n.drained and n.responding and n.state == "idle" for n in after)
    assert not slurm.run("slurm.resume", nodes="gpu[01-02]").changed


@needs("create_reservation", "delete_reservation", "reservations")
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


@needs("create_reservation", "reservations", "run_on_node")
def test_run_on_node_passes_and_fails_with_the_health_fault(slurm: Slurm) -> None:
    name = f"{PREFIX}-hc"
    slurm.run("slurm.reservation_create", name=name, nodes="gpu02", duration=600)
    shown = slurm.plan("slurm.run_on_node", node="gpu02", reservation=name,
                       command="health-check")[0]
    assert shown.startswith(
        f"slurmrestd batch job on gpu02 in reservation {name} (exec, no shell): "
        if slurm.kind == "rest" else
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


@needs("create_reservation", "reservations", "run_on_nodes")
def test_run_on_nodes_is_one_job_step_across_them(slurm: Slurm) -> None:
    name = f"{PREFIX}-nccl"
    slurm.run("slurm.reservation_create", name=name, nodes="gpu[02-03]", duration=600)
    code, out, err = slurm.backend.run_on_nodes(["gpu02", "gpu03"], name,
                                                ["printenv", "SLURMD_NODENAME", "NCCL_DEBUG"],
                                                60, {"NCCL_DEBUG": "INFO"})
    assert code == 0, err
    assert sorted(out.split()) == ["INFO", "INFO", "gpu02", "gpu03"]  # one task on each


@needs("update_nodes", "nodes", "run_on_node")
def test_run_on_a_drained_node_is_refused_at_once(slurm: Slurm) -> None:
    slurm.run("slurm.drain", nodes="gpu02", reason="test")
    with pytest.raises(ActionError, match="resume the node first"):
        slurm.run("slurm.run_on_node", node="gpu02", command="health-check")


@needs("jobs")
def test_wait_idle_succeeds_on_idle_nodes(slurm: Slurm) -> None:
    result = slurm.run("slurm.wait_idle", nodes="gpu[01-04]", timeout=10)
    assert not result.changed and "no job runs on gpu[01-04]" in result.summary


@needs("jobs", "nodes")
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


@needs("jobs")
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


@needs("reboot", "nodes")
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


@needs("nodes")
def test_slurmctld_stopped_gives_a_clear_error(slurm: Slurm) -> None:
    slurm.clients.impatient()  # each failing call below: 2 s of Slurm's retries, not 9 s
    try:
        stopped = slurm.lab.lab("service", "slurmctld", "stop", timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        with pytest.raises(SlurmctldUnreachable) as caught:
            slurm.run("slurm.node_info", nodes="gpu01")
        assert "slurmctld is not answering" in str(caught.value)
        assert "check that slurmctld runs" in str(caught.value)
        refused = unsupported(slurm.backend, "update_nodes")
        if refused is None:
            with pytest.raises(SlurmctldUnreachable,
                               match="Unable to contact slurm controller"):
                slurm.backend.update_nodes(["gpu01"], "DRAIN", "x")
        else:  # refused before anything is sent, whatever slurmctld does
            with pytest.raises(SlurmError, match=re.escape(refused)):
                slurm.backend.update_nodes(["gpu01"], "DRAIN", "x")
    finally:
        slurm.clients.patient()
        started = slurm.lab.lab("service", "slurmctld", "start", timeout=120)
        assert started.returncode == 0, started.stdout + started.stderr
    wait_for(lambda: all(n.responding for n in slurm.backend.nodes(None)),
             what="nodes to respond after the restart")


@needs("accounting")
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


@needs("jobs")
def test_jobs_lists_the_running_job_on_its_node_only(slurm: Slurm) -> None:
    job = submit(slurm.lab, "-w", "gpu03", "--wrap", "sleep 30")
    wait_for(lambda: job_state(slurm.lab, job) == "RUNNING", what=f"job {job} to run")
    found = {j.id: j for j in slurm.backend.jobs(["gpu03"])}
    assert found[job].nodes == ["gpu03"] and found[job].active
    assert (found[job].user, found[job].name, found[job].state) == ("root", PREFIX, "RUNNING")
    assert job not in {j.id for j in slurm.backend.jobs(["gpu01", "gpu02"])}


@needs("update_features", "nodes")
def test_update_features_sets_both_lists_and_puts_them_back(slurm: Slurm) -> None:
    before = sorted(slurm.backend.nodes(["gpu05"], with_jobs=False)[0].features)
    try:
        slurm.backend.update_features(["gpu05"], [*before, f"{PREFIX}-a", f"{PREFIX}-b"])
        node = slurm.backend.nodes(["gpu05"], with_jobs=False)[0]
        assert node.features == {*before, f"{PREFIX}-a", f"{PREFIX}-b"}
        shown = slurm.lab.run("sinfo", "-h", "-n", "gpu05", "-o", "%b|%f").stdout.strip()
        assert shown.count(f"{PREFIX}-a") == 2  # active and available alike
    finally:
        slurm.lab.run("scontrol", "update", "NodeName=gpu05",
                      f"AvailableFeatures={','.join(before)}",
                      f"ActiveFeatures={','.join(before)}")
    assert sorted(slurm.backend.nodes(["gpu05"], with_jobs=False)[0].features) == before


@needs("requeue")
def test_requeue_puts_a_running_job_back_in_the_queue(slurm: Slurm) -> None:
    job = submit(slurm.lab, "--requeue", "-w", "gpu03", "--wrap", "sleep 60")
    wait_for(lambda: job_state(slurm.lab, job) == "RUNNING", what=f"job {job} to run")
    slurm.backend.requeue([job])

    def restarts() -> int:
        shown = slurm.lab.run("scontrol", "show", "job", str(job)).stdout
        found = re.search(r"Restarts=(\d+)", shown)
        return int(found.group(1)) if found else 0

    assert wait_for(restarts, what=f"job {job} to be requeued") == 1
    # back in the queue, or on its way there or out again
    assert job_state(slurm.lab, job) in {"COMPLETING", "REQUEUED", "PENDING", "CONFIGURING",
                                         "RUNNING"}


@needs("reservations")
def test_reservations_lists_one_that_scontrol_made(slurm: Slurm) -> None:
    name = f"{PREFIX}-listed"
    made = slurm.lab.run("scontrol", "create", "reservation", f"ReservationName={name}",
                         "Nodes=gpu04", "StartTime=now", "Duration=10",
                         "Flags=MAINT,IGNORE_JOBS", "Users=root")
    assert made.returncode == 0, made.stderr
    found = {r.name: r for r in slurm.backend.reservations()}[name]
    assert found.nodes == ["gpu04"] and {"MAINT", "IGNORE_JOBS"} <= found.flags
    assert found.users == ["root"] and found.state == "ACTIVE"
    began = datetime.fromisoformat(found.start)
    assert abs((datetime.fromisoformat(found.end) - began) - timedelta(minutes=10)) < \
        timedelta(seconds=2)
    assert abs(began - datetime.now()) < timedelta(minutes=5)


@needs("accounts")
def test_accounts_lists_the_lab_accounts(slurm: Slurm) -> None:
    shown = slurm.lab.run("sacctmgr", "--noheader", "--parsable2", "list", "account",
                          "format=account").stdout.split()
    found = slurm.backend.accounts()
    assert sorted(found) == sorted(shown) and slurm.lab["account"] in found and "root" in found


@needs("accounts")
def test_accounts_with_slurmdbd_stopped_is_a_clear_error(slurm: Slurm) -> None:
    # 24.11's clients no longer say "Problem talking to the database" (22.05 does)
    stopped = slurm.lab.lab("service", "slurmdbd", "stop", timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    try:
        with pytest.raises(SlurmError, match="slurmdbd is not answering") as caught:
            slurm.backend.accounts()
        assert not isinstance(caught.value, SlurmctldUnreachable)
    finally:
        started = slurm.lab.lab("service", "slurmdbd", "start", timeout=120)
        assert started.returncode == 0, started.stdout + started.stderr
    assert slurm.lab["account"] in wait_for(slurm.backend.accounts, what="slurmdbd to answer")


@needs("dbd_queue")
def test_dbd_queue_is_what_sdiag_shows(slurm: Slurm) -> None:
    shown = re.search(r"DBD Agent queue size:\s*(\d+)", slurm.lab.run("sdiag").stdout)
    assert shown is not None
    assert slurm.backend.dbd_queue() == int(shown.group(1))  # 0 in a lab whose slurmdbd runs


# -- the rest backend's own: version, token sources, a key slurmrestd does not know ---------

def rest_backend(lab: Lab, **rest: Any) -> RestBackend:
    return RestBackend(lab_config(lab, backend="rest", **rest))


# The newest API version each release's slurmrestd offers (22.05: v0.0.38 only; 24.11:
# v0.0.40-42; 26.05: v0.0.42-45)
NEWEST_API = {"22.05": "v0.0.38", "24.11": "v0.0.42", "26.05": "v0.0.45"}


def test_rest_picks_the_version_the_server_offers(lab: Lab) -> None:
    key = lab["jwt"]["key_file"]
    release = (lab.info.get("slurm") or {}).get("version", "22.05")
    assert rest_backend(lab, key_file=key).api_version == NEWEST_API[release]
    oldest = lab["slurmrestd"]["api_version"]  # the lab's oldest answering ping
    assert rest_backend(lab, key_file=key, api_version=oldest).api_version == oldest
    # v0.0.39 (23.02): none of the three offers it
    with pytest.raises(SlurmError, match=r"offers no API version this bot speaks \(v0.0.39"):
        rest_backend(lab, key_file=key, api_version="v0.0.39").nodes()


def test_rest_with_the_labs_token_file_and_with_a_foreign_key(lab: Lab, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(f"SLURM_JWT={lab['jwt']['token']}\n")
    assert [n.name for n in rest_backend(lab, token_file=str(token_file)).nodes(["gpu01"])] \
        == ["gpu01"]
    foreign = tmp_path / "foreign.key"
    foreign.write_bytes(b"k" * 32)
    # slurmrestd passes a token through to slurmctld, which refuses it: HTTP 500, not 401
    # (22.05: "Unspecified error"; 24.11+: "Protocol authentication error")
    with pytest.raises(SlurmError, match=r"refuse[sd] the token") as caught:
        rest_backend(lab, key_file=str(foreign)).nodes()
    assert not isinstance(caught.value, SlurmctldUnreachable)
    assert lab["jwt"]["token"] not in str(caught.value)
