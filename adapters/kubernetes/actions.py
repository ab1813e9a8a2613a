"""The ``k8s.*`` and ``gpu_operator.*`` actions.

Every action reads the cluster first and changes only what still needs changing, so a step
run twice equals a step run once (``ActionResult.changed`` says whether anything changed).
``plan()`` shows the kubectl line an on-call engineer would type (``kubectl cordon gpu05``).

``k8s.drain`` works like ``kubectl drain --ignore-daemonsets``: it cordons, evicts every pod
on the node except DaemonSet-owned and mirror pods through the Eviction API (policy/v1, so
PodDisruptionBudgets are honoured), retries a refused eviction (429) every
``eviction_retry`` seconds, and waits until the evicted pods are gone. It lists the node's
pods once, evicts each pod once (plus its 429 retries), and checks for the pods' departure
with one list of the node's pods per round (backing off from 0.5 s to 5 s): about one API
call per pod plus a few per node when nothing blocks.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from adapters.actions import (
    Action,
    ActionBase,
    ActionContext,
    ActionError,
    ActionResult,
    ActionSet,
    ActionTimeout,
    Seconds,
    StrictArguments,
)
from adapters.kubernetes.backend import (
    Eviction,
    KubernetesBackend,
    KubernetesConflict,
    KubernetesError,
    Node,
    Pod,
    Taint,
)
from adapters.kubernetes.config import GpuOperatorConfig, KubernetesConfig

NODE_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
OBJECT_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
VERSION = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$"
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_SELECTOR = re.compile(r"^[A-Za-z0-9._/=!,()\s-]{1,1024}$")
UPGRADE_DONE, UPGRADE_FAILED = "upgrade-done", "upgrade-failed"
CLUSTERPOLICY = ("nvidia.com", "v1", "clusterpolicies")
NVIDIADRIVER = ("nvidia.com", "v1alpha1", "nvidiadrivers")
FIRST_CHECK, MAX_CHECK = 0.5, 5.0  # seconds between checks for evicted pods to be gone


def _human(seconds: float) -> str:
    if seconds < 10 and seconds != int(seconds):
        return f"{seconds:.1f}s"
    whole = round(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def _names(items: list[str], limit: int = 10) -> str:
    text = ", ".join(items[:limit])
    return text + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _check_label_key(key: str) -> str:
    if len(key) > 316 or not _LABEL_KEY.match(key):
        raise ValueError(f"{key!r} is not a Kubernetes label key (prefix/name, name at most "
                         "63 of [A-Za-z0-9_.-])")
    return key


def _check_label_value(value: str) -> str:
    if not _LABEL_VALUE.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes label value (at most 63 of "
                         "[A-Za-z0-9_.-], starting and ending alphanumeric)")
    return value


def _check_selector(value: str | None) -> str | None:
    if value is not None and not _SELECTOR.match(value):
        raise ValueError(f"{value!r} is not a label selector like 'a=b,c!=d,e in (f,g)'")
    return value


# --- arguments ---------------------------------------------------------------------

class NodeArguments(StrictArguments):
    node: str = Field(pattern=NODE_NAME, description="Kubernetes node name")


class DrainArguments(NodeArguments):
    timeout: Seconds = 3600.0
    grace_period: int | None = Field(default=None, ge=0)  # seconds; None: the pod's own
    delete_emptydir_data: bool = True  # pods with emptyDir volumes lose that data
    force: bool = False  # also evict pods no controller manages (they are not recreated)
    max_parallel: int = Field(default=0, ge=0)  # pods evicted and not yet gone at once; 0: all


class LabelArguments(NodeArguments):
    labels: dict[str, str | None] = Field(min_length=1)  # None removes the label

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str | None]) -> dict[str, str | None]:
        for key, item in value.items():
            _check_label_key(key)
            if item is not None:
                _check_label_value(item)
        return value


class TaintArguments(NodeArguments):
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"
    remove: bool = False

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        return _check_label_key(value)

    @field_validator("value")
    @classmethod
    def _value(cls, value: str) -> str:
        return _check_label_value(value)


def _node_names(value: list[str]) -> list[str]:
    for name in value:
        if not re.match(NODE_NAME, name):
            raise ValueError(f"{name!r} is not a Kubernetes node name")
    return value


CORDONED_BY = "gpu-runbook-bot/cordoned-by"  # who cordoned a node (k8s.cordon_nodes owner)


class NodesArguments(StrictArguments):
    """Several nodes at once; ``owner`` marks the nodes this cordon made unschedulable, so
    the matching uncordon leaves alone the ones somebody else had cordoned."""

    nodes: list[str] = Field(min_length=1, description="Kubernetes node names")
    owner: str | None = Field(default=None, description="e.g. window-12 (an annotation value)")

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(_node_names(value)))

    @field_validator("owner")
    @classmethod
    def _owner(cls, value: str | None) -> str | None:
        return None if value is None else _check_label_value(value)


class _NodeSetArguments(StrictArguments):
    """The nodes to watch: one ``node``, a list of ``nodes``, or a ``label_selector``."""

    node: str | None = Field(default=None, pattern=NODE_NAME)
    nodes: list[str] = Field(default_factory=list)
    label_selector: str | None = None

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: list[str]) -> list[str]:
        return _node_names(value)

    @field_validator("label_selector")
    @classmethod
    def _selector(cls, value: str | None) -> str | None:
        return _check_selector(value)

    @model_validator(mode="after")
    def _at_most_one(self) -> _NodeSetArguments:
        given = [x for x in (self.node, self.nodes, self.label_selector) if x]
        if len(given) > 1:
            raise ValueError("give node, nodes or label_selector, not several")
        return self

    @property
    def names(self) -> list[str]:
        return [self.node] if self.node else list(self.nodes)

    def describe(self, default: str) -> str:
        if self.names:
            return ", ".join(self.names)
        return f"nodes matching {self.label_selector or default}"


class WaitLabelsArguments(_NodeSetArguments):
    labels: dict[str, str | None] = Field(min_length=1)  # None: the label must be absent
    timeout: Seconds = 600.0
    poll: Seconds = 2.0

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str | None]) -> dict[str, str | None]:
        for key, item in value.items():
            _check_label_key(key)
            if item is not None:
                _check_label_value(item)
        return value

    @model_validator(mode="after")
    def _some_nodes(self) -> WaitLabelsArguments:
        if not (self.names or self.label_selector):
            raise ValueError("give node, nodes or label_selector")
        return self


class SetDriverVersionArguments(StrictArguments):
    version: str = Field(pattern=VERSION)
    pool: str | None = Field(default=None, pattern=OBJECT_NAME)  # driver_mode nvidiadriver


class WaitUpgradeStateArguments(_NodeSetArguments):
    pool: str | None = Field(default=None, pattern=OBJECT_NAME)  # driver_mode nvidiadriver
    version: str | None = Field(default=None, pattern=VERSION)  # default: the operator's target
    timeout: Seconds = 3600.0
    poll: Seconds = 2.0


class WaitValidatorArguments(_NodeSetArguments):
    timeout: Seconds = 600.0
    poll: Seconds = 2.0


class DriverVersionsArguments(_NodeSetArguments):
    pool: str | None = Field(default=None, pattern=OBJECT_NAME)
    expect: str | None = Field(default=None, pattern=VERSION)  # fail unless every node has it


# --- actions -------------------------------------------------------------------------

class _KubernetesAction(ActionBase):
    def __init__(self, backend: KubernetesBackend, config: KubernetesConfig | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.backend = backend
        self.config = config or KubernetesConfig()
        self._sleep = sleep

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every ``run`` asks the API within the step's deadline: a request the API server
        does not answer ends when the step's time is up, not ``request_timeout`` later
        (through the backend's ``deadline``; a backend without one is used as it is)."""
        super().__init_subclass__(**kwargs)
        run = cls.__dict__.get("run")
        if run is None:
            return

        @functools.wraps(run)
        def within_deadline(self: _KubernetesAction, args: Any,
                            ctx: ActionContext) -> ActionResult:
            deadline = getattr(self.backend, "deadline", None)
            if deadline is None:
                return run(self, args, ctx)  # type: ignore[no-any-return]
            with deadline(ctx.deadline):
                return run(self, args, ctx)  # type: ignore[no-any-return]

        setattr(cls, "run", within_deadline)  # noqa: B010 (mypy: a method is not assignable)

    @property
    def operator(self) -> GpuOperatorConfig:
        return self.config.gpu_operator

    def _nodes(self, args: _NodeSetArguments, default_selector: str | None) -> list[Node]:
        """The nodes ``args`` names (ActionError for unknown ones) or its selector matches."""
        if args.node:
            return [self.backend.get_node(args.node)]
        if args.nodes:
            found = {n.name: n for n in self.backend.list_nodes()}
            missing = [name for name in args.nodes if name not in found]
            if missing:
                raise ActionError(f"Kubernetes has no node {_names(missing)} (kubectl get "
                                  "nodes lists them): check the node names")
            return [found[name] for name in args.nodes]
        selector = args.label_selector or default_selector
        nodes = self.backend.list_nodes(selector)
        if not nodes:
            raise ActionError(f"no Kubernetes node matches the label selector {selector!r} "
                              f"(kubectl get nodes -l '{selector}')")
        return nodes

    def _wait(self, what: str, limit: float, poll: float, ctx: ActionContext,
              check: Callable[[], tuple[bool, str, str]]) -> float:
        """Call ``check`` until it says done; it returns (done, progress line, timeout text).

        Progress lines are published when they change; returns the seconds waited."""
        started = time.monotonic()
        deadline = started + min(limit, ctx.remaining())
        last = ""
        while True:
            done, line, pending = check()
            if line and line != last:
                ctx.progress(line)
                last = line
            if done:
                return time.monotonic() - started
            if time.monotonic() >= deadline:
                raise ActionTimeout(f"{what}: still not done after {_human(limit)}: {pending}")
            ctx.checkpoint(what)
            self._sleep(max(0.01, ctx.pause(min(poll, deadline - time.monotonic()))))


