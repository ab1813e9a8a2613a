"""kill -9 the engine at the stage boundaries of the Slurm runbooks, then let another engine
finish: drain-node, drain-nodes, resume-node, swap-gpu, rollback-driver, quarantine-node and
nccl-test against the lab's real Slurm.

The first engine is a real `runbook run ... --wait` process, as an on-call engineer starts
it; the approvals come from another terminal. With a lab configuration,
RUNBOOK_LAB_CRASH_AFTER=<kind>[:<step or check>] makes it SIGKILL itself right after it
committed that audit event (bot/engine.py); inside a step that waits (slurm.wait_idle on a
job started with sbatch, chat.confirm, a driver rollout) the test kills its process group
instead. The second engine is a real `runbook engine` process, without the variable, started
beside the first one like a second replica: it takes the execution over once the dead
engine's lease (1.5 s) ran out. (Started with the first one, it needs no start-up time of
its own after the kill; that keeps the matrix within its time and makes the takeover as
early as the lease allows, which is what the clock-skew rule is about.) Where a person must
decide, the test stops it, runs `runbook resume` or `runbook cancel`, then `runbook engine
--once` finishes the execution. Each case then checks what a person relies on:

- the cluster ends as the runbook promises (scontrol: drained after drain-node and
  drain-nodes, whose reason names its execution; in service after resume-node, swap-gpu,
  rollback-driver and nccl-test and after the undo of either drain, which resumes only what it
  drained; drained after a failed health check; no reservation left behind);
- no step ran twice, except the idempotent step the engine died in (attempt 2, started only
  after the dead engine's lease plus engine.clock_skew_seconds); swap-gpu (resume: manual,
  and its chat.confirm is not idempotent) goes on only once a person said so;
- a held execution says why and names `runbook resume ID` and `runbook cancel ID`;
- the audit chain verifies.

`make test` runs CASES: each kind of boundary once per runbook (after a pre-check, before a
step, inside a waiting step, after a step, at a post-check, during undo, held then resumed or
cancelled; drain-nodes, whose Slurm steps are drain-node's in batches, before its drain and
in its undo), about two minutes on two cores (every case starts two or three engine processes
of about two CPU-seconds each and waits out a lease). RUNBOOK_SIGKILL_FULL=1 adds
EXTRA_CASES, the same paths at the other boundaries (every step_started and step_finished of
drain-node and resume-node, their undo_started, drain-nodes inside wait-idle, after its
drain, at its post-check and in the undo of a failed run, swap-gpu's post-check and undo,
rollback-driver's "started"). Not covered at all:
- step_skipped boundaries (the k8s steps; gpu03 is not a Kubernetes node): a skipped step is
  persisted like a finished one.
- check_evaluated:<post-check> of rollback-driver: the same path as the post-checks of the
  other three, and a case costs a whole rollout.
- resume-node, swap-gpu and rollback-driver have no pre-checks; rollback-driver has no undo
  (on_failure: leave, no step has an undo).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from bot.config import load_config
from bot.execution import executions
from bot.service import Service
from bot.store import audit
from bot.store.schema import executions as executions_table
from kit.errors import Refused
from tests.lab.fixture import Lab

pytestmark = pytest.mark.lab

RUNBOOK = [sys.executable, "-m", "bot"]
LEASE_SECONDS = 1.5
CLOCK_SKEW_SECONDS = 1.0
POLL_SECONDS = 0.1
# One node, one case at a time: gpu03 is in Slurm only (gpu05.. are the Kubernetes nodes), so
# the runbooks' k8s steps are skipped. Every case puts it back (resumed, no job, no
# reservation, no fault, the default driver) whatever happened.
NODE = "gpu03"
DRIVER = "550.54.15"
ENGINE_TIMEOUT = 120
ENDED = ("held", "succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Runbook:
    name: str
    params: tuple[str, ...]
    approvers: tuple[str, ...] = ("carol",)
    manual: bool = False  # resume: manual
    reservation: str = ""  # the reservation it makes
    waits: str = "wait-idle"  # the step a cancel comes in (trigger "cancel")


DRAIN = Runbook("drain-node", (f"node={NODE}", "reason=sigkill matrix"))
FLEET = Runbook("drain-nodes", (f"nodes={NODE}", "reason=sigkill matrix"))  # a set of one
DRAINS = (DRAIN, FLEET)
RESUME = Runbook("resume-node", (f"node={NODE}",), reservation=f"resume-{NODE}")
SWAP = Runbook("swap-gpu", (f"node={NODE}", "gpu=3", "reason=XID 79"), manual=True,
               reservation=f"swap-{NODE}")
QUARANTINE = Runbook("quarantine-node", (f"node={NODE}", "reason=sigkill matrix"),
                     approvers=())  # risk low: what alerts run without a person
ROLLBACK = Runbook("rollback-driver", (f"nodes={NODE}", f"version={DRIVER}"),
                   approvers=("carol", "dave"), reservation=f"driver-{NODE}")
NCCL = Runbook("nccl-test", (f"nodes={NODE}",), approvers=(),  # risk low, like quarantine
               reservation=f"nccl-{NODE}", waits="nccl")
NCCL_SECONDS = "8"  # the lab's all_reduce_perf runs this long in the cancel case
POST_CHECKS = ("the node is drained in Slurm and runs no job",
               "the nodes are drained in Slurm and run no job",
               "the node is in service in Slurm and not drained",
               "every Slurm node is back in service")


@dataclass(frozen=True)
class Case:
    runbook: Runbook
    crash: str  # RUNBOOK_LAB_CRASH_AFTER, or "inside:<step>": the test kills while it waits
    end: str  # the execution's final state
    node_after: str  # "drained" or "in_service"
    trigger: str | None = None  # "fail": a step fails so undo starts; "cancel": cancelled
    person: str | None = None  # held after the crash: "resume" or "cancel"
    extra: tuple[str, ...] = ()  # more key=value parameters

    @property
    def id(self) -> str:
        """drain-node/step_started:wait-idle, resume-node/check_evaluated:post-check, ..."""
        kind, _, name = self.crash.partition(":")
        if kind == "check_evaluated":
            name = "post-check" if name in POST_CHECKS else "pre-check"
        return (f"{self.runbook.name}/{kind}" + (f":{name}" if name else "")
                + (f"+{self.trigger}" if self.trigger else "")
                + (f"+{self.person}" if self.person else ""))

    @property
    def inside(self) -> str | None:
        return self.crash.split(":", 1)[1] if self.crash.startswith("inside:") else None

    @property
    def under_way(self) -> tuple[str, str] | None:
        """(the event that starts it, step) of the step or undo step the engine died in."""
        kind, _, name = self.crash.partition(":")
        if kind in ("inside", "step_started"):
            return "step_started", name
        if kind == "undo_started" and name:
            return "undo_started", name
        return None


# The cases `make test` runs: each kind of boundary once per runbook (before a step, inside a
# waiting step, after a step, at a pre- and a post-check, during undo, held and then resumed
# or cancelled). EXTRA_CASES repeat those paths at the other boundaries (about two more
# minutes): RUNBOOK_SIGKILL_FULL=1 adds them.
CASES = [
    # drain-node: after the pre-check, before a step, inside wait-idle, at the post-check;
    # undo: a cancel while wait-idle waits, and the engine dies in the undo of slurm-drain.
    Case(DRAIN, "check_evaluated:capacity stays above the floor", "succeeded", "drained"),
    Case(DRAIN, "step_started:slurm-drain", "succeeded", "drained"),
    Case(DRAIN, "inside:wait-idle", "succeeded", "drained"),
    Case(DRAIN, "check_evaluated:the node is drained in Slurm and runs no job", "succeeded",
         "drained"),
    Case(DRAIN, "undo_started:slurm-drain", "cancelled", "in_service", trigger="cancel"),
    # drain-nodes: its batches' scontrol run again by the second engine; the engine dies in
    # the undo of a cancelled run, and the second one resumes only what this run drained.
    Case(FLEET, "step_started:slurm-drain", "succeeded", "drained"),
    Case(FLEET, "undo_started:slurm-drain", "cancelled", "in_service", trigger="cancel"),
    # resume-node (the node starts drained): after a step; undo after a failing health check,
    # which drains the node again (never back unchecked).
    Case(RESUME, "step_finished:health-check", "succeeded", "in_service"),
    Case(RESUME, "undo_finished:reserve", "failed", "drained", trigger="fail"),
    # swap-gpu (resume: manual): held after a crash while it runs; a person resumes or
    # cancels it.
    Case(SWAP, "step_finished:reserve", "cancelled", "drained", person="cancel"),
    Case(SWAP, "inside:replaced", "succeeded", "in_service", person="resume"),
    # rollback-driver: no pre-checks, no undo; killed while the rollout drains, reserves,
    # installs, reboots and checks the node.
    Case(ROLLBACK, "inside:rollout", "succeeded", "in_service"),
    # quarantine-node (risk low, no approval): killed once its drain started; the second
    # engine drains again (idempotent) and the node stays out, marked with the execution.
    Case(QUARANTINE, "step_started:slurm-drain", "succeeded", "drained"),
    # nccl-test (risk low): killed as the test starts, the second engine runs it again (it
    # records the baseline) and deletes the reservation; cancelled while the test runs
    # through srun, killed as the undo starts: the second engine deletes the reservation.
    Case(NCCL, "step_started:nccl", "succeeded", "in_service"),
    Case(NCCL, "undo_started:reserve", "cancelled", "in_service", trigger="cancel"),
]
EXTRA_CASES = [
    Case(DRAIN, "step_finished:slurm-drain", "succeeded", "drained"),
    Case(DRAIN, "step_started:wait-idle", "succeeded", "drained"),
    Case(DRAIN, "step_finished:wait-idle", "succeeded", "drained"),
    # (drain-node's failures are left as they are, on_failure: leave: no undo to kill in)
    Case(FLEET, "step_finished:slurm-drain", "succeeded", "drained"),
    Case(FLEET, "inside:wait-idle", "succeeded", "drained"),
    Case(FLEET, "check_evaluated:the nodes are drained in Slurm and run no job", "succeeded",
         "drained"),
    Case(FLEET, "undo_started", "failed", "in_service", trigger="fail", extra=("timeout=10s",)),
    Case(RESUME, "step_started:reserve", "succeeded", "in_service"),
    Case(RESUME, "step_started:health-check", "succeeded", "in_service"),
    Case(RESUME, "check_evaluated:the node is in service in Slurm and not drained",
         "succeeded", "in_service"),
    Case(RESUME, "undo_started", "failed", "drained", trigger="fail"),
    Case(SWAP, "check_evaluated:the node is in service in Slurm and not drained", "succeeded",
         "in_service", person="resume"),
    Case(SWAP, "undo_started", "failed", "drained", trigger="fail"),
    Case(ROLLBACK, "started", "succeeded", "in_service"),
    Case(ROLLBACK, "step_started:rollout", "succeeded", "in_service"),
]
if os.environ.get("RUNBOOK_SIGKILL_FULL"):
    CASES += EXTRA_CASES


# --- set-up shared by the cases ----------------------------------------------------------


@pytest.fixture(scope="module")
def shared(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """One configuration: the lab's, with a short lease so that a takeover is quick."""
    folder = tmp_path_factory.mktemp("sigkill")
    config = yaml.safe_load((lab.dir / "bot.yaml").read_text())
    config["engine"] = {**config.get("engine", {}), "lease_seconds": LEASE_SECONDS,
                        "poll_seconds": POLL_SECONDS, "clock_skew_seconds": CLOCK_SKEW_SECONDS}
    config.pop("slack", None)  # the engines report to their terminal only
    (folder / "bot.yaml").write_text(yaml.safe_dump(config))
    env = {k: v for k, v in lab.env.items()
           if not k.startswith("SLACK_") and k != "RUNBOOK_LAB_CRASH_AFTER"}
    env["RUNBOOK_CONFIG"] = str(folder / "bot.yaml")
    return folder, env


