"""``k8s.drain_nodes``: drain a set of nodes as ``k8s.drain`` drains one (its ``_Drain``), up
to ``max_parallel`` nodes at once, each cordoned first, with one budget of eviction calls per
second shared by all (``EVICTIONS_PER_SECOND`` by default: why that number is said there);
``k8s.undrain_nodes`` uncordons exactly the nodes this execution cordoned (annotated
``gpu-runbook-bot/cordoned-by=execution-N``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import Field, field_validator

from adapters.actions import (
    ActionContext,
    ActionError,
    ActionResult,
    ActionStopped,
    ActionTimeout,
    Seconds,
    StrictArguments,
)
from adapters.fleetstatus import NodeStates
from adapters.kubernetes import cordons
from adapters.kubernetes.backend import KubernetesError
from adapters.kubernetes.base import KubernetesAction, check_node_names, listed
from adapters.kubernetes.cordons import CORDONED_BY
from adapters.kubernetes.drain import DrainArguments, _Drain, refusals, refused_by
from kit.durations import format_duration
from kit.hostlist import compress, expand

DRAINED, DRAINING, BLOCKED, FAILED, NOT_STARTED = (
    "drained", "draining", "blocked by PDB", "failed", "not started")
STATES = (DRAINED, DRAINING, BLOCKED, FAILED, NOT_STARTED)


def owner(ctx: ActionContext) -> str:
    """The mark of the nodes this execution cordoned: the undo uncordons only those."""
    return f"execution-{ctx.execution_id}"


# The default eviction budget, for all nodes together. The budget spares the control plane;
# the workloads are the PodDisruptionBudgets' job: the API server refuses (429) an eviction
# its budget does not allow, whatever the rate. 50 a second is kubectl's own discovery
# budget (50 QPS, burst 300) and kube-scheduler's default client QPS (50), ten times
# client-go's 5 QPS (burst 10) that kubectl's other requests, its drain's evictions among
# them, still use. Server side, API Priority and Fairness counts seats, not calls: an
# eviction (two etcd writes) takes a seat for some 10-20 ms, so 50 a second hold about one of
# the 49 seats of global-default (a person's requests; a service account's level has 245).
EVICTIONS_PER_SECOND = 50


class FleetArguments(StrictArguments):
    nodes: str = Field(description="Kubernetes node names, as a hostlist: gpu[05-08]")

    @field_validator("nodes")
    @classmethod
    def _hostlist(cls, value: str) -> str:
        check_node_names(expand(value))
        return value

    @property
    def names(self) -> list[str]:
        return list(dict.fromkeys(expand(self.nodes)))


class DrainNodesArguments(FleetArguments):
    max_parallel: int = Field(default=16, ge=1, le=64)  # nodes draining at once
    evictions_per_second: int = Field(default=EVICTIONS_PER_SECOND, ge=1, le=1000)  # all nodes
    timeout: Seconds = 7200.0
    grace_period: int | None = Field(default=None, ge=0)
    delete_emptydir_data: bool = True
    force: bool = False


class EvictionBudget:
    """At most ``per_second`` eviction calls in any one second, whichever nodes they are
    for: the times of the last ``per_second`` calls, a new one allowed a second after the
    oldest (a sliding window: never a burst over the budget at a second's edge)."""

    def __init__(self, per_second: int, clock: Callable[[], float] | None = None) -> None:
        self.per_second = per_second
        self._clock = clock or (lambda: time.monotonic())  # looked up when called
        self._times: deque[float] = deque(maxlen=per_second)

    def next_at(self) -> float:
        if len(self._times) < self.per_second:
            return self._clock()
        return self._times[0] + 1.0

    def take(self) -> bool:
        now = self._clock()
        if len(self._times) == self.per_second and now - self._times[0] < 1.0:
            return False
        self._times.append(now)
        return True


class _Fleet:
    """One run of ``k8s.drain_nodes``: nodes not started (``queue``), draining (``active``,
    one ``_Drain`` each), drained, failed; what this run cordoned."""

    def __init__(self, action: DrainNodesAction, args: DrainNodesArguments,
                 ctx: ActionContext) -> None:
        self.backend = action.backend
        self.retry = action.config.eviction_retry
        self.args = args
        self.ctx = ctx
        self.queue = deque(args.names)
        self.active: dict[str, _Drain] = {}
        self.cordoned: list[str] = []
        self.evicted = self.refusals = 0  # eviction calls (each takes a token), 429s
        self.current = ""  # the node being worked on: the one named when a call fails
        self.budget = EvictionBudget(args.evictions_per_second)
        self.states = NodeStates(args.names, ctx, STATES, NOT_STARTED)
        self.quiet = ActionContext(ctx.execution_id, ctx.step_id, ctx.deadline,
                                   ctx.fencing_token, cancelled=ctx.cancelled, stop=ctx.stop)

    def start_more(self) -> None:
        """Start nodes until ``max_parallel`` drain at once; never one after a stop."""
        while self.queue and len(self.active) < self.args.max_parallel:
            self.ctx.checkpoint("starting the next node's drain")
            name = self.queue[0]
            self._start(name)
            self.queue.popleft()

    def _start(self, name: str) -> None:
        self.current = name
        node = self.backend.get_node(name)
        pods = self.backend.pods_on_node(name)
        todo = [p for p in pods if not p.daemonset and not p.mirror]
        per_node = DrainArguments(node=name, timeout=self.args.timeout,
                                  grace_period=self.args.grace_period,
                                  delete_emptydir_data=self.args.delete_emptydir_data,
                                  force=self.args.force)
        problems = refusals(todo, per_node)
        if problems:
            raise _NodeFailed(name, "; ".join(problems))
        if not node.unschedulable:
            self.backend.patch_node(name, {"spec": {"unschedulable": True}, "metadata": {
                "annotations": {CORDONED_BY: owner(self.ctx)}}}, strategic=True)
            self.cordoned.append(name)
        elif node.annotations.get(CORDONED_BY) == owner(self.ctx):
            self.cordoned.append(name)  # this execution's, before a crash: still ours
        if not todo:
            self.states.set(name, DRAINED)
            return
        self.active[name] = _Drain(self.backend, self.retry, per_node, self.quiet, pods, todo,
                                   may_evict=self._may_evict)
        self.states.set(name, DRAINING)

    def _may_evict(self) -> bool:
        if self.budget.take():
            self.evicted += 1
            return True
        return False

    def advance(self) -> None:
        """One round over the draining nodes: evict what is due, look for departures."""
        for name, drain in list(self.active.items()):
            self.ctx.checkpoint(f"draining {name}")
            self.current = name
            before = drain.refusals
            drain.evict_due()
            drain.check_departures_when_due()
            self.refusals += drain.refusals - before
            self._judge(name, drain)

    def _judge(self, name: str, drain: _Drain) -> None:
        if not drain.pending and not drain.leaving:
            del self.active[name]
            self.states.set(name, DRAINED)
            return
        blocked = [key for key in drain.pending if key in drain.blocked]
        if blocked:
            key = blocked[0]
            why = refused_by(drain.pending[key], drain.blocked[key])
            self.states.set(name, BLOCKED, f"{key}: {why}")
        else:
            self.states.set(name, DRAINING)

    def next_wake(self) -> float:
        """When there is something to do: a departure check, a retry, a token to evict."""
        deadline, evict_at = self.ctx.deadline, self.budget.next_at()
        return min([deadline, *(drain.next_wake(deadline, evict_at)
                                for drain in self.active.values())])

    def account(self) -> str:
        """Which nodes are where: for an error that says what the undo will find."""
        def shown(names: list[str]) -> str:
            return compress(names) if names else "none"
        return (f"drained: {shown(self.states.nodes_in(DRAINED))}; draining when it stopped: "
                f"{shown(list(self.active))}; failed: {shown(self.states.nodes_in(FAILED))}; "
                f"not started: {shown(list(self.queue))}")


class _NodeFailed(ActionError):
    def __init__(self, node: str, why: str) -> None:
        super().__init__(why)
        self.node = node


class DrainNodesAction(KubernetesAction):
    """Cordon and drain a set of nodes, ``max_parallel`` at a time, within one eviction
    budget; stops at the first node that fails (the undo uncordons what this run cordoned)."""

    name: ClassVar[str] = "k8s.drain_nodes"
    takes_out: ClassVar[tuple[str, ...]] = ("nodes",)
    Arguments: ClassVar[type[StrictArguments]] = DrainNodesArguments

    def plan(self, args: DrainNodesArguments) -> list[str]:
        flags = " --delete-emptydir-data" if args.delete_emptydir_data else ""
        flags += " --force" if args.force else ""
        flags += f" --grace-period={args.grace_period}" if args.grace_period is not None else ""
        return [f"kubectl drain {compress(args.names)} --ignore-daemonsets{flags} "
                f"--timeout={format_duration(args.timeout)}: {len(args.names)} node(s), up to "
                f"{args.max_parallel} at once, each cordoned first; at most "
                f"{args.evictions_per_second} evictions/s across all of them "
                "(PodDisruptionBudgets honoured: a 429 is retried later)",
                f"kubectl annotate node <each node cordoned here> {CORDONED_BY}="
                "execution-<this execution>  # nodes already cordoned are left alone"]

    def run(self, args: DrainNodesArguments, ctx: ActionContext) -> ActionResult:
        started = time.monotonic()
        self._check_known(args.names)
        fleet = _Fleet(self, args, ctx)
        ctx.progress(f"draining {len(args.names)} node(s) {compress(args.names)}: up to "
                     f"{args.max_parallel} at once, at most {args.evictions_per_second} "
                     "evictions/s")
        deadline = started + min(args.timeout, ctx.remaining())
        try:
            self._loop(fleet, deadline)
        finally:
            fleet.states.publish(force=True)
        return self._result(fleet, started)

    def _check_known(self, names: list[str]) -> None:
        known = {node.name for node in self.backend.list_nodes()}
        missing = [name for name in names if name not in known]
        if missing:
            raise ActionError(f"Kubernetes has no node {listed(missing)} (kubectl get nodes "
                              "lists them): check the node names (nothing was changed)")

    def _loop(self, fleet: _Fleet, deadline: float) -> None:
        ctx = fleet.ctx
        while True:
            try:
                fleet.start_more()
                fleet.advance()
            except ActionStopped as exc:
                raise ActionStopped(f"{exc}; {fleet.account()}") from exc
            except ActionTimeout as exc:
                raise ActionTimeout(f"{exc}; {fleet.account()}") from exc
            except (ActionError, KubernetesError) as exc:  # a node failed: stop the set
                node = exc.node if isinstance(exc, _NodeFailed) else fleet.current
                self._fail(fleet, node, str(exc))
            fleet.states.publish()
            if not fleet.queue and not fleet.active:
                return
            if time.monotonic() >= deadline:
                raise ActionTimeout(self._timeout_text(fleet))
            ctx.checkpoint("draining nodes")
            self._sleep(max(0.005, ctx.pause(min(fleet.next_wake(), deadline)
                                             - time.monotonic())))

    @staticmethod
    def _fail(fleet: _Fleet, node: str, why: str) -> None:
        fleet.states.set(node, FAILED, why[:200])
        fleet.active.pop(node, None)
        if fleet.queue and fleet.queue[0] == node:
            fleet.queue.popleft()
        raise ActionError(f"drain of {node} failed: {why}. Stopped the set's drain: "
                          f"{fleet.account()}. The undo uncordons the nodes this run "
                          "cordoned; nodes cordoned before it stay cordoned.")

    @staticmethod
    def _timeout_text(fleet: _Fleet) -> str:
        blocked = [d for d in fleet.active.values() if d.blocked]
        first = (fleet.active[next(iter(fleet.active))] if fleet.active else None)
        limit = fleet.args.timeout
        example = (blocked[0] if blocked else first)
        detail = ""
        if example:
            pods, hint = example.still_there()
            detail = f" {example.args.node}: {pods}.{hint}"
        return (f"drain of {compress(fleet.args.names)} timed out after "
                f"{format_duration(limit)}: {fleet.account()}.{detail} The undo uncordons the "
                "nodes this run cordoned; nodes cordoned before it stay cordoned. Retry with "
                "a longer timeout once the blocking pods can move.")

    @staticmethod
    def _result(fleet: _Fleet, started: float) -> ActionResult:
        names = fleet.args.names
        already = [n for n in names if n not in fleet.cordoned]
        details: dict[str, Any] = {
            "drained": compress(names), "cordoned": fleet.cordoned,
            "already_cordoned": already, "evictions": fleet.evicted,
            "eviction_refusals": fleet.refusals, "status": fleet.states.snapshot(),
            "waited_seconds": round(time.monotonic() - started, 2)}
        summary = (f"drained {len(names)} node(s) {compress(names)}: {fleet.evicted} "
                   f"eviction call(s)")
        if already:
            summary += f"; {listed(already)} were cordoned already (left so by the undo)"
        return ActionResult(summary, details, changed=bool(fleet.cordoned or fleet.evicted))


class UndrainNodesArguments(FleetArguments):
    only_this_run: bool = True  # False: every cordon of the set a routine return may lift
    # with only_this_run false: lift another owner's cordon or a failed check's (break-glass)
    override_drains: bool = False


class UndrainNodesAction(KubernetesAction):
    """Uncordon the nodes of a set this execution cordoned (its annotation), the others left
    as they are: the undo of ``k8s.drain_nodes``. Not ``only_this_run`` (resume-nodes):
    every cordon the bot made to work on a node; another owner's, or one kept for a failed
    check, stays (the run then fails naming it) unless ``override_drains``."""

    name: ClassVar[str] = "k8s.undrain_nodes"
    Arguments: ClassVar[type[StrictArguments]] = UndrainNodesArguments

    def plan(self, args: UndrainNodesArguments) -> list[str]:
        if args.only_this_run:
            return [f"kubectl uncordon <the nodes of {compress(args.names)} annotated "
                    f"{CORDONED_BY}=execution-<this execution>>  # others are left alone"]
        return [*self._cordon_notes(args),
                f"kubectl uncordon {compress(args.names)}  # the cordoned ones"]

    def _cordon_notes(self, args: UndrainNodesArguments) -> list[str]:
        """For a plan: each cordoned node's owner and whether this run lifts it."""
        try:
            nodes = [n for n in self.backend.list_nodes() if n.name in set(args.names)]
        except KubernetesError as exc:
            return [f"cordons of {compress(args.names)} could not be read now ({exc}); they "
                    "are read again before anything is uncordoned"]
        verdict = ("lifted: override_drains=true" if args.override_drains else
                   "STAYS CORDONED: not lifted without override_drains=true (break-glass)")
        return [f"{name} is {why}: {verdict}"
                for name, why in cordons.not_liftable(nodes).items()]

    def run(self, args: UndrainNodesArguments, ctx: ActionContext) -> ActionResult:
        wanted = set(args.names)
        nodes = [n for n in self.backend.list_nodes() if n.name in wanted]
        stays = {} if args.only_this_run or args.override_drains else cordons.not_liftable(nodes)
        ours = [n.name for n in nodes if n.name not in stays and (
            cordons.made_by(n, ctx.execution_id) if args.only_this_run
            else n.unschedulable or CORDONED_BY in n.annotations)]
        for name in ours:
            self.backend.patch_node(name, cordons.uncordon_patch(), strategic=True)
        details = {"uncordoned": ours, "left_alone": sorted(wanted - set(ours)),
                   "left_cordoned": stays}
        if stays:
            raise ActionError(
                (f"uncordoned {compress(ours)}; " if ours else "uncordoned nothing; ")
                + "left cordoned: " + "; ".join(f"{n} ({why})" for n, why in stays.items())
                + ". To return them anyway, ask again naming them with override_drains=true "
                "(break-glass: one more approval)")
        if not ours:
            return ActionResult(f"nothing to uncordon in {compress(args.names)}", details,
                                changed=False)
        return ActionResult(f"uncordoned {len(ours)} node(s) {compress(ours)}", details)


FLEET_ACTIONS: tuple[type[KubernetesAction], ...] = (DrainNodesAction, UndrainNodesAction)