class CordonAction(_KubernetesAction):
    name: ClassVar[str] = "k8s.cordon"
    Arguments: ClassVar[type[StrictArguments]] = NodeArguments

    def plan(self, args: NodeArguments) -> list[str]:
        return [f"kubectl cordon {args.node}"]

    def run(self, args: NodeArguments, ctx: ActionContext) -> ActionResult:
        node = self.backend.get_node(args.node)
        if node.unschedulable:
            return ActionResult(f"{args.node} already cordoned", {"node": args.node},
                                changed=False)
        self.backend.patch_node(args.node, {"spec": {"unschedulable": True}}, strategic=True)
        return ActionResult(f"cordoned {args.node}", {"node": args.node})


class UncordonAction(_KubernetesAction):
    name: ClassVar[str] = "k8s.uncordon"
    Arguments: ClassVar[type[StrictArguments]] = NodeArguments

    def plan(self, args: NodeArguments) -> list[str]:
        return [f"kubectl uncordon {args.node}"]

    def run(self, args: NodeArguments, ctx: ActionContext) -> ActionResult:
        node = self.backend.get_node(args.node)
        if not node.unschedulable:
            return ActionResult(f"{args.node} already schedulable", {"node": args.node},
                                changed=False)
        self.backend.patch_node(args.node, {"spec": {"unschedulable": None}}, strategic=True)
        return ActionResult(f"uncordoned {args.node}", {"node": args.node})