@dataclass
class Run:
    """One case: its own database, the processes it started, the node it puts back."""

    lab: Lab
    case: Case
    folder: Path
    env: dict[str, str]
    bot: Service
    jobs: list[str] = field(default_factory=list)
    processes: list[subprocess.Popen[str]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    execution_id: int = 0
    confirm: bool = False  # answer "GPU replaced?" (chat.confirm) with yes once it is asked
    swapped: bool = False  # the lab's GPU 3 of NODE was swapped before the answer
    standby: subprocess.Popen[str] | None = None  # the second engine

    # --- processes

    def spawn(self, *args: str, crash: str | None = None) -> subprocess.Popen[str]:
        log = self.folder / f"{len(self.logs) + 1}-{args[0]}.log"
        env = dict(self.env)
        if crash:
            env["RUNBOOK_LAB_CRASH_AFTER"] = crash
        with log.open("w") as out:
            process = subprocess.Popen([*RUNBOOK, *args], env=env, stdout=out,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       text=True, start_new_session=True)
        self.processes.append(process)
        self.logs.append(log)
        return process

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*RUNBOOK, *args], env=self.env, capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL, check=False)

    def wait(self, process: subprocess.Popen[str], until: Callable[[], bool] | None = None,
             seconds: float = ENGINE_TIMEOUT) -> bool:
        """Wait until ``until`` holds (True) or the process ended (False), answering the
        confirmation meanwhile when ``confirm`` says so."""
        deadline = time.monotonic() + seconds
        while True:
            if until is not None and until():
                return True
            if process.poll() is not None:
                return False
            if self.confirm:
                self.answer()
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.case.id}: nothing happened within {seconds:g}s\n"
                                     + self.output())
            time.sleep(0.1)

    def stop_standby(self) -> None:
        """Stop the second engine like a person at its terminal (Ctrl-C)."""
        assert self.standby is not None
        if self.standby.poll() is None:
            self.standby.send_signal(signal.SIGINT)
            self.standby.wait(30)
        assert self.standby.returncode in (0, 130), self.output()
        assert "Traceback" not in self.logs[1].read_text(), self.output()

    def output(self) -> str:
        return "\n".join(f"--- {log.name} ---\n{log.read_text(errors='replace')[-4000:]}"
                         for log in self.logs if log.exists())

    # --- the bot's database

    def events(self) -> list[dict[str, Any]]:
        with self.bot.db.connect() as conn:
            return list(audit.events(conn, execution_id=self.execution_id))

    def has(self, kind: str, **data: Any) -> bool:
        return any(e["kind"] == kind and all(e["data"].get(k) == v for k, v in data.items())
                   for e in self.events())

    def state(self) -> executions.Execution:
        with self.bot.db.connect() as conn:
            return executions.get(conn, self.execution_id)

    def lease(self) -> tuple[str | None, float | None]:
        with self.bot.db.connect() as conn:
            row = conn.execute(select(executions_table.c.owner, executions_table.c.lease_until)
                               .where(executions_table.c.id == self.execution_id)).one()
        return row.owner, row.lease_until

    def answer(self) -> None:
        kinds = {e["kind"] for e in self.events()}
        if "confirmation_requested" in kinds and "confirmed" not in kinds:
            if not self.swapped:  # the technician replaces GPU 3 (a new serial and UUID)
                assert self.lab.lab("swap", NODE, "3").returncode == 0
                self.swapped = True
            with contextlib.suppress(Refused):  # not running just now (held, being resumed)
                self.bot.confirm(self.execution_id, "alice", True, "GPU swapped (matrix)")

    # --- the lab

    def node(self) -> dict[str, str]:
        shown = self.lab.run("scontrol", "show", "node", NODE, "-o").stdout
        fields = dict(part.split("=", 1) for part in shown.split() if "=" in part)
        reason = shown.split("Reason=", 1)[1].split(" [")[0] if "Reason=" in shown else ""
        return {"state": fields.get("State", ""), "reason": reason}

    def reservations(self) -> str:
        return self.lab.run("scontrol", "show", "reservation").stdout

    def hold_node(self) -> None:
        """A job on the node that runs until it is cancelled."""
        done = self.lab.run("sbatch", "--parsable", "-o", "/dev/null", "-w", NODE, "-N1",
                            "-J", "sigkill-matrix", "--wrap", "sleep 600")
        assert done.returncode == 0, done.stderr
        job = done.stdout.strip().split(";")[0]
        self.jobs.append(job)
        deadline = time.monotonic() + 30
        while "RUNNING" not in self.lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout:
            assert time.monotonic() < deadline, f"job {job} never started"
            time.sleep(0.1)

    def release(self) -> None:
        for job in self.jobs:
            self.lab.run("scancel", job)

    def put_back(self) -> None:
        """Leave the node as the lab gives it out, whatever the case did."""
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        self.release()
        deadline = time.monotonic() + 30
        while self.jobs and self.lab.run("squeue", "-h", "-w", NODE, "-n",
                                         "sigkill-matrix").stdout.strip():
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        reservation = self.case.runbook.reservation
        if reservation and f"ReservationName={reservation} " in self.reservations():
            self.lab.run("scontrol", "delete", f"ReservationName={reservation}")
        if self.case.runbook is ROLLBACK:
            self.lab.lab("fault", NODE, f"driver={self.lab['default_driver_version']}")
        if self.case.runbook in (ROLLBACK, NCCL) or self.case.trigger == "fail":
            self.lab.lab("fault", NODE, "clear")
        if "DRAIN" in self.node()["state"] or "DOWN" in self.node()["state"]:
            self.lab.run("scontrol", "update", f"NodeName={NODE}", "State=RESUME")
        self.bot.db.dispose()


