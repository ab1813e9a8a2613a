"""``k8s.drain``: empty a node the way ``kubectl drain --ignore-daemonsets`` does.

Pods leave only through the Eviction API (policy/v1), so PodDisruptionBudgets are honoured;
pods are never deleted directly, and nothing is evicted once the step is asked to stop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import Field

from adapters.actions import (
    ActionContext,
    ActionError,
    ActionResult,
    ActionTimeout,
    Seconds,
    StrictArguments,
)
from adapters.kubernetes.backend import Eviction, KubernetesBackend, Pod
from adapters.kubernetes.base import KubernetesAction, NodeArguments, listed
from adapters.kubernetes.cordons import cordon_patch
from kit.durations import format_duration

FIRST_CHECK, MAX_CHECK = 0.5, 5.0  # seconds between checks for evicted pods to be gone


class DrainArguments(NodeArguments):
    timeout: Seconds = 3600.0
    grace_period: int | None = Field(default=None, ge=0)  # seconds; None: the pod's own
    delete_emptydir_data: bool = True  # pods with emptyDir volumes lose that data
    force: bool = False  # also evict pods no controller manages (they are not recreated)
    max_parallel: int = Field(default=0, ge=0)  # pods evicted and not yet gone at once; 0: all


def refusals(pods: list[Pod], args: DrainArguments) -> list[str]:
    """Why ``pods`` may not be evicted under ``args`` (emptyDir data, no controller)."""
    problems = []
    local = [p.key for p in pods if p.emptydir]
    if local and not args.delete_emptydir_data:
        problems.append(f"pods with local storage (emptyDir) {listed(local)} would lose "
                        "it: set delete_emptydir_data: true")
    bare = [p.key for p in pods if p.owner_kind is None]
    if bare and not args.force:
        problems.append(f"pods no controller manages {listed(bare)} would not come back: "
                        "set force: true to evict them anyway")
    return problems


def refused_by(pod: Pod, answer: Eviction) -> str:
    """Who refused an eviction: the PodDisruptionBudget by name, else the bare 429."""
    who = (f"PodDisruptionBudget {pod.namespace}/{answer.pdb}" if answer.pdb
           else "429 TooManyRequests")
    return f"{who}: {answer.message}" if answer.message else who


class _Drain:
    """One run of ``k8s.drain`` on one node: which pods are still to evict (``pending``),
    evicted but still there (``leaving``), refused (``blocked``), and what was done.

    It lists the node's pods once, evicts each pod once (plus its 429 retries every
    ``eviction_retry`` seconds), and looks for the evicted pods' departure with one list of
    the node's pods per round, backing off from FIRST_CHECK to MAX_CHECK seconds: about one
    API call per pod plus a few per node when nothing blocks.
    """

    def __init__(self, backend: KubernetesBackend, eviction_retry: float, args: DrainArguments,
                 ctx: ActionContext, pods: list[Pod], todo: list[Pod],
                 may_evict: Callable[[], bool] = lambda: True) -> None:
        self.backend = backend
        self.may_evict = may_evict  # a shared eviction budget (k8s.drain_nodes) says no
        self.eviction_retry = eviction_retry
        self.args = args
        self.ctx = ctx
        self.known = {p.key for p in pods}
        self.pending = {p.key: p for p in todo if not p.deleting}
        self.leaving = {p.key: p for p in todo if p.deleting}
        self.blocked: dict[str, Eviction] = {}
        self.retry_at: dict[str, float] = {}
        self.evicted: list[str] = []
        self.gone: list[str] = []
        self.refusals = 0
        self.check_every = FIRST_CHECK
        self.check_at = time.monotonic() + self.check_every

    def _full(self) -> bool:  # max_parallel pods evicted and not gone yet
        return bool(self.args.max_parallel) and len(self.leaving) >= self.args.max_parallel

    def evict_due(self) -> None:
        """Evict every pending pod whose retry time has come, up to ``max_parallel`` leaving."""
        if self.pending and self.ctx.stopping():  # never evict after a stop
            self.ctx.checkpoint(f"draining {self.args.node}")
        for key, pod in list(self.pending.items()):
            if self.retry_at.get(key, 0.0) > time.monotonic():
                continue
            if self._full() or not self.may_evict():
                break
            answer = self.backend.evict(pod.namespace, pod.name, self.args.grace_period)
            if answer.outcome == "blocked":
                self._refused(key, pod, answer)
                continue
            del self.pending[key]
            self.blocked.pop(key, None)
            if answer.outcome == "evicted":
                self.evicted.append(key)
                self.leaving[key] = pod
                self.ctx.progress(f"evicted {key}")
                self.check_every = FIRST_CHECK
                self.check_at = time.monotonic() + self.check_every
            else:
                self.gone.append(key)

    def _refused(self, key: str, pod: Pod, answer: Eviction) -> None:
        self.refusals += 1
        if key not in self.blocked:
            self.ctx.progress(f"{key}: eviction refused ({refused_by(pod, answer)}); "
                              f"retrying every {format_duration(self.eviction_retry)}")
        self.blocked[key] = answer
        self.retry_at[key] = time.monotonic() + self.eviction_retry

    def check_departures(self) -> None:
        """One list of the node's pods: which evicted pods are gone, which pods are new."""
        present = {p.key: p for p in self.backend.pods_on_node(self.args.node)}
        for key, pod in list(self.leaving.items()):
            still = present.get(key)
            if still is None or still.uid != pod.uid:
                del self.leaving[key]
                self.gone.append(key)
                self.ctx.progress(f"{key} gone")
        late = [p for k, p in present.items() if k not in self.known
                and not p.daemonset and not p.mirror]
        if late:
            self._arrived(late)
        self.check_every = min(self.check_every * 1.5, MAX_CHECK)
        self.check_at = time.monotonic() + self.check_every

    def _arrived(self, late: list[Pod]) -> None:
        """Pods that came despite the cordon: drained too, under the same rules."""
        problems = refusals(late, self.args)
        if problems:
            raise ActionError(f"drain of {self.args.node}: new pods arrived despite "
                              "the cordon: " + "; ".join(problems))
        for pod in late:
            self.known.add(pod.key)
            (self.leaving if pod.deleting else self.pending)[pod.key] = pod
        self.ctx.progress(f"new pods on {self.args.node}: {listed([p.key for p in late])}")

    def next_wake(self, deadline: float, evict_at: float | None = None) -> float:
        """The ``time.monotonic()`` of the next thing to do: a check, a retry, an eviction.
        ``evict_at``: when a shared eviction budget allows the next call (default: now)."""
        now = time.monotonic()
        wake = [deadline]
        if self.leaving:
            wake.append(self.check_at)
        for key in self.pending:
            if self.retry_at.get(key, 0.0) > now:
                wake.append(self.retry_at[key])
            elif not self._full():  # full: the next departure check frees a place
                wake.append(now if evict_at is None else evict_at)
        return min(wake)

    def check_departures_when_due(self) -> None:
        if self.leaving and time.monotonic() >= self.check_at:
            self.check_departures()

    def timeout_text(self, limit: float) -> str:
        """The pods still there and what blocks them, with the budget to look at."""
        node = self.args.node
        pods, hint = self.still_there()
        return (f"drain of {node} timed out after {format_duration(limit)}: {pods}. {node} "
                f"stays cordoned (undo: k8s.uncordon).{hint} Retry with a longer timeout "
                "once the blocking pods can move.")

    def still_there(self) -> tuple[str, str]:
        """("N pod(s) still on the node: each and what holds it", " Check the budget ...")."""
        parts = []
        for key, pod in self.pending.items():
            answer = self.blocked.get(key)
            parts.append(f"{key} blocked by {refused_by(pod, answer)}" if answer
                         else f"{key} not evicted yet")
        parts += [f"{key} evicted but still terminating" for key in self.leaving]
        pdbs = sorted({f"{self.pending[k].namespace}/{a.pdb}" for k, a in self.blocked.items()
                       if a.pdb and k in self.pending})
        hint = (f" Check the budget (kubectl -n {pdbs[0].split('/')[0]} get pdb "
                f"{pdbs[0].split('/')[1]}): its pods elsewhere must be Ready, or relax it."
                if pdbs else "")
        pods = (f"{len(self.pending) + len(self.leaving)} pod(s) still on the node: "
                + "; ".join(parts[:20])
                + (f"; and {len(parts) - 20} more" if len(parts) > 20 else ""))
        return pods, hint