class CordonNodesAction(_KubernetesAction):
    """Cordon several nodes: all or none (a failure uncordons the ones this call cordoned).
    With ``owner`` each node it cordons is annotated ``gpu-runbook-bot/cordoned-by=OWNER``;
    nodes that were already cordoned are left as they are, unannotated."""

    name: ClassVar[str] = "k8s.cordon_nodes"
    Arguments: ClassVar[type[StrictArguments]] = NodesArguments

    def plan(self, args: NodesArguments) -> list[str]:
        lines = [f"kubectl cordon {node}" for node in args.nodes]
        if args.owner:
            lines.append(f"kubectl annotate node <each node cordoned here> "
                         f"{CORDONED_BY}={args.owner}  # nodes already cordoned are left alone")
        return lines

    def run(self, args: NodesArguments, ctx: ActionContext) -> ActionResult:
        nodes = [self.backend.get_node(name) for name in args.nodes]
        already = [n.name for n in nodes if n.unschedulable]
        done: list[str] = []
        patch: dict[str, Any] = {"spec": {"unschedulable": True}}
        if args.owner:
            patch["metadata"] = {"annotations": {CORDONED_BY: args.owner}}
        try:
            for node in nodes:
                if not node.unschedulable:
                    self.backend.patch_node(node.name, patch, strategic=True)
                    done.append(node.name)
        except KubernetesError as exc:
            for name in done:  # all or none: a half-cordoned set is nobody's plan
                self.backend.patch_node(name, _uncordon_patch(args.owner), strategic=True)
            raise ActionError(f"cordoning {_names(args.nodes)} failed, nothing left cordoned "
                              f"by this step: {exc}") from exc
        details = {"cordoned": done, "already_cordoned": already, "owner": args.owner}
        if not done:
            return ActionResult(f"{_names(already)} already cordoned", details, changed=False)
        summary = f"cordoned {_names(done)}"
        if already:
            summary += f"; {_names(already)} already cordoned (left as they were)"
        return ActionResult(summary, details)


class UncordonNodesAction(_KubernetesAction):
    """Uncordon several nodes; with ``owner`` only those annotated as cordoned by it."""

    name: ClassVar[str] = "k8s.uncordon_nodes"
    Arguments: ClassVar[type[StrictArguments]] = NodesArguments

    def plan(self, args: NodesArguments) -> list[str]:
        if args.owner:
            return [f"kubectl uncordon {node}  # if annotated {CORDONED_BY}={args.owner}"
                    for node in args.nodes]
        return [f"kubectl uncordon {node}" for node in args.nodes]

    def run(self, args: NodesArguments, ctx: ActionContext) -> ActionResult:
        done: list[str] = []
        kept: list[str] = []
        for name in args.nodes:
            node = self.backend.get_node(name)
            ours = args.owner is None or node.annotations.get(CORDONED_BY) == args.owner
            if not ours:
                kept.append(name)
                continue
            if node.unschedulable or (args.owner and CORDONED_BY in node.annotations):
                self.backend.patch_node(name, _uncordon_patch(args.owner), strategic=True)
                done.append(name)
        details = {"uncordoned": done, "left_alone": kept, "owner": args.owner}
        if not done:
            return ActionResult(
                "nothing to uncordon" + (f" (not cordoned by {args.owner}: {_names(kept)})"
                                         if kept else ""), details, changed=False)
        summary = f"uncordoned {_names(done)}"
        if kept:
            summary += f"; left {_names(kept)} as they were (not cordoned by {args.owner})"
        return ActionResult(summary, details)


