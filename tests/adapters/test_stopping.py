"""A stop reaches every waiting action within about a second (safety invariant 5).

Each test starts a wait that would last long (a poll of 30 s or more, a timeout of an hour)
over an in-memory backend with the real ``time.sleep``, asks the context to stop from a
timer thread after 0.2 s (or makes ``cancelled`` answer True), and expects ActionStopped
well within 1.5 s of real time, with nothing changed after the stop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionStopped
from adapters.etcd.actions import EtcdActions
from adapters.etcd.config import EtcdConfig
from adapters.etcd.fake import FakeEtcd
from adapters.kubernetes.actions import KubernetesActions
from adapters.kubernetes.backend import Eviction, Pod
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.fake import FakeKubernetes
from adapters.notify import ConfirmAction
from adapters.prometheus.actions import PrometheusActions
from adapters.prometheus.backend import PrometheusApiBackend, PrometheusUnavailable, Sample
from adapters.prometheus.config import PrometheusConfig
from adapters.prometheus.fake import FakePrometheus
from adapters.slurm.actions import SlurmActions
from adapters.slurm.backend import Job
from adapters.slurm.config import SlurmConfig
from adapters.slurm.fake import FakeSlurm
from adapters.slurm.rolling import DriverRolloutAction
from tests.adapters.test_prometheus import FlakyPrometheus

STOP_AFTER = 0.2  # seconds until the timer asks to stop
PROMPT = 1.5  # the action must have stopped this long after it started


def context(seconds: float = 3600) -> ActionContext:
    return ActionContext(execution_id=1, step_id="s", deadline=time.monotonic() + seconds)


def stopped_promptly(run: Callable[[ActionContext], Any], ctx: ActionContext | None = None,
                     *, by_cancel: bool = False) -> ActionStopped:
    """Run ``run(ctx)``, ask it to stop after STOP_AFTER; its ActionStopped, once it came
    within PROMPT seconds."""
    ctx = ctx or context()
    if by_cancel:
        asked = threading.Event()
        ctx.cancelled = asked.is_set
        timer = threading.Timer(STOP_AFTER, asked.set)
    else:
        timer = threading.Timer(STOP_AFTER, ctx.request_stop, ["cancelled"])
    began = time.monotonic()
    timer.start()
    try:
        with pytest.raises(ActionStopped) as caught:
            run(ctx)
    finally:
        timer.cancel()
    took = time.monotonic() - began
    assert took < PROMPT, f"stopped only after {took:.2f}s"
    return caught.value


def run_action(action: Any, **arguments: Any) -> Callable[[ActionContext], Any]:
    return lambda ctx: action.run(action.Arguments(**arguments), ctx)


# --- Slurm --------------------------------------------------------------------------------

def slurm_actions(backend: FakeSlurm) -> dict[str, Any]:
    return SlurmActions(backend, SlurmConfig(), sleep=time.sleep).by_name()


def busy_slurm() -> FakeSlurm:
    backend = FakeSlurm(["gpu01", "gpu02"])
    backend.running = [Job(77, "train", "alice", "ml", "RUNNING", ["gpu01"])]
    return backend


def test_slurm_wait_idle_stops_within_a_second() -> None:
    backend = busy_slurm()
    wait = slurm_actions(backend)["slurm.wait_idle"]
    error = stopped_promptly(run_action(wait, nodes="gpu01", timeout="1h", poll=30,
                                        requeue=False))
    assert "waiting for jobs on gpu01" in str(error) and "cancelled" in str(error)
    assert backend.calls == [] and [j.id for j in backend.running] == [77]


def test_slurm_wait_idle_stops_when_cancelled_is_set() -> None:
    wait = slurm_actions(busy_slurm())["slurm.wait_idle"]
    error = stopped_promptly(run_action(wait, nodes="gpu01", timeout="1h", poll=30),
                             by_cancel=True)
    assert "the execution was cancelled" in str(error)


def test_slurm_reboot_wait_stops_within_a_second() -> None:
    backend = FakeSlurm(["gpu01"])  # the fake never reboots: the node never comes back
    backend.state["gpu01"] = replace(backend.state["gpu01"], boot_time=1000)
    reboot = slurm_actions(backend)["slurm.reboot"]
    stopped_promptly(run_action(reboot, nodes="gpu01", reason="driver", wait=True,
                                wait_timeout="1h", poll=30))
    assert [c[0] for c in backend.calls] == ["reboot"]


def test_slurm_driver_rollout_stops_leaves_the_node_drained_and_starts_no_other() -> None:
    backend = busy_slurm()
    config = SlurmConfig.model_validate({"commands": {
        "driver-install": {"argv": ["driver-install"], "accepts_args": True},
        "driver-version": {"argv": ["driver-version"]},
        "health-check": {"argv": ["health-check"]}}})
    rollout = DriverRolloutAction(backend, config, sleep=time.sleep)
    error = stopped_promptly(run_action(rollout, nodes="gpu[01-02]", version="550.54.15",
                                        poll=30, node_timeout=3600))
    message = str(error)
    assert "driver rollout stopped: cancelled" in message and "not started: gpu02" in message
    assert [c for c in backend.calls if c[0] in ("update", "srun", "reboot", "create")] == [
        ("update", ["gpu01"], "DRAIN", "driver change -> 550.54.15 (execution 1)"),
        ("update", ["gpu01"], "DRAIN",  # left out: its driver is unknown
         "driver 550.54.15 rollout stopped: cancelled (execution 1: failed check)")]
    assert "DRAIN" not in backend.state["gpu02"].flags


# --- Kubernetes ---------------------------------------------------------------------------

class Kube(FakeKubernetes):
    """Nodes that never get their labels, pods that never leave or are refused eviction."""

    url = "https://kube.invalid"

    def __init__(self, nodes: list[str], pods: list[Pod] | None = None,
                 refuse: bool = False) -> None:
        super().__init__(nodes)
        self.pods = pods or []
        self.refuse = refuse
        self.evictions: list[tuple[str, float]] = []

    def pods_on_node(self, node: str) -> list[Pod]:
        return [p for p in self.pods if p.node == node]

    def list_pods(self, namespace: str | None = None, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[Pod]:
        return []

    def evict(self, namespace: str, name: str, grace_seconds: int | None = None) -> Eviction:
        self.evictions.append((name, time.monotonic()))
        if self.refuse:
            return Eviction("blocked", "inference-pdb", "Cannot evict pod")
        return Eviction("evicted")  # ... but the pod never goes away

    def get_custom_object(self, group: str, version: str, plural: str, name: str,
                          namespace: str | None = None) -> dict[str, Any]:
        return {"spec": {"driver": {"version": "550.54.15"}}}


def kube_actions(backend: Kube, **config: Any) -> dict[str, Any]:
    return KubernetesActions(backend, KubernetesConfig.model_validate(config),
                             sleep=time.sleep).by_name()


def serving_pod(name: str) -> Pod:
    return Pod("serving", name, f"uid-{name}", node="gpu05", phase="Running", ready=True,
               owner_kind="ReplicaSet", owner_name="inference")


def test_k8s_wait_labels_stops_within_a_second() -> None:
    wait = kube_actions(Kube(["gpu05"]))["k8s.wait_labels"]
    stopped_promptly(run_action(wait, node="gpu05", labels={"ready": "yes"}, timeout="1h",
                                poll=30))


@pytest.mark.parametrize("name", ["gpu_operator.wait_upgrade_state",
                                  "gpu_operator.wait_validator"])
def test_gpu_operator_waits_stop_within_a_second(name: str) -> None:
    wait = kube_actions(Kube(["gpu05"]))[name]
    stopped_promptly(run_action(wait, node="gpu05", timeout="1h", poll=30))


def test_k8s_drain_refused_by_a_pdb_stops_and_evicts_nothing_after_the_stop() -> None:
    backend = Kube(["gpu05"], [serving_pod("a"), serving_pod("b")], refuse=True)
    drain = kube_actions(backend, eviction_retry=30)["k8s.drain"]
    ctx = context()
    stopped_promptly(run_action(drain, node="gpu05", timeout="1h"), ctx)
    assert backend.nodes["gpu05"].unschedulable
    assert sorted(name for name, _ in backend.evictions) == ["a", "b"]  # once, before it



# --- Prometheus, etcd, chat ------------------------------------------------------------------

def test_prom_wait_stops_within_a_second() -> None:
    config = PrometheusConfig(url="http://prometheus.invalid:9090")
    stuck = FakePrometheus([Sample({"hostname": "gpu01"}, 5.0)])  # never == 0
    wait = PrometheusActions(config, stuck, sleep=time.sleep).by_name()["prom.wait"]
    stopped_promptly(run_action(wait, query="up", expect="== 0", timeout="1h", poll=30))


@pytest.fixture
def unavailable() -> Iterator[FlakyPrometheus]:
    server = FlakyPrometheus(failures=10_000)  # 503 for ever
    try:
        yield server
    finally:
        server.stop()


def test_prom_wait_stops_during_the_backends_retry_pause(unavailable: FlakyPrometheus) -> None:
    config = PrometheusConfig(url=unavailable.url, timeout=1, retries=5, retry_backoff=30)
    wait = PrometheusActions(config, sleep=time.sleep).by_name()["prom.wait"]
    error = stopped_promptly(run_action(wait, query="up", expect="== 0", timeout="1h",
                                        poll=30))
    assert "cancelled" in str(error)
    assert unavailable.requests == 1  # no retry after the stop


def test_backend_retry_pauses_look_at_stopping(unavailable: FlakyPrometheus) -> None:
    pauses: list[float] = []
    asked = threading.Event()

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 3:
            asked.set()

    backend = PrometheusApiBackend(
        PrometheusConfig(url=unavailable.url, timeout=1, retries=3, retry_backoff=2.5),
        sleep=sleep)
    with backend.interruptible(asked.is_set), \
            pytest.raises(PrometheusUnavailable, match="stopped retrying when asked to stop"):
        backend.query("up")
    assert pauses == [1.0, 1.0, 0.5] and unavailable.requests == 1
    asked.clear()
    pauses.clear()
    with pytest.raises(PrometheusUnavailable, match="4 attempts"):  # outside: as before
        backend.query("up")
    assert pauses == [2.5, 5.0, 10.0]


def test_etcd_health_wait_stops_within_a_second() -> None:
    health = EtcdActions(EtcdConfig(endpoints=["http://e:2379"]),
                         FakeEtcd({}, sick_polls=10**9),
                         sleep=time.sleep).by_name()["etcd.health"]
    stopped_promptly(run_action(health, wait=3600))


class Unanswered:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def ask(self, execution_id: int, step_id: str, question: str) -> None:
        self.asked.append(question)

    def answer(self, execution_id: int, step_id: str) -> tuple[str, str, str] | None:
        return None


@pytest.mark.parametrize("by_cancel", [False, True])
def test_chat_confirm_stops_within_a_second(by_cancel: bool) -> None:
    confirm = ConfirmAction(Unanswered(), sleep=time.sleep)
    error = stopped_promptly(run_action(confirm, question="GPU replaced?", poll=30),
                             by_cancel=by_cancel)
    assert "waiting for an answer to 'GPU replaced?'" in str(error)


def test_pauses_are_at_most_a_second() -> None:
    """With a fake sleep: every pause a waiting action asks for is at most MAX_PAUSE."""
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 5:
            ctx.request_stop("cancelled")

    ctx = context()
    wait: Any = SlurmActions(busy_slurm(), SlurmConfig(), sleep=sleep).by_name()["slurm.wait_idle"]
    with pytest.raises(ActionStopped):
        wait.run(wait.Arguments(nodes="gpu01", timeout="1h", poll=30), ctx)
    assert pauses == [1.0] * 5

