"""The adapter fault matrix against the lab: each external system fails while the bot is
using it, in a step and in a check, and the execution fails closed.

Systems: slurmctld stopped, the Kubernetes API answering 500, the Kubernetes API hanging
(no answer), Prometheus, Alertmanager and etcd stopped. For each, (a) during a step that
uses it and (b) during a post-check that uses it:

- the execution ends ``failed`` (never ``succeeded``), at that step or check;
- its error names the system in an on-call engineer's words;
- what it changed is undone: the Slurm node it drained is back in service and the
  Kubernetes node it cordoned is schedulable again. The fault starts while the step or check
  runs (polling steps and ``for:`` checks are well under way; a one-request step is hit as
  it starts) and the system comes back as undo starts (the engine's progress line
  "undoing completed steps" restores it before the first undo runs);
- two cases keep the system down through undo (slurmctld; a hanging Kubernetes API): the
  undo of the step on that system fails, the execution says UNDO FAILED with that step, and
  the node stays out of service for a person to see once the system is back;
- a hanging Kubernetes API never holds a step or a check past its timeout.

The Kubernetes API also fails (500, then hanging) in the middle of drain-nodes' fleet drain
(k8s.drain_nodes): it fails at that step, and its undo uncordons the node it cordoned.

Every test runbook drains ``gpu04`` in Slurm and cordons ``gpu08`` in Kubernetes (the nodes
the other lab tests use least), then uses the faulty system. Each outage is a few seconds
(slurmctld: Slurm's own clients retry for MessageTimeout - 1 s before they give up, 9 s by
default; the bot's clients read a copy of the lab's slurm.conf which says MessageTimeout=3
while slurmctld is stopped, so 2 s); every fault is undone in a finaliser, which waits
until the daemon is ready again.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapters.host import HostCommand
from bot.config import EngineConfig, load_config
from bot.execution.engine import Engine
from bot.execution.executions import Execution
from bot.service import Service
from bot.store import audit
from tests.lab.fixture import Lab, SlurmClients, slurm_clients
from tests.lab.kubehelp import api, wait_until

pytestmark = pytest.mark.lab

SLURM_NODE = "gpu04"
KUBE_NODE = "gpu08"
REASON = "fault matrix"
WAIT_LABEL = "lab.gpu-runbook-bot/fault-matrix"  # a label nobody sets: k8s.wait_labels polls
UNDOING = "undoing completed steps"
HANG_STEP_TIMEOUT = 4.0  # seconds; the lab's kubernetes.request_timeout is 5 s
SLACK = 1.5  # seconds an execution may overrun a timeout by (the engine looks every 0.5 s)

# --- faults ---------------------------------------------------------------------------


def _ok(done: Any) -> None:
    assert done.returncode == 0, f"{done.args}: {done.stdout}{done.stderr}"


def kube_answers(lab: Lab) -> bool:
    try:
        return api(lab, "GET", "/version", timeout=2)[0] == 200
    except OSError:
        return False


@dataclass(frozen=True)
class Fault:
    """One way a system fails: ``begin`` breaks it, ``end`` brings it back and waits until
    it is ready (idempotent: the finaliser calls it again)."""

    name: str
    begin: Callable[[Lab], None]
    end: Callable[[Lab], None]


def stopped(service: str) -> Fault:
    return Fault(f"{service} stopped",
                 lambda lab: _ok(lab.lab("service", service, "stop")),
                 lambda lab: _ok(lab.lab("service", service, "start")))


def kube_api(mode: str) -> Fault:
    def end(lab: Lab) -> None:
        _ok(lab.lab("fault", "kube", "api=ok"))
        wait_until(lambda: kube_answers(lab), "the Kubernetes API to answer", timeout=30)

    return Fault(f"Kubernetes API {mode}", lambda lab: _ok(lab.lab("fault", "kube",
                                                                   f"api={mode}")), end)


SLURMCTLD = stopped("slurmctld")
KUBE_500 = kube_api("500")
KUBE_HANG = kube_api("hang")
PROMETHEUS = stopped("prometheus")
ALERTMANAGER = stopped("alertmanager")
ETCD = stopped("etcd")

# --- runbooks -------------------------------------------------------------------------

DRAIN = {"id": "slurm-drain", "action": "slurm.drain",
         "with": {"nodes": SLURM_NODE, "reason": REASON},
         "undo": {"action": "slurm.resume", "with": {"nodes": SLURM_NODE}}, "timeout": "60s"}
CORDON = {"id": "k8s-cordon", "action": "k8s.cordon", "with": {"node": KUBE_NODE},
          "undo": {"action": "k8s.uncordon", "with": {"node": KUBE_NODE}},
          "timeout": f"{HANG_STEP_TIMEOUT:g}s"}
CHANGES_DONE = "step k8s-cordon: done"  # the progress line after the last changing step
# drain-nodes' Kubernetes step over the node: it cordons it (annotated with the execution)
# and evicts its serving pods one by one (the PodDisruptionBudget lets one go at a time),
# so the fault lands mid-drain; its undo uncordons what this run cordoned.
FLEET_DRAIN = {"id": "k8s-fleet", "action": "k8s.drain_nodes",
               "with": {"nodes": KUBE_NODE, "max_parallel": 1, "evictions_per_second": 1,
                        "timeout": "60s"},
               "undo": {"action": "k8s.undrain_nodes", "with": {"nodes": KUBE_NODE}},
               "undo_if_failed": True, "timeout": f"{HANG_STEP_TIMEOUT:g}s"}


def runbook(name: str, step: dict[str, Any] | None = None,
            check: dict[str, Any] | None = None,
            changes: tuple[dict[str, Any], ...] = (DRAIN, CORDON)) -> dict[str, Any]:
    return {
        "name": name, "version": "1.0.0", "risk": "low",
        "summary": "fault matrix: drain and cordon, then use one system",
        # the drain and the cordon take GPUs out: a runbook must guard them (the site floor)
        "pre_checks": [{"name": "capacity", "capacity": {
            "pool_of": f"{SLURM_NODE},{KUBE_NODE}", "min_free_gpus_after": 0}}],
        "steps": [*changes, *([step] if step else [])],
        "post_checks": [check] if check else [],
    }


def holding(name: str, **spec: Any) -> dict[str, Any]:
    """A post-check that must hold for 8 s: the fault lands while it is being held."""
    return {"name": name, "for": "8s", **spec}


@dataclass(frozen=True)
class Case:
    id: str
    fault: Fault
    runbook: dict[str, Any]
    trigger: str  # the progress line (prefix) after which the fault begins
    delay: float  # seconds after it (0: at once, in the engine's thread, before the action)
    failed_at: str  # how the error starts: "step X failed" or "post-check 'Y' failed"
    names: tuple[str, ...]  # words the error must contain: the system, in people's words
    back_before_undo: bool = True
    undo_fails: str | None = None  # the step whose undo fails when the system stays down
    max_seconds: float | None = None  # from the trigger to the failure: a hang is bounded


CASES = [
    Case("slurmctld-step", SLURMCTLD, runbook("fm-slurm-step", step={
        "id": "wait-idle", "action": "slurm.wait_idle",
        "with": {"nodes": SLURM_NODE, "timeout": "60s", "poll": "0.5s"}, "timeout": "60s"}),
        "step wait-idle: running", 1.0, "step wait-idle failed", ("slurmctld",)),
    # slurmctld during a check: the case below (each slurmctld outage costs 10-15 s, so
    # the check case with slurmctld back before undo is left to the step case's undo)
    Case("slurmctld-down-through-undo", SLURMCTLD, runbook("fm-slurm-undo", check=holding(
        "the node is drained", slurm={"nodes": SLURM_NODE, "state": "drained"})),
        CHANGES_DONE, 1.0, "post-check 'the node is drained' failed", ("slurmctld",),
        back_before_undo=False, undo_fails="slurm-drain"),
    Case("kube-500-step", KUBE_500, runbook("fm-kube500-step", step={
        "id": "k8s-wait", "action": "k8s.wait_labels",
        "with": {"node": KUBE_NODE, "labels": {WAIT_LABEL: "never"}, "timeout": "60s",
                 "poll": "0.5s"}, "timeout": "30s"}),
        "step k8s-wait: running", 1.0, "step k8s-wait failed", ("Kubernetes API", "500")),
    Case("kube-500-check", KUBE_500, runbook("fm-kube500-check", check=holding(
        "GPUs left in the pool", capacity={"pool_of": KUBE_NODE, "min_free_gpus_after": 0})),
        CHANGES_DONE, 1.0, "post-check 'GPUs left in the pool' failed",
        ("Kubernetes API", "500")),
    Case("kube-hang-step", KUBE_HANG, runbook("fm-kubehang-step", step={
        "id": "k8s-wait", "action": "k8s.wait_labels",
        "with": {"node": KUBE_NODE, "labels": {WAIT_LABEL: "never"}, "timeout": "60s",
                 "poll": "0.5s"}, "timeout": f"{HANG_STEP_TIMEOUT:g}s"}),
        "step k8s-wait: running", 1.0, "step k8s-wait failed", ("Kubernetes API",),
        max_seconds=HANG_STEP_TIMEOUT + SLACK),
    Case("kube-hang-check", KUBE_HANG, runbook("fm-kubehang-check", check=holding(
        "GPUs left in the pool", timeout="3s",
        capacity={"pool_of": KUBE_NODE, "min_free_gpus_after": 0})),
        CHANGES_DONE, 1.0, "post-check 'GPUs left in the pool' failed",
        ("Kubernetes API", "no answer within 3s"),  # the check's timeout, not the client's
        max_seconds=2 + 3 + SLACK),  # the next poll (2 s), then the check's timeout
    Case("kube-hang-through-undo", KUBE_HANG, runbook("fm-kubehang-undo", step={
        "id": "k8s-wait", "action": "k8s.wait_labels",
        "with": {"node": KUBE_NODE, "labels": {WAIT_LABEL: "never"}, "timeout": "60s",
                 "poll": "0.5s"}, "timeout": f"{HANG_STEP_TIMEOUT:g}s"}),
        "step k8s-wait: running", 1.0, "step k8s-wait failed", ("Kubernetes API",),
        back_before_undo=False, undo_fails="k8s-cordon",
        max_seconds=HANG_STEP_TIMEOUT + SLACK),
    # the fleet drain (drain-nodes) hit mid-drain: by errors, and by a hang bounded by the
    # step's timeout; either way the undo uncordons the node it cordoned
    Case("kube-500-fleet-drain", KUBE_500, runbook("fm-kube500-fleet", changes=(
        DRAIN, FLEET_DRAIN)), "step k8s-fleet: running", 1.0, "step k8s-fleet failed",
        ("Kubernetes API", "500")),
    Case("kube-hang-fleet-drain", KUBE_HANG, runbook("fm-kubehang-fleet", changes=(
        DRAIN, FLEET_DRAIN)), "step k8s-fleet: running", 1.0, "step k8s-fleet failed",
        ("Kubernetes API",), max_seconds=HANG_STEP_TIMEOUT + SLACK),
    Case("prometheus-step", PROMETHEUS, runbook("fm-prom-step", step={
        "id": "prom-wait", "action": "prom.wait",
        "with": {"query": f'max(DCGM_FI_DEV_GPU_TEMP{{Hostname="{SLURM_NODE}"}})',
                 "expect": "> 1000", "timeout": "4s", "poll": "0.5s"}, "timeout": "20s"}),
        "step prom-wait: running", 1.0, "step prom-wait failed", ("Prometheus",)),
    Case("prometheus-check", PROMETHEUS, runbook("fm-prom-check", check=holding(
        "GPUs below 1000 C", promql=f'max(DCGM_FI_DEV_GPU_TEMP{{Hostname="{SLURM_NODE}"}})',
        expect="< 1000")),
        CHANGES_DONE, 1.0, "post-check 'GPUs below 1000 C' failed", ("Prometheus",)),
    Case("alertmanager-step", ALERTMANAGER, runbook("fm-am-step", step={
        "id": "silence", "action": "alertmanager.silence",
        "with": {"matchers": {"node": SLURM_NODE, "fault_matrix": "step"},
                 "duration": "5m", "comment": REASON}, "timeout": "20s"}),
        "step silence: running", 0.0, "step silence failed", ("Alertmanager",)),
    Case("alertmanager-check", ALERTMANAGER, runbook("fm-am-check", check=holding(
        "no critical alert", alerts={"node": SLURM_NODE, "fault_matrix": "check"})),
        CHANGES_DONE, 1.0, "post-check 'no critical alert' failed", ("Alertmanager",)),
    Case("etcd-step", ETCD, runbook("fm-etcd-step", step={
        "id": "snapshot", "action": "etcd.snapshot_save",
        "with": {"path": "{{ snapshot }}"}, "timeout": "20s"}),
        "step snapshot: running", 0.0, "step snapshot failed", ("etcd",)),
    Case("etcd-check", ETCD, runbook("fm-etcd-check", check=holding(
        "the cluster store answers", command="store-health", expect="== 0")),
        CHANGES_DONE, 1.0, "post-check 'the cluster store answers' failed", ("etcd",)),
]


# --- driving ----------------------------------------------------------------------------


@dataclass
class Injector:
    """Plays the fault from the engine's progress lines (the reporter runs in the engine's
    thread, so what it does at "undoing completed steps" happens before the first undo)."""

    lab: Lab
    case: Case
    clients: SlurmClients  # the bot's slurm.conf: impatient while slurmctld is stopped
    lines: list[tuple[float, str]] = field(default_factory=list)
    began: float | None = None  # when the fault was in place
    triggered: float | None = None
    ended: bool = False
    _thread: threading.Thread | None = None
    _error: list[BaseException] = field(default_factory=list)

    def _begin(self) -> None:
        try:
            if self.case.fault is SLURMCTLD:  # every Slurm client started from now on
                self.clients.impatient()
            self.case.fault.begin(self.lab)
            self.began = time.monotonic()
        except BaseException as exc:  # reported by the test
            self._error.append(exc)

    def report(self, execution_id: int, line: str) -> None:
        self.lines.append((time.monotonic(), line))
        if self.triggered is None and line.startswith(self.case.trigger):
            self.triggered = time.monotonic()
            if self.case.delay:
                def later() -> None:
                    time.sleep(self.case.delay)
                    self._begin()
                self._thread = threading.Thread(target=later, daemon=True)
                self._thread.start()
            else:
                self._begin()
        if line.startswith(UNDOING) and self.case.back_before_undo:
            try:
                self.end()
            except BaseException as exc:  # never into the engine: the test reports it
                self._error.append(exc)

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(60)
        if self._error:
            raise self._error[0]

    def end(self) -> None:
        if self._thread is not None:  # never start the system while it is being stopped
            self._thread.join(60)
        self.clients.patient()
        self.case.fault.end(self.lab)
        self.ended = True


def drive(bot: Service, injector: Injector, runbook_name: str,
          params: dict[str, str]) -> Execution:
    execution_id = bot.request(runbook_name, params, "alice")
    assert bot.get(execution_id).state == "approved"  # risk low: no approval needed
    engine = Engine(bot, report=injector.report)
    result: dict[str, Execution] = {}
    worker = threading.Thread(target=lambda: result.update(ex=engine.drive(execution_id)))
    worker.start()
    try:
        worker.join(180)
    finally:
        engine.close()
    assert not worker.is_alive(), "the execution hung"
    assert audit.verify(bot.db).ok
    return result["ex"]


def events(bot: Service, execution_id: int) -> list[dict[str, Any]]:
    with bot.db.connect() as conn:
        return list(audit.events(conn, execution_id=execution_id))


def slurm_state(lab: Lab) -> str:
    done = lab.run("scontrol", "show", "node", SLURM_NODE, "-o")
    assert done.returncode == 0, done.stderr
    fields = dict(p.split("=", 1) for p in done.stdout.split() if "=" in p)
    return fields.get("State", "")


def cordoned(lab: Lab) -> bool:
    code, body = api(lab, "GET", f"/api/v1/nodes/{KUBE_NODE}")
    assert code == 200, body
    return bool(body["spec"].get("unschedulable"))


def put_back(lab: Lab) -> None:
    """The nodes as the other tests expect them, whatever the test did."""
    lab.run("scontrol", "update", f"NodeName={SLURM_NODE}", "State=RESUME")
    api(lab, "PATCH", f"/api/v1/nodes/{KUBE_NODE}", {"spec": {"unschedulable": None}},
        ctype="application/merge-patch+json")


@pytest.fixture
def clients(lab: Lab, tmp_path: Path) -> SlurmClients:
    return slurm_clients(lab, tmp_path / "slurm-clients")


@pytest.fixture
def bot(lab: Lab, tmp_path: Path, clients: SlurmClients) -> Service:
    folder = tmp_path / "runbooks"
    folder.mkdir()
    for case in CASES:
        book = case.runbook
        if case.id == "etcd-step":
            book = {**book, "params": {"snapshot": {"type": "text", "required": True}}}
        (folder / f"{book['name']}.yaml").write_text(yaml.safe_dump(book, sort_keys=False))
    config = load_config(lab.dir / "bot.yaml")
    # etcd as a check sees it: a site's health command (etcdctl speaks API 3 by default)
    etcdctl = shutil.which("etcdctl", path=lab.env["PATH"]) or "etcdctl"
    commands = {**config.host_commands, "store-health": HostCommand(
        argv=[etcdctl, f"--endpoints={lab['etcd']['endpoint']}", "endpoint", "health",
              "--command-timeout=2s"], timeout=5)}  # no description: the failure names it
    assert config.slurm is not None
    return Service.from_config(config.model_copy(update={
        "database_url": f"sqlite:///{tmp_path / 'bot.db'}", "runbook_paths": [folder],
        "host_commands": commands,
        "slurm": config.slurm.model_copy(update={"slurm_conf": str(clients.path)}),
        "engine": EngineConfig(lease_seconds=10, poll_seconds=0.1)}))


@pytest.fixture
def job_on_node(lab: Lab) -> Iterator[str]:
    """A job running on the Slurm node, so slurm.wait_idle keeps polling."""
    job = lab.run("sbatch", "--parsable", "-o", "/dev/null", "-w", SLURM_NODE, "-N1",
                  "-J", "fault-matrix", "--wrap", "sleep 120").stdout.strip()
    assert job, "sbatch gave no job id"
    try:
        wait_until(lambda: "RUNNING" in lab.run("squeue", "-h", "-j", job, "-o", "%T").stdout,
                   "the job to start", timeout=30, every=0.2)
        yield job
    finally:
        lab.run("scancel", job)


def prometheus_has_data(lab: Lab) -> bool:
    query = urllib.parse.quote(f'DCGM_FI_DEV_GPU_TEMP{{Hostname="{SLURM_NODE}"}}')
    url = f"{lab['monitoring']['prometheus_url']}/api/v1/query?query={query}"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(json.loads(response.read())["data"]["result"])
    except OSError:
        return False


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_fault_fails_closed_and_undoes(lab: Lab, bot: Service, case: Case, tmp_path: Path,
                                       clients: SlurmClients,
                                       request: pytest.FixtureRequest) -> None:
    wait_until(lambda: "DRAIN" not in slurm_state(lab) and not cordoned(lab),
               f"{SLURM_NODE} in service and {KUBE_NODE} schedulable", timeout=60, every=0.5)
    if case.id == "slurmctld-step":
        request.getfixturevalue("job_on_node")
    if case.fault is PROMETHEUS:
        wait_until(lambda: prometheus_has_data(lab), "Prometheus to have data", timeout=30)
    params = {"snapshot": str(tmp_path / "snap.db")} if case.id == "etcd-step" else {}
    injector = Injector(lab, case, clients)
    try:
        ex = drive(bot, injector, case.runbook["name"], params)
        injector.join()
    finally:
        if not injector.ended:
            injector.end()  # the system back, and ready, whatever happened
    try:
        check_outcome(lab, bot, case, injector, ex)
    finally:
        put_back(lab)


def when(injector: Injector, *prefixes: str) -> float:
    """When the engine reported the first line starting with one of ``prefixes``."""
    return next(t for t, line in injector.lines if line.startswith(prefixes))


def check_outcome(lab: Lab, bot: Service, case: Case, injector: Injector, ex: Execution) -> None:
    shown = "\n".join(line for _, line in injector.lines)
    error = ex.error or ""
    assert injector.began is not None, f"the fault never began:\n{shown}"
    # (1) fails closed, at the step or check the fault hit
    assert ex.state == "failed", f"{ex.state}: {error}\n{shown}"
    assert error.startswith(case.failed_at), error
    reason = error.split("; undone", 1)[0].split("; UNDO FAILED", 1)[0]
    # (2) the reason names the system
    for words in case.names:
        assert words in reason, f"{words!r} not in: {reason}"
    if case.failed_at.startswith("post-check"):
        assert "stopped holding" in reason, reason  # it passed, then the fault hit it
    elif case.delay:  # a polling step: it had polled (and reported so) before the fault
        step = case.failed_at.split()[1]
        polled = [line for t, line in injector.lines if t < injector.began
                  and line.startswith(f"step {step}: ")
                  and not line.startswith(f"step {step}: running")]
        assert polled, f"step {step} had not polled before the fault:\n{shown}"
    kinds = [(e["kind"], e["data"].get("step")) for e in events(bot, ex.id)]
    # (3) a hang never holds the execution past the step's (or check's) timeout: a step
    # ends by its timeout after it started; a check by its next poll plus its timeout
    if case.max_seconds is not None:
        failed_at = when(injector, f"step {case.failed_at.split()[1]}: failed", "post-check")
        start = injector.triggered if case.failed_at.startswith("step") else injector.began
        assert start is not None
        took = failed_at - start
        assert took <= case.max_seconds, f"took {took:.1f}s (at most {case.max_seconds}s)"
    if case.undo_fails == "k8s-cordon":  # and the undo of a step by its timeout too
        took = when(injector, "step k8s-cordon (undo): failed") - when(injector, UNDOING)
        assert took <= HANG_STEP_TIMEOUT + SLACK, f"the undo took {took:.1f}s"
    # (4) undone: back in service once the system is back, or UNDO FAILED for a person
    if case.undo_fails is None:
        changed = [step["id"] for step in case.runbook["steps"] if "undo" in step]
        assert "UNDO FAILED" not in error, error
        assert f"undone: {', '.join(reversed(changed))}" in error, error
        for step_id in changed:
            assert ("undo_finished", step_id) in kinds, kinds
    else:
        other = {"slurm-drain": "k8s-cordon", "k8s-cordon": "slurm-drain"}[case.undo_fails]
        failed = error.split("; UNDO FAILED (needs a person): ", 1)
        assert len(failed) == 2 and failed[1].startswith(f"{case.undo_fails}: "), error
        for words in case.names:
            assert words in failed[1], f"{words!r} not in: {failed[1]}"
        assert f"undone: {other}" in error, error
        assert ("undo_failed", case.undo_fails) in kinds, kinds
        # The system is back now, and what the undo could not do is still there to see.
        if case.undo_fails == "slurm-drain":
            assert "DRAIN" in slurm_state(lab), "the drained node should wait for a person"
            shown_node = lab.run("scontrol", "show", "node", SLURM_NODE).stdout
            assert f"Reason={REASON}" in shown_node, shown_node
            assert not cordoned(lab)
        else:
            assert cordoned(lab), "the cordoned node should wait for a person"
            assert "DRAIN" not in slurm_state(lab)
        return
    assert "DRAIN" not in slurm_state(lab), slurm_state(lab)
    assert not cordoned(lab)