def _uncordon_patch(owner: str | None) -> dict[str, Any]:
    patch: dict[str, Any] = {"spec": {"unschedulable": None}}
    if owner:
        patch["metadata"] = {"annotations": {CORDONED_BY: None}}
    return patch


class DrainAction(_KubernetesAction):
    name: ClassVar[str] = "k8s.drain"
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
        return [line + f" --timeout={_human(args.timeout)}"]

    def _refused(self, pods: list[Pod], args: DrainArguments) -> list[str]:
        problems = []
        local = [p.key for p in pods if p.emptydir]
        if local and not args.delete_emptydir_data:
            problems.append(f"pods with local storage (emptyDir) {_names(local)} would lose "
                            "it: set delete_emptydir_data: true")
        bare = [p.key for p in pods if p.owner_kind is None]
        if bare and not args.force:
            problems.append(f"pods no controller manages {_names(bare)} would not come back: "
                            "set force: true to evict them anyway")
        return problems

    def run(self, args: DrainArguments, ctx: ActionContext) -> ActionResult:
        started = time.monotonic()
        limit = min(args.timeout, ctx.remaining())
        deadline = started + limit
        node = self.backend.get_node(args.node)
        pods = self.backend.pods_on_node(args.node)
        skipped_ds = [p.key for p in pods if p.daemonset]
        skipped_mirror = [p.key for p in pods if p.mirror]
        todo = [p for p in pods if not p.daemonset and not p.mirror]
        problems = self._refused(todo, args)
        if problems:
            raise ActionError(f"cannot drain {args.node}: " + "; ".join(problems)
                              + " (nothing was changed)")
        cordoned = not node.unschedulable
        if cordoned:
            self.backend.patch_node(args.node, {"spec": {"unschedulable": True}},
                                    strategic=True)
            ctx.progress(f"cordoned {args.node}")
        if todo:
            ctx.progress(f"evicting {len(todo)} pod(s) from {args.node} "
                         f"(skipping {len(skipped_ds)} DaemonSet pod(s))")
        known = {p.key for p in pods}
        pending: dict[str, Pod] = {p.key: p for p in todo if not p.deleting}
        leaving: dict[str, Pod] = {p.key: p for p in todo if p.deleting}
        blocked: dict[str, Eviction] = {}
        retry_at: dict[str, float] = {}
        evicted: list[str] = []
        gone: list[str] = []
        refusals = 0
        check_every = FIRST_CHECK
        check_at = time.monotonic() + check_every
        while pending or leaving:
            if pending and ctx.stopping():  # never evict after a stop
                ctx.checkpoint(f"draining {args.node}")
            for key, pod in list(pending.items()):
                if retry_at.get(key, 0.0) > time.monotonic():
                    continue
                if args.max_parallel and len(leaving) >= args.max_parallel:
                    break
                answer = self.backend.evict(pod.namespace, pod.name, args.grace_period)
                if answer.outcome == "blocked":
                    refusals += 1
                    if key not in blocked:
                        ctx.progress(f"{key}: eviction refused ({self._by(pod, answer)}); "
                                     f"retrying every {_human(self.config.eviction_retry)}")
                    blocked[key] = answer
                    retry_at[key] = time.monotonic() + self.config.eviction_retry
                    continue
                del pending[key]
                blocked.pop(key, None)
                if answer.outcome == "evicted":
                    evicted.append(key)
                    leaving[key] = pod
                    ctx.progress(f"evicted {key}")
                    check_every = FIRST_CHECK
                    check_at = time.monotonic() + check_every
                else:
                    gone.append(key)
            if leaving and time.monotonic() >= check_at:
                present = {p.key: p for p in self.backend.pods_on_node(args.node)}
                for key, pod in list(leaving.items()):
                    still = present.get(key)
                    if still is None or still.uid != pod.uid:
                        del leaving[key]
                        gone.append(key)
                        ctx.progress(f"{key} gone")
                late = [p for k, p in present.items() if k not in known
                        and not p.daemonset and not p.mirror]
                if late:
                    problems = self._refused(late, args)
                    if problems:
                        raise ActionError(f"drain of {args.node}: new pods arrived despite "
                                          "the cordon: " + "; ".join(problems))
                    for pod in late:
                        known.add(pod.key)
                        (leaving if pod.deleting else pending)[pod.key] = pod
                    ctx.progress(f"new pods on {args.node}: {_names([p.key for p in late])}")
                check_every = min(check_every * 1.5, MAX_CHECK)
                check_at = time.monotonic() + check_every
            if not pending and not leaving:
                break
            if time.monotonic() >= deadline:
                raise ActionTimeout(self._timeout_text(args, limit, pending, leaving, blocked))
            ctx.checkpoint(f"draining {args.node}")
            wake = [deadline]
            if leaving:
                wake.append(check_at)
            for key in pending:
                if key in retry_at:
                    wake.append(retry_at[key])
                elif not (args.max_parallel and len(leaving) >= args.max_parallel):
                    wake.append(time.monotonic())
            self._sleep(max(0.005, ctx.pause(min(wake) - time.monotonic())))
        details: dict[str, Any] = {
            "node": args.node, "cordoned": cordoned, "evicted": evicted, "gone": gone,
            "skipped_daemonset_pods": skipped_ds, "skipped_mirror_pods": skipped_mirror,
            "eviction_refusals": refusals,
            "waited_seconds": round(time.monotonic() - started, 2)}
        changed = cordoned or bool(evicted)
        if not todo:
            summary = (f"cordoned {args.node}; no pod to evict" if cordoned
                       else f"{args.node} already drained")
        else:
            summary = f"drained {args.node}: evicted {len(evicted)} pod(s)"
            if skipped_ds:
                summary += f", left {len(skipped_ds)} DaemonSet pod(s)"
        return ActionResult(summary, details, changed=changed)

    @staticmethod
    def _by(pod: Pod, answer: Eviction) -> str:
        who = (f"PodDisruptionBudget {pod.namespace}/{answer.pdb}" if answer.pdb
               else "429 TooManyRequests")
        return f"{who}: {answer.message}" if answer.message else who

    def _timeout_text(self, args: DrainArguments, limit: float, pending: dict[str, Pod],
                      leaving: dict[str, Pod], blocked: dict[str, Eviction]) -> str:
        parts = []
        for key, pod in pending.items():
            answer = blocked.get(key)
            parts.append(f"{key} blocked by {self._by(pod, answer)}" if answer
                         else f"{key} not evicted yet")
        parts += [f"{key} evicted but still terminating" for key in leaving]
        pdbs = sorted({f"{pending[k].namespace}/{a.pdb}" for k, a in blocked.items()
                       if a.pdb and k in pending})
        hint = (f" Check the budget (kubectl -n {pdbs[0].split('/')[0]} get pdb "
                f"{pdbs[0].split('/')[1]}): its pods elsewhere must be Ready, or relax it."
                if pdbs else "")
        return (f"drain of {args.node} timed out after {_human(limit)}: "
                f"{len(pending) + len(leaving)} pod(s) still on the node: "
                + "; ".join(parts[:20]) + (f"; and {len(parts) - 20} more" if len(parts) > 20
                                            else "")
                + f". {args.node} stays cordoned (undo: k8s.uncordon).{hint} "
                "Retry with a longer timeout once the blocking pods can move.")


