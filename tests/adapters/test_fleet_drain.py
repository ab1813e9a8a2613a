"""``k8s.drain_nodes`` / ``k8s.undrain_nodes`` and ``slurm.drain_batches`` /
``slurm.resume_batches`` on the in-memory fakes, on a fake clock: batches and one scontrol
per batch, nodes drained in parallel within one eviction budget, a PodDisruptionBudget that
blocks one node while the others finish, a cancel and a failure that leave exactly this
run's nodes to undo, and a model-based test of the fleet drain's invariants."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from adapters.actions import ActionContext, ActionError, ActionStopped, ActionTimeout
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.fleet_drain import (
    DrainNodesAction,
    DrainNodesArguments,
    EvictionBudget,
    UndrainNodesAction,
    UndrainNodesArguments,
    _Fleet,
)
from adapters.slurm.config import SlurmConfig
from adapters.slurm.fake import FakeSlurm
from adapters.slurm.fleet import (
    DrainBatchesAction,
    DrainBatchesArguments,
    ResumeBatchesAction,
    ResumeBatchesArguments,
)
from tests.adapters.fleetfakes import Clock, PdbKube, clock, context, max_in_a_second

__all__ = ["clock"]  # the fixture, used by name
NODES = [f"gpu{i:02d}" for i in range(1, 9)]
CONFIG = KubernetesConfig(eviction_retry=2.0)


def drain(kube: PdbKube, clock: Clock, ctx: ActionContext, **args: Any) -> Any:
    action = DrainNodesAction(kube, CONFIG, clock.sleep)
    return action.run(DrainNodesArguments.model_validate({"nodes": "gpu[01-08]", **args}), ctx)


def undrain(kube: PdbKube, clock: Clock, ctx: ActionContext, nodes: str = "gpu[01-08]") -> Any:
    return UndrainNodesAction(kube, CONFIG, clock.sleep).run(
        UndrainNodesArguments(nodes=nodes), ctx)


def busiest(statuses: list[dict[str, Any]]) -> int:
    """The most nodes draining (or blocked) at once in the published node states."""
    return max(sum(int(count) for state, count, _ in s["states"]
                   if state in ("draining", "blocked by PDB")) for s in statuses)


def test_plan_shows_the_set_the_parallelism_and_the_budget() -> None:
    lines = DrainNodesAction(PdbKube(NODES, Clock()), CONFIG).plan(DrainNodesArguments(
        nodes="gpu[01-08]", max_parallel=4, evictions_per_second=3))
    assert lines[0].startswith("kubectl drain gpu[01-08] --ignore-daemonsets")
    assert "8 node(s), up to 4 at once" in lines[0] and "at most 3 evictions/s" in lines[0]
    assert "cordoned-by=execution-<this execution>" in lines[1]


def test_nodes_drain_in_parallel_within_the_eviction_budget(clock: Clock) -> None:
    kube = PdbKube(NODES, clock, linger=1.5)
    for node in NODES:
        kube.add_pods(node, 5)
    statuses: list[dict[str, Any]] = []
    lines: list[str] = []
    result = drain(kube, clock, context(clock, statuses=statuses, lines=lines),
                   max_parallel=4, evictions_per_second=3)
    assert [p for p in kube.pods if p.node in NODES] == []
    assert set(kube.cordoned()) == set(NODES)
    assert set(kube.cordoned().values()) == {"execution-7"}
    times = [at for at, _ in kube.evictions]
    assert len(times) == 40 and max_in_a_second(times) <= 3
    assert max_in_a_second(times) == 3  # the budget is used, not just respected
    assert 2 <= busiest(statuses) <= 4  # parallel, never more than max_parallel
    assert sum(kube.calls.values()) <= 3 * 40  # at most ~3 API calls per pod
    assert len(lines) <= 2  # no line per node or pod in the thread
    assert statuses[-1]["states"][0] == ["drained", 8, "gpu[01-08]"]
    assert result.details["cordoned"] == NODES and result.changed


def test_a_pdb_blocks_one_node_while_the_others_drain(clock: Clock) -> None:
    kube = PdbKube(NODES, clock)
    for node in NODES:
        kube.add_pods(node, 2)
    kube.blocked.add("gpu03-p1")
    statuses: list[dict[str, Any]] = []
    with pytest.raises(ActionTimeout) as caught:
        drain(kube, clock, context(clock, statuses=statuses), max_parallel=3, timeout=60)
    message = str(caught.value)
    assert "draining when it stopped: gpu03" in message
    assert "serving/gpu03-p1 blocked by PodDisruptionBudget serving/serving-pdb" in message
    assert "drained: gpu[01-02,04-08]" in message
    assert "gpu03: 1 pod(s) still on the node" in message
    # what the fleet's undo does, not a single node's (k8s.uncordon) text
    assert "The undo uncordons the nodes this run cordoned" in message
    assert "k8s.uncordon" not in message and "stays cordoned" not in message
    assert [p.name for p in kube.pods] == ["gpu03-p1"]
    blocked = [s for s in statuses if ["blocked by PDB", 1, "gpu03"] in s["states"]]
    assert blocked and "gpu03" in blocked[-1]["notes"]
    retries = [at for at, name in kube.evictions if name == "gpu03-p1"]
    assert len(retries) >= 20 and min(b - a for a, b in itertools.pairwise(retries)) >= 2.0


def test_a_cancel_midway_stops_evicting_and_the_undo_uncordons_only_this_runs_nodes(
        clock: Clock) -> None:
    kube = PdbKube(NODES, clock, linger=3.0)
    for node in NODES:
        kube.add_pods(node, 3)
    kube.patch_node("gpu02", {"spec": {"unschedulable": True}})  # someone else's cordon
    ctx = context(clock)
    stop_at = clock.now + 4.0
    ctx.cancelled = lambda: clock.now >= stop_at
    with pytest.raises(ActionStopped) as caught:
        drain(kube, clock, ctx, max_parallel=2, evictions_per_second=2)
    # 2 nodes at once, 3 pods each at 2 evictions/s, a pod gone 3 s after its eviction
    assert "draining when it stopped: gpu[01-02]" in str(caught.value)
    assert "not started: gpu[03-08]" in str(caught.value)
    assert max(at for at, _ in kube.evictions) < stop_at  # nothing after the stop
    ours = {n for n, owner in kube.cordoned().items() if owner == "execution-7"}
    assert ours == {"gpu01"} and set(kube.cordoned()) == {"gpu01", "gpu02"}
    undone = undrain(kube, clock, context(clock))
    assert set(undone.details["uncordoned"]) == ours
    assert kube.cordoned() == {"gpu02": None}  # the other person's cordon stays


def test_a_failed_node_stops_the_set_naming_done_failed_and_not_started(clock: Clock) -> None:
    kube = PdbKube(NODES, clock)
    for node in NODES:
        kube.add_pods(node, 1)
    kube.add_pods("gpu03", 1, owner=None)  # a bare pod: not evicted without force
    with pytest.raises(ActionError) as caught:
        drain(kube, clock, context(clock), max_parallel=1)
    message = str(caught.value)
    assert message.startswith("drain of gpu03 failed: pods no controller manages")
    assert "drained: gpu[01-02]" in message and "failed: gpu03" in message
    assert "not started: gpu[04-08]" in message
    assert set(kube.cordoned()) == {"gpu01", "gpu02"}  # gpu03 refused before its cordon
    undrain(kube, clock, context(clock))
    assert kube.cordoned() == {}


def test_an_unknown_node_changes_nothing(clock: Clock) -> None:
    kube = PdbKube(NODES, clock)
    with pytest.raises(ActionError, match=r"no node gpu09.*nothing was changed"):
        drain(kube, clock, context(clock), nodes="gpu[08-09]")
    assert kube.cordoned() == {} and kube.calls["patch_node"] == 0


def test_undrain_of_another_execution_leaves_the_nodes_alone(clock: Clock) -> None:
    kube = PdbKube(NODES, clock)
    drain(kube, clock, context(clock, execution_id=7))
    result = undrain(kube, clock, context(clock, execution_id=8))
    assert not result.changed and len(kube.cordoned()) == 8


def test_a_rerun_after_a_crash_still_owns_its_cordons(clock: Clock) -> None:
    kube = PdbKube(NODES, clock)
    drain(kube, clock, context(clock))
    again = drain(kube, clock, context(clock))  # the engine runs the step again
    assert again.changed and again.details["cordoned"] == NODES
    assert kube.calls["patch_node"] == 8  # nothing cordoned twice


def test_the_budget_allows_at_most_n_calls_in_any_second() -> None:
    now = [0.0]
    budget = EvictionBudget(3, clock=lambda: now[0])
    taken = []
    while now[0] < 5:
        if budget.take():
            taken.append(now[0])
        now[0] = round(now[0] + 0.05, 2)
    assert max_in_a_second(taken) == 3 and len(taken) == 15


# --- Slurm: batches, one scontrol each --------------------------------------------------

def slurm_ctx(execution_id: int = 7, stop_after: int | None = None,
              slurm: FakeSlurm | None = None) -> ActionContext:
    ctx = ActionContext(execution_id=execution_id, step_id="slurm-drain", deadline=1e18)
    if stop_after is not None and slurm is not None:
        ctx.cancelled = lambda: len([c for c in slurm.calls if c[0] == "update"]) >= stop_after
    return ctx


def test_drain_batches_one_scontrol_per_batch_and_marks_the_reason() -> None:
    slurm = FakeSlurm([f"gpu{i:02d}" for i in range(1, 11)])
    slurm.update_nodes(["gpu02"], "DRAIN", "someone else")
    slurm.calls.clear()
    action = DrainBatchesAction(slurm, SlurmConfig())
    args = DrainBatchesArguments(nodes="gpu[01-10]", reason="rack 3", batch_size=4)
    plan = action.plan(args)
    assert plan[:3] == [
        'scontrol update NodeName=gpu[01-04] State=DRAIN Reason="rack 3 (execution <this '
        'execution>)"', 'scontrol update NodeName=gpu[05-08] State=DRAIN Reason="rack 3 '
        '(execution <this execution>)"', 'scontrol update NodeName=gpu[09-10] State=DRAIN '
        'Reason="rack 3 (execution <this execution>)"']
    result = action.run(args, slurm_ctx())
    assert slurm.calls == [
        ("update", ["gpu01", "gpu03", "gpu04"], "DRAIN", "rack 3 (execution 7)"),
        ("update", ["gpu05", "gpu06", "gpu07", "gpu08"], "DRAIN", "rack 3 (execution 7)"),
        ("update", ["gpu09", "gpu10"], "DRAIN", "rack 3 (execution 7)")]
    assert result.details["already_drained"] == ["gpu02"]
    assert slurm.state["gpu02"].reason == "someone else"
    # the status counts only what this run drained (not someone else's drain)
    assert result.details["status"]["states"][:2] == [
        ["drained", 9, "gpu[01,03-10]"], ["drained already (not by this run)", 1, "gpu02"]]


def test_drain_batches_run_again_after_a_crash_calls_nothing_and_still_owns_them() -> None:
    slurm = FakeSlurm(["gpu01", "gpu02", "gpu03"])
    action = DrainBatchesAction(slurm, SlurmConfig())
    args = DrainBatchesArguments(nodes="gpu[01-03]", reason="r", batch_size=2)
    action.run(args, slurm_ctx())
    slurm.calls.clear()
    again = action.run(args, slurm_ctx())
    assert slurm.calls == [] and again.changed
    assert again.details["drained"] == ["gpu01", "gpu02", "gpu03"]


def test_resume_batches_of_this_run_leaves_other_drains() -> None:
    slurm = FakeSlurm([f"gpu{i:02d}" for i in range(1, 7)])
    slurm.update_nodes(["gpu02"], "DRAIN", "someone else")
    DrainBatchesAction(slurm, SlurmConfig()).run(
        DrainBatchesArguments(nodes="gpu[01-06]", reason="r", batch_size=2), slurm_ctx())
    slurm.update_nodes(["gpu06"], "DRAIN", "r (execution 8)")  # another run's drain
    slurm.calls.clear()
    undo = ResumeBatchesAction(slurm, SlurmConfig())
    result = undo.run(ResumeBatchesArguments(nodes="gpu[01-06]", batch_size=2,
                                             only_this_run=True), slurm_ctx())
    assert slurm.calls == [("update", ["gpu01"], "RESUME", None),
                           ("update", ["gpu03", "gpu04"], "RESUME", None),
                           ("update", ["gpu05"], "RESUME", None)]
    assert result.details["left_alone"] == ["gpu02", "gpu06"]
    drained = sorted(n for n, info in slurm.state.items() if "DRAIN" in info.flags)
    assert drained == ["gpu02", "gpu06"]


def test_a_cancel_between_batches_leaves_only_the_done_batches_to_undo() -> None:
    slurm = FakeSlurm([f"gpu{i:02d}" for i in range(1, 9)])
    ctx = slurm_ctx(stop_after=1, slurm=slurm)
    with pytest.raises(ActionStopped):
        DrainBatchesAction(slurm, SlurmConfig()).run(
            DrainBatchesArguments(nodes="gpu[01-08]", reason="r", batch_size=3), ctx)
    assert [c[1] for c in slurm.calls] == [["gpu01", "gpu02", "gpu03"]]
    ResumeBatchesAction(slurm, SlurmConfig()).run(
        ResumeBatchesArguments(nodes="gpu[01-08]", only_this_run=True), slurm_ctx())
    assert not any("DRAIN" in info.flags for info in slurm.state.values())


# --- the model ------------------------------------------------------------------------

class FleetDrainModel(RuleBasedStateMachine):
    """Random rounds of a fleet drain on a fake clock, PDBs that come and go, pods that
    arrive late, someone else's cordon, a cancel; then the undo. Invariants: no eviction
    after the stop, never more eviction calls in a second than the budget, and the nodes
    marked as this run's (the undo's set) are exactly the ones this run cordoned."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.kube = PdbKube(NODES, self.clock, linger=1.0)
        for index, node in enumerate(NODES):
            self.kube.add_pods(node, 1 + index % 3)
        self.kube.patch_node("gpu04", {"spec": {"unschedulable": True}})
        self.ctx = context(self.clock)
        args = DrainNodesArguments(nodes="gpu[01-08]", max_parallel=3, evictions_per_second=2)
        self.fleet = _Fleet(DrainNodesAction(self.kube, CONFIG, self.clock.sleep), args,
                            self.ctx)
        self.stopped_at: float | None = None
        self.over = False

    @rule(seconds=st.sampled_from([0.05, 0.3, 1.0, 2.5]))
    def a_round(self, seconds: float) -> None:
        if self.over:
            return
        self.clock.sleep(seconds)
        try:
            self.fleet.start_more()
            self.fleet.advance()
        except ActionStopped:
            self.over = True

    @rule(pod=st.sampled_from(["gpu01-p0", "gpu02-p1", "gpu06-p0", "gpu07-p2"]))
    def toggle_pdb(self, pod: str) -> None:
        self.kube.blocked ^= {pod}

    @rule()
    def cancel(self) -> None:
        if self.stopped_at is None:
            self.stopped_at = self.clock.now
            self.ctx.request_stop("the execution was cancelled")

    @invariant()
    def never_evicts_after_the_stop(self) -> None:
        if self.stopped_at is not None:
            assert all(at <= self.stopped_at for at, _ in self.kube.evictions)

    @invariant()
    def never_over_the_budget(self) -> None:
        assert max_in_a_second([at for at, _ in self.kube.evictions]) <= 2

    @invariant()
    def the_undo_set_is_what_this_run_cordoned(self) -> None:
        ours = {n for n, owner in self.kube.cordoned().items() if owner == "execution-7"}
        assert ours == set(self.fleet.cordoned)
        assert "gpu04" not in ours
        assert len(self.fleet.active) <= 3

    def teardown(self) -> None:
        undrain(self.kube, self.clock, context(self.clock))
        assert self.kube.cordoned() == {"gpu04": None}


FleetDrainModel.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestFleetDrainModel = FleetDrainModel.TestCase