@pytest.fixture
def run(request: pytest.FixtureRequest, lab: Lab, shared: tuple[Path, dict[str, str]],
        tmp_path: Path) -> Iterator[Run]:
    case: Case = request.param
    folder, env = shared
    url = f"sqlite:///{tmp_path / 'bot.db'}"
    config = load_config(folder / "bot.yaml").model_copy(update={"database_url": url})
    handle = Run(lab, case, tmp_path, {**env, "RUNBOOK_DB_URL": url}, Service.from_config(config))
    handle.bot.runbooks()  # recorded once here, not by two engines starting together
    try:
        yield handle
    finally:
        handle.put_back()


# --- one case ----------------------------------------------------------------------------


def ts(event: dict[str, Any]) -> float:
    return datetime.strptime(event["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
        tzinfo=UTC).timestamp()


def prepare(run: Run) -> None:
    """Put the node in the state the case starts from."""
    case = run.case
    if case.runbook is RESUME:  # serviced: drained by an earlier drain-node (its mark)
        assert run.lab.run("scontrol", "update", f"NodeName={NODE}", "State=DRAIN",
                           "Reason=serviced (execution 1)").returncode == 0
    if case.trigger == "fail" and case.runbook in (RESUME, SWAP):
        assert run.lab.lab("fault", NODE, "health=fail").returncode == 0
    if case.runbook in DRAINS and (case.trigger or case.inside):
        run.hold_node()  # wait-idle waits (fail: beyond its 10 s; cancel: until cancelled)
    if case.runbook is NCCL and case.trigger == "cancel":  # time for the cancel to come in
        assert run.lab.lab("fault", NODE, f"nccl_seconds={NCCL_SECONDS}").returncode == 0


def first_engine(run: Run) -> tuple[str, float]:
    """`runbook run --wait` as alice, approved from elsewhere, with the second engine
    (`runbook engine`) started beside it; the first dies by SIGKILL at the case's boundary.
    Returns the dead engine's name and the end of its last lease."""
    case = run.case
    process = run.spawn("run", case.runbook.name, *case.runbook.params, *case.extra, "--wait",
                        "--as", "alice", crash=None if case.inside else case.crash)
    # Started now, both start up at once. It cannot take the execution while the first
    # engine holds it, and the execution is approved only once the first engine holds it.
    # A risk-low runbook (no approvers) is approved as it is requested: the second engine
    # could claim it before the first, so it starts once the first one holds it.
    early = bool(case.runbook.approvers)
    if early:
        run.standby = run.spawn("engine")
    mine = f":{process.pid}:"
    seen: list[tuple[str, float]] = []

    def held_by_first() -> bool:
        if not run.execution_id:
            first = run.logs[0].read_text().split("\n", 1)[0]
            if first.startswith("execution ") and first[-1:].isdigit():
                run.execution_id = int(first.split()[1])
        if run.execution_id:
            owner, lease_until = run.lease()
            if owner and mine in owner and lease_until:
                seen.append((owner, lease_until))  # the last one is final once it is dead
        return bool(seen)

    assert run.wait(process, held_by_first, 60), run.output()
    if not early:
        run.standby = run.spawn("engine")
    for approver in case.runbook.approvers:
        run.bot.approve(run.execution_id, approver)
    run.confirm = case.inside != "replaced"
    if case.trigger == "cancel" or case.inside:
        step = case.inside or case.runbook.waits
        if step == "wait-idle":  # its first squeue saw the job
            def waiting() -> bool:
                return held_by_first() and "waiting for 1 job" in run.logs[0].read_text()
        elif step == "replaced":
            def waiting() -> bool:
                return held_by_first() and run.has("confirmation_requested", step=step)
        else:  # rollout, nccl: the node is reserved and being worked on (a reboot, srun)
            def waiting() -> bool:
                return held_by_first() and run.has("step_started", step=step) and (
                    f"ReservationName={case.runbook.reservation} " in run.reservations())
        assert run.wait(process, waiting, 90), f"{case.id}: never got there\n{run.output()}"
        if case.trigger == "cancel":
            run.bot.cancel(run.execution_id, "alice")
        else:
            time.sleep(0.2)
            os.killpg(process.pid, signal.SIGKILL)  # the engine and whatever it started
    run.wait(process, lambda: held_by_first() and False)  # (noting its lease until it dies)
    assert process.returncode == -signal.SIGKILL, (
        f"{case.id}: the first engine did not die by SIGKILL ({process.returncode})\n"
        + run.output())
    held_by_first()
    run.confirm = False
    if not case.inside:  # it died right after committing that event
        kind, _, name = case.crash.partition(":")
        last = [e for e in run.events() if e["actor"] == "engine"][-1]
        assert last["kind"] == kind and last["data"].get("step", last["data"].get(
            "check", "")) == name, (case.id, last)
    return seen[-1]


def check_held(run: Run) -> None:
    ex = run.state()
    assert ex.state == "held", f"{run.case.id}: {ex.state}\n{run.output()}"
    why = [e for e in run.events() if e["kind"] == "held"][-1]["data"]["why"]
    assert f"`runbook resume {ex.id}`" in why and f"`runbook cancel {ex.id}`" in why, why
    in_step = [e["data"]["step"] for e in run.events() if e["kind"] == "step_started"]
    if run.case.inside and in_step and in_step[-1] == "replaced":  # died in chat.confirm
        assert "step replaced (chat.confirm) was under way" in why, why
        assert "not idempotent" in why, why
    else:
        assert "resume: manual" in why and f"stopped at stage {ex.stage}" in why, why
    assert f"[{ex.id}] held for a person: " in run.logs[1].read_text(), run.output()
    assert not run.has("resumed"), "a resume: manual execution went on by itself"


def check_runs(run: Run, reran: bool) -> None:
    """Each step and each undo step started once; the one the engine died in started
    again (attempt 2) when it may: it is idempotent, or a person resumed it."""
    case = run.case
    attempts: dict[tuple[str, str], list[int]] = {}
    for event in run.events():
        if event["kind"] in ("step_started", "undo_started") and "step" in event["data"]:
            key = (event["kind"], event["data"]["step"])
            attempts.setdefault(key, []).append(event["data"]["attempt"])
    for key, seen in attempts.items():
        expected = [1, 2] if key == case.under_way and reran else [1]
        assert seen == expected, (case.id, key, seen)


def check_node(run: Run) -> None:
    """The node as the runbook promises (looked at for a few seconds: a resumed node does
    not answer for about a second, a cancelled job takes a moment to go)."""
    case = run.case
    deadline = time.monotonic() + 10
    while True:
        shown = run.node()
        if case.node_after == "drained":
            good = "DRAIN" in shown["state"]
        else:
            good = shown["state"] == "IDLE"
        if good or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert good, (case.id, case.node_after, shown)
    if case.runbook in DRAINS and case.node_after == "drained":  # marked with its execution
        assert shown["reason"] == f"sigkill matrix (execution {run.execution_id})", shown
    if case.runbook is QUARANTINE:
        assert shown["reason"] == f"quarantine: sigkill matrix (execution {run.execution_id})"
    if case.trigger == "fail" and case.runbook in (RESUME, SWAP):
        assert shown["reason"].startswith("health check failed"), shown
    if case.runbook is SWAP and case.end == "cancelled":
        assert shown["reason"] == f"swap GPU 3: XID 79 (execution {run.execution_id})", shown
    if case.runbook.reservation:
        assert f"ReservationName={case.runbook.reservation} " not in run.reservations()
    if case.runbook is ROLLBACK:
        assert run.lab.lab("driver", NODE).stdout.strip() == DRIVER


@pytest.mark.parametrize("run", CASES, ids=[case.id for case in CASES], indirect=True)
def test_sigkill_at_a_boundary_then_another_engine_finishes(run: Run) -> None:
    case = run.case
    prepare(run)
    dead_engine, dead_lease = first_engine(run)
    standby = run.standby
    assert standby is not None  # first_engine started it
    if case.runbook in DRAINS and case.trigger:
        run.release()  # wait-idle gave up on the job, or was cancelled
    if case.inside == "wait-idle":  # wait-idle runs again, and waits for the job again
        assert run.wait(standby, lambda: run.has(
            "step_started", step="wait-idle", attempt=2), 30), run.output()
        run.release()

    run.confirm = not case.runbook.manual
    settled = run.wait(standby, lambda: run.state().state in ENDED)
    assert settled, f"{case.id}: the second engine stopped\n{run.output()}"
    run.stop_standby()
    if case.runbook.manual and not case.trigger:  # held: a person decides
        check_held(run)
        check_runs(run, reran=False)
        assert case.person is not None
        done = run.cli(case.person, str(run.execution_id), "--as", "alice")
        assert done.returncode == 0, done.stderr
        run.confirm = True  # "GPU replaced?", once it is asked again
        engine = run.spawn("engine", "--once")
        run.wait(engine)
        out = run.logs[-1].read_text()
        assert engine.returncode == 0, run.output()
        if case.person == "resume":
            assert f"[{run.execution_id}] resumed at stage" in out, out
        verify = run.cli("audit", "verify")
        assert verify.returncode == 0 and "audit log intact" in verify.stdout, verify.stdout

    ex = run.state()
    assert ex.state == case.end, f"{case.id}: {ex.state}: {ex.error}\n{run.output()}"
    error = ex.error or ""
    if case.runbook is FLEET and case.trigger == "fail":  # drain-node leaves a failure
        assert "step wait-idle failed" in error and "undone: slurm-drain" in error, error
    if case.end == "cancelled":  # (held, then cancelled: the reason said "; undone: ...")
        assert error.startswith("cancelled on request") and "; undone: " in error, error
    events = run.events()
    assert next(e for e in events if e["kind"] == "started")["data"]["engine"] == dead_engine
    if not case.runbook.manual or case.trigger:  # the second engine went on by itself
        resumed = [e for e in events if e["kind"] == "resumed"]
        assert len(resumed) == 1, (case.id, resumed)
        assert resumed[0]["data"]["previous_engine"] == dead_engine
        assert ts(resumed[0]) > dead_lease, "taken over before the dead engine's lease ended"
        if case.under_way:
            kind, step = case.under_way
            assert resumed[0]["data"]["step_under_way"] == step, resumed[0]
            again = next(e for e in events if e["kind"] == kind
                         and e["data"].get("step") == step and e["data"]["attempt"] == 2)
            assert ts(again) >= dead_lease + CLOCK_SKEW_SECONDS, (
                f"{step} ran again {ts(again) - dead_lease:.2f}s after the dead engine's "
                f"lease ended, before the clock skew ({CLOCK_SKEW_SECONDS}s) was over")
    check_runs(run, reran=case.under_way is not None and case.person != "cancel")
    verdict = audit.verify(run.bot.db)
    assert verdict.ok, verdict
    check_node(run)