class LabelAction(_KubernetesAction):
    name: ClassVar[str] = "k8s.label"
    Arguments: ClassVar[type[StrictArguments]] = LabelArguments

    def plan(self, args: LabelArguments) -> list[str]:
        words = [f"{k}-" if v is None else f"{k}={v}" for k, v in args.labels.items()]
        return [f"kubectl label node {args.node} --overwrite " + " ".join(words)]

    def run(self, args: LabelArguments, ctx: ActionContext) -> ActionResult:
        node = self.backend.get_node(args.node)
        changes = {k: v for k, v in args.labels.items()
                   if (v is None and k in node.labels) or (v is not None
                                                           and node.labels.get(k) != v)}
        previous = {k: node.labels.get(k) for k in changes}
        details = {"node": args.node, "changed": changes, "previous": previous}
        if not changes:
            return ActionResult(f"{args.node} already has those labels", details,
                                changed=False)
        self.backend.patch_node(args.node, {"metadata": {"labels": changes}})
        words = [f"{k}-" if v is None else f"{k}={v}" for k, v in changes.items()]
        return ActionResult(f"labelled {args.node}: {' '.join(words)}", details)


class TaintAction(_KubernetesAction):
    name: ClassVar[str] = "k8s.taint"
    Arguments: ClassVar[type[StrictArguments]] = TaintArguments

    def plan(self, args: TaintArguments) -> list[str]:
        taint = Taint(args.key, args.effect, args.value)
        if args.remove:
            return [f"kubectl taint nodes {args.node} {args.key}:{args.effect}-"]
        return [f"kubectl taint nodes {args.node} {taint.describe()} --overwrite"]

    def run(self, args: TaintArguments, ctx: ActionContext) -> ActionResult:
        wanted = Taint(args.key, args.effect, args.value)
        for attempt in range(3):
            node = self.backend.get_node(args.node)
            others = [t for t in node.taints if (t.key, t.effect) != (args.key, args.effect)]
            current = [t for t in node.taints if (t.key, t.effect) == (args.key, args.effect)]
            if args.remove:
                if not current:
                    return ActionResult(f"{args.node} has no taint {args.key}:{args.effect}",
                                        {"node": args.node}, changed=False)
                taints = others
            else:
                if current == [wanted]:
                    return ActionResult(f"{args.node} already tainted {wanted.describe()}",
                                        {"node": args.node}, changed=False)
                taints = [*others, wanted]
            # Taints are an atomic list: send the whole list, guarded by the version read.
            patch = {"metadata": {"resourceVersion": node.resource_version},
                     "spec": {"taints": [t.as_dict() for t in taints] or None}}
            try:
                self.backend.patch_node(args.node, patch)
            except KubernetesConflict:
                if attempt == 2:
                    raise
                continue
            details = {"node": args.node, "taints": [t.describe() for t in taints],
                       "previous": [t.describe() for t in current]}
            if args.remove:
                return ActionResult(f"removed taint {args.key}:{args.effect} from {args.node}",
                                    details)
            return ActionResult(f"tainted {args.node} {wanted.describe()}", details)
        raise AssertionError("unreachable")