class DrainAction(KubernetesAction):
    """Cordon, evict every pod but DaemonSet and mirror pods, wait until they are gone."""

    name: ClassVar[str] = "k8s.drain"
    takes_out: ClassVar[tuple[str, ...]] = ("node",)
    Arguments: ClassVar[type[StrictArguments]] = DrainArguments

    def plan(self, args: DrainArguments) -> list[str]:
        line = f"kubectl drain {args.node} --ignore-daemonsets"
        if args.delete_emptydir_data:
            line += " --delete-emptydir-data"
        if args.force:
            line += " --force"
        if args.grace_period is not None:
            line += f" --grace-period={args.grace_period}"
        if args.max_parallel:
            line += f" (at most {args.max_parallel} pods leaving at once)"
        return [line + f" --timeout={format_duration(args.timeout)}"]

    def run(self, args: DrainArguments, ctx: ActionContext) -> ActionResult:
        started = time.monotonic()
        limit = min(args.timeout, ctx.remaining())
        node = self.backend.get_node(args.node)
        pods = self.backend.pods_on_node(args.node)
        todo = [p for p in pods if not p.daemonset and not p.mirror]
        problems = refusals(todo, args)
        if problems:
            raise ActionError(f"cannot drain {args.node}: " + "; ".join(problems)
                              + " (nothing was changed)")
        cordoned = self._cordon(args.node, node.unschedulable, ctx)
        if todo:
            ctx.progress(f"evicting {len(todo)} pod(s) from {args.node} "
                         f"(skipping {sum(p.daemonset for p in pods)} DaemonSet pod(s))")
        drain = _Drain(self.backend, self.config.eviction_retry, args, ctx, pods, todo)
        self._until_empty(drain, started + limit, limit)
        return self._result(drain, pods, todo, cordoned, started)

    def _cordon(self, node: str, unschedulable: bool, ctx: ActionContext) -> bool:
        """Cordon the node unless it is; whether this step did."""
        if unschedulable:
            return False
        self.backend.patch_node(node, cordon_patch(ctx.execution_id), strategic=True)
        ctx.progress(f"cordoned {node}")
        return True

    def _until_empty(self, drain: _Drain, deadline: float, limit: float) -> None:
        ctx = drain.ctx
        while drain.pending or drain.leaving:
            drain.evict_due()
            drain.check_departures_when_due()
            if not drain.pending and not drain.leaving:
                break
            if time.monotonic() >= deadline:
                raise ActionTimeout(drain.timeout_text(limit))
            ctx.checkpoint(f"draining {drain.args.node}")
            self._sleep(max(0.005, ctx.pause(drain.next_wake(deadline) - time.monotonic())))

    @staticmethod
    def _result(drain: _Drain, pods: list[Pod], todo: list[Pod], cordoned: bool,
                started: float) -> ActionResult:
        node = drain.args.node
        skipped_ds = [p.key for p in pods if p.daemonset]
        details: dict[str, Any] = {
            "node": node, "cordoned": cordoned, "evicted": drain.evicted, "gone": drain.gone,
            "skipped_daemonset_pods": skipped_ds,
            "skipped_mirror_pods": [p.key for p in pods if p.mirror],
            "eviction_refusals": drain.refusals,
            "waited_seconds": round(time.monotonic() - started, 2)}
        if not todo:
            summary = f"cordoned {node}; no pod to evict" if cordoned else f"{node} already drained"
        else:
            summary = f"drained {node}: evicted {len(drain.evicted)} pod(s)"
            if skipped_ds:
                summary += f", left {len(skipped_ds)} DaemonSet pod(s)"
        return ActionResult(summary, details, changed=cordoned or bool(drain.evicted))