class WaitLabelsAction(_KubernetesAction):
    name: ClassVar[str] = "k8s.wait_labels"
    Arguments: ClassVar[type[StrictArguments]] = WaitLabelsArguments

    def plan(self, args: WaitLabelsArguments) -> list[str]:
        wanted = ", ".join(f"no {k}" if v is None else f"{k}={v}"
                           for k, v in args.labels.items())
        return [f"wait until {args.describe('')} carry {wanted} (kubectl get nodes; at most "
                f"{_human(args.timeout)})"]

    def run(self, args: WaitLabelsArguments, ctx: ActionContext) -> ActionResult:
        nodes: list[Node] = []

        def missing(node: Node) -> list[str]:
            out = []
            for key, value in args.labels.items():
                have = node.labels.get(key)
                if have != value:
                    out.append(f"{key}={have if have is not None else '(absent)'}"
                               f" (want {value if value is not None else 'absent'})")
            return out

        def check() -> tuple[bool, str, str]:
            nonlocal nodes
            nodes = self._nodes(args, None)
            pending = {n.name: missing(n) for n in nodes if missing(n)}
            text = "; ".join(f"{name}: {', '.join(m)}" for name, m in list(pending.items())[:10])
            line = f"waiting for labels on {_names(list(pending))}: {text}" if pending else ""
            return not pending, line, text

        waited = self._wait(f"waiting for labels on {args.describe('')}", args.timeout,
                            args.poll, ctx, check)
        return ActionResult(f"{_names([n.name for n in nodes])} carry the labels",
                            {"nodes": [n.name for n in nodes], "waited_seconds": round(waited, 1)},
                            changed=False)


# --- GPU Operator ----------------------------------------------------------------------

class _OperatorAction(_KubernetesAction):
    def _driver_object(self, pool: str | None) -> tuple[tuple[str, str, str], str]:
        """(group, version, plural) and name of the object that holds the driver version."""
        if self.operator.driver_mode == "clusterpolicy":
            if pool is not None:
                raise ActionError("pool applies only to kubernetes.gpu_operator.driver_mode "
                                  "nvidiadriver; this cluster uses the ClusterPolicy "
                                  f"{self.operator.clusterpolicy} for every node")
            return CLUSTERPOLICY, self.operator.clusterpolicy
        if pool is None:
            pools = ", ".join(sorted(self.operator.nvidiadrivers)) or "the NVIDIADriver names"
            raise ActionError("driver_mode nvidiadriver needs a pool (one NVIDIADriver per "
                              f"node pool: {pools})")
        return NVIDIADRIVER, self.operator.nvidiadrivers.get(pool, pool)

    @staticmethod
    def _version_of(obj: Mapping[str, Any], plural: str) -> str | None:
        spec = obj.get("spec") or {}
        value = (spec.get("driver") or {}).get("version") if plural == "clusterpolicies" \
            else spec.get("version")
        return str(value) if value else None

    def _target(self, pool: str | None) -> tuple[str | None, str | None]:
        """The operator's target driver version and, for an NVIDIADriver, its node selector."""
        (group, version, plural), name = self._driver_object(pool)
        obj = self.backend.get_custom_object(group, version, plural, name)
        selector = None
        if plural == "nvidiadrivers":
            match = (obj.get("spec") or {}).get("nodeSelector") or {}
            selector = ",".join(f"{k}={v}" for k, v in sorted(match.items())) or None
        return self._version_of(obj, plural), selector


class SetDriverVersionAction(_OperatorAction):
    name: ClassVar[str] = "gpu_operator.set_driver_version"
    Arguments: ClassVar[type[StrictArguments]] = SetDriverVersionArguments

    def _patch(self, args: SetDriverVersionArguments) -> dict[str, Any]:
        (_, _, plural), _ = self._driver_object(args.pool)
        if plural == "clusterpolicies":
            return {"spec": {"driver": {"version": args.version}}}
        return {"spec": {"version": args.version}}

    def plan(self, args: SetDriverVersionArguments) -> list[str]:
        (group, _, plural), name = self._driver_object(args.pool)
        patch = json.dumps(self._patch(args), separators=(",", ":"))
        return [f"kubectl patch {plural}.{group} {name} --type merge -p '{patch}'"]

    def run(self, args: SetDriverVersionArguments, ctx: ActionContext) -> ActionResult:
        (group, version, plural), name = self._driver_object(args.pool)
        for attempt in range(3):
            obj = self.backend.get_custom_object(group, version, plural, name)
            previous = self._version_of(obj, plural)
            details = {"object": f"{plural}.{group}/{name}", "previous_version": previous,
                       "version": args.version}
            if previous == args.version:
                return ActionResult(f"{plural}/{name} already sets driver {args.version}",
                                    details, changed=False)
            patch = self._patch(args)
            # Guarded by the version read: a concurrent change answers 409, never lost.
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if rv:
                patch["metadata"] = {"resourceVersion": rv}
            try:
                self.backend.patch_custom_object(group, version, plural, name, patch)
            except KubernetesConflict:
                if attempt == 2:
                    raise
                continue
            ctx.progress(f"{plural}/{name}: driver {previous} -> {args.version}")
            return ActionResult(f"driver version {previous} -> {args.version} "
                                f"({plural}/{name})", details)
        raise AssertionError("unreachable")


class WaitUpgradeStateAction(_OperatorAction):
    name: ClassVar[str] = "gpu_operator.wait_upgrade_state"
    Arguments: ClassVar[type[StrictArguments]] = WaitUpgradeStateArguments

    def plan(self, args: WaitUpgradeStateArguments) -> list[str]:
        target = args.version or "the operator's target version"
        return [f"wait until {args.describe(self.operator.gpu_node_selector)} reach "
                f"{self.operator.upgrade_state_label}={UPGRADE_DONE} on driver {target}; "
                f"stop at {UPGRADE_FAILED} (at most {_human(args.timeout)})"]

    def run(self, args: WaitUpgradeStateArguments, ctx: ActionContext) -> ActionResult:
        target, pool_selector = self._target(args.pool)
        version = args.version or target
        state_label = self.operator.upgrade_state_label
        version_label = self.operator.driver_version_label
        seen: dict[str, tuple[str, str | None]] = {}
        nodes: list[Node] = []

        def state(node: Node) -> tuple[str, str | None]:
            return (node.labels.get(state_label, "(none)"),
                    node.labels.get(version_label) if version_label else None)

        def done(node: Node) -> bool:
            current, have = state(node)
            return current == UPGRADE_DONE and (version is None or version_label is None
                                                or have == version)

        def check() -> tuple[bool, str, str]:
            nonlocal nodes
            nodes = self._nodes(args, pool_selector or self.operator.gpu_node_selector)
            for node in nodes:
                now = state(node)
                before = seen.get(node.name)
                if before is not None and before != now:
                    ctx.progress(f"{node.name}: {before[0]} -> {now[0]}"
                                 + (f" (driver {now[1]})" if now[1] != before[1] else ""))
                seen[node.name] = now
            failed = [n for n in nodes if state(n)[0] == UPGRADE_FAILED]
            if failed:
                raise ActionError(self._failed_text(failed, version, nodes, state))
            pending = [n for n in nodes if not done(n)]
            text = "; ".join(f"{n.name} {state(n)[0]}" + (f" (driver {state(n)[1]})"
                                                           if version_label else "")
                             for n in pending[:20])
            return not pending, "", text

        ctx.progress(f"waiting for the driver upgrade to {version or '(operator target)'}")
        waited = self._wait(f"driver upgrade to {version}", args.timeout, args.poll, ctx, check)
        names = [n.name for n in nodes]
        return ActionResult(
            f"{_names(names)} {UPGRADE_DONE} on driver {version}",
            {"version": version, "nodes": {n.name: {"state": state(n)[0],
                                                    "driver_version": state(n)[1]}
                                           for n in nodes},
             "waited_seconds": round(waited, 1)}, changed=False)

    def _failed_text(self, failed: list[Node], version: str | None, nodes: list[Node],
                     state: Callable[[Node], tuple[str, str | None]]) -> str:
        parts = []
        for node in failed:
            text = f"{node.name} reports {self.operator.upgrade_state_label}={UPGRADE_FAILED}"
            if state(node)[1]:
                text += f" (still on driver {state(node)[1]})"
            try:
                pods = [p for p in self.backend.list_pods(self.operator.namespace,
                                                          field_selector=f"spec.nodeName="
                                                                         f"{node.name}")
                        if not p.ready]
            except KubernetesError:
                pods = []
            if pods:
                text += "; not Ready there: " + ", ".join(
                    f"{p.key} {p.waiting_reason or p.phase}"
                    + (f" ({p.waiting_message})" if p.waiting_message else "") for p in pods[:3])
            parts.append(text)
        others = ", ".join(f"{n.name} {state(n)[0]}" for n in nodes if n not in failed)
        return (f"driver upgrade to {version} failed: " + "; ".join(parts)
                + (f". Other nodes: {others}" if others else "")
                + f". Look at the driver pod's logs (kubectl -n {self.operator.namespace} logs "
                "POD), fix the cause, or set the previous version back "
                "(gpu_operator.set_driver_version): the operator then recovers the node.")


class WaitValidatorAction(_OperatorAction):
    name: ClassVar[str] = "gpu_operator.wait_validator"
    Arguments: ClassVar[type[StrictArguments]] = WaitValidatorArguments

    def plan(self, args: WaitValidatorArguments) -> list[str]:
        return [f"wait until the GPU Operator validator pod ({self.operator.validator_selector} "
                f"in {self.operator.namespace}) is Ready on "
                f"{args.describe(self.operator.gpu_node_selector)} (at most "
                f"{_human(args.timeout)})"]

    def run(self, args: WaitValidatorArguments, ctx: ActionContext) -> ActionResult:
        nodes: list[Node] = []
        ready: dict[str, str] = {}

        def check() -> tuple[bool, str, str]:
            nonlocal nodes
            nodes = self._nodes(args, self.operator.gpu_node_selector)
            pods = self.backend.list_pods(self.operator.namespace,
                                          label_selector=self.operator.validator_selector)
            pending = []
            for node in nodes:
                mine = [p for p in pods if p.node == node.name and not p.deleting]
                good = next((p for p in mine if p.ready), None)
                if good is not None:
                    ready[node.name] = good.key
                else:
                    ready.pop(node.name, None)
                    pending.append(f"{node.name}: " + (", ".join(p.describe() for p in mine)
                                                        or "no validator pod"))
            line = ("validator not Ready on " + "; ".join(pending[:10])) if pending else ""
            return not pending, line, "; ".join(pending[:20])

        waited = self._wait("waiting for the GPU Operator validator", args.timeout, args.poll,
                            ctx, check)
        return ActionResult(f"validator Ready on {_names([n.name for n in nodes])}",
                            {"pods": ready, "waited_seconds": round(waited, 1)}, changed=False)


class DriverVersionsAction(_OperatorAction):
    name: ClassVar[str] = "gpu_operator.driver_versions"
    Arguments: ClassVar[type[StrictArguments]] = DriverVersionsArguments

    def plan(self, args: DriverVersionsArguments) -> list[str]:
        line = (f"read {self.operator.driver_version_label} of "
                f"{args.describe(self.operator.gpu_node_selector)}")
        if args.expect:
            line += f"; every node must report {args.expect}"
        return [line]

    def run(self, args: DriverVersionsArguments, ctx: ActionContext) -> ActionResult:
        label = self.operator.driver_version_label
        if label is None:
            raise ActionError("kubernetes.gpu_operator.driver_version_label is not set: nodes "
                              "report no driver version to read")
        target, pool_selector = self._target(args.pool)
        nodes = self._nodes(args, pool_selector or self.operator.gpu_node_selector)
        versions = {n.name: n.labels.get(label) for n in nodes}
        details = {"target": target, "versions": versions}
        if args.expect:
            wrong = [f"{name} {have or '(no label)'}" for name, have in versions.items()
                     if have != args.expect]
            if wrong:
                raise ActionError(f"not every node reports driver {args.expect} ({label}): "
                                  + ", ".join(wrong[:20]))
        groups: dict[str, list[str]] = {}
        for name, have in versions.items():
            groups.setdefault(have or "(no label)", []).append(name)
        summary = "; ".join(f"{v} on {_names(n, 5)}" for v, n in sorted(groups.items()))
        return ActionResult(f"driver {summary} (operator target {target})", details,
                            changed=False)


ACTION_CLASSES: tuple[type[_KubernetesAction], ...] = (
    CordonAction, UncordonAction, CordonNodesAction, UncordonNodesAction, DrainAction,
    LabelAction, TaintAction, WaitLabelsAction,
    SetDriverVersionAction, WaitUpgradeStateAction, WaitValidatorAction, DriverVersionsAction,
)


class KubernetesActions(ActionSet):
    """Every ``k8s.*``/``gpu_operator.*`` action: ``KubernetesActions(backend, config).all()``."""

    action_classes = ACTION_CLASSES

    def __init__(self, backend: KubernetesBackend, config: KubernetesConfig | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.backend = backend
        self.config = config or KubernetesConfig()
        self._sleep = sleep



def kubernetes_actions(config: KubernetesConfig,
                       backend: KubernetesBackend | None = None) -> list[Action]:
    """The actions for a configuration (backend: the official client from the config)."""
    if backend is None:
        from adapters.kubernetes.client import ClientBackend

        backend = ClientBackend(config)
    return KubernetesActions(backend, config).all()


__all__ = [
    "ACTION_CLASSES", "CordonAction", "CordonNodesAction", "DrainAction", "DriverVersionsAction",
    "KubernetesActions", "LabelAction", "SetDriverVersionAction", "TaintAction",
    "UncordonAction", "UncordonNodesAction", "WaitLabelsAction", "WaitUpgradeStateAction",
    "WaitValidatorAction",
    "kubernetes_actions",
]
