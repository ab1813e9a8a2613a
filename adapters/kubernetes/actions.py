"""The ``k8s.*`` node actions (cordon, uncordon, label, taint, wait for labels; drain is in
``adapters.kubernetes.drain``) and ``KubernetesActions``, every ``k8s.*``/``gpu_operator.*``.

Each reads the node first and changes only what still needs changing, so a step run twice
equals a step run once; ``plan()`` shows the kubectl line an on-call engineer would type.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from adapters.actions import (
    ActionContext,
    ActionError,
    ActionResult,
    ActionSet,
    Seconds,
    StrictArguments,
)
from adapters.kubernetes import cordons
from adapters.kubernetes.backend import (
    KubernetesBackend,
    KubernetesConflict,
    KubernetesError,
    Node,
    Taint,
)
from adapters.kubernetes.base import (
    KubernetesAction,
    NodeArguments,
    NodeSetArguments,
    check_label_key,
    check_label_value,
    check_labels,
    check_node_names,
    listed,
)
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.cordons import CORDONED_BY, FAILED_CHECK, cordon_patch
from adapters.kubernetes.drain import DrainAction
from adapters.kubernetes.fleet_drain import FLEET_ACTIONS
from adapters.kubernetes.gpu_diag import GpuDiagAction
from adapters.kubernetes.gpu_operator import (
    DriverVersionsAction,
    SetDriverVersionAction,
    WaitUpgradeStateAction,
    WaitValidatorAction,
)
from adapters.kubernetes.mig import MIG_ACTIONS
from adapters.kubernetes.reboot import RequestRebootAction
from adapters.kubernetes.upgrade_skip import UPGRADE_ACTIONS
from kit.durations import format_duration


class NodesArguments(StrictArguments):
    """Several nodes at once; ``owner`` marks the nodes this cordon made unschedulable, so
    the matching uncordon leaves alone the ones somebody else had cordoned."""

    nodes: list[str] = Field(min_length=1, description="Kubernetes node names")
    owner: str | None = Field(default=None, description="e.g. window-12 (an annotation value)")

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: list[str]) -> list[str]:
        return list(dict.fromkeys(check_node_names(value)))

    @field_validator("owner")
    @classmethod
    def _owner(cls, value: str | None) -> str | None:
        return None if value is None else check_label_value(value)


class LabelArguments(NodeArguments):
    labels: dict[str, str | None] = Field(min_length=1)  # None removes the label

    _labels = field_validator("labels")(check_labels)


class TaintArguments(NodeArguments):
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"
    remove: bool = False

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        return check_label_key(value)

    @field_validator("value")
    @classmethod
    def _value(cls, value: str) -> str:
        return check_label_value(value)


class WaitLabelsArguments(NodeSetArguments):
    labels: dict[str, str | None] = Field(min_length=1)  # None: the label must be absent
    timeout: Seconds = 600.0
    poll: Seconds = 2.0

    _labels = field_validator("labels")(check_labels)

    @model_validator(mode="after")
    def _some_nodes(self) -> WaitLabelsArguments:
        if not (self.names or self.label_selector):
            raise ValueError("give node, nodes or label_selector")
        return self


class CordonAction(KubernetesAction):
    name: ClassVar[str] = "k8s.cordon"
    takes_out: ClassVar[tuple[str, ...]] = ("node",)
    Arguments: ClassVar[type[StrictArguments]] = NodeArguments

    def plan(self, args: NodeArguments) -> list[str]:
        return [f"kubectl cordon {args.node}"]

    def run(self, args: NodeArguments, ctx: ActionContext) -> ActionResult:
        node = self.backend.get_node(args.node)
        if node.unschedulable:
            return ActionResult(f"{args.node} already cordoned", {"node": args.node},
                                changed=False)
        self.backend.patch_node(args.node, cordon_patch(ctx.execution_id), strategic=True)
        return ActionResult(f"cordoned {args.node}", {"node": args.node})


class UncordonArguments(NodeArguments):
    # the undo of this execution's own cordon: lifts only that, says what it left
    only_this_run: bool = False
    # lift a cordon someone else made, or the bot made for a failed check (break-glass)
    override_drains: bool = False


class UncordonAction(KubernetesAction):
    """Uncordon a node: only a cordon the bot made to work on it (``cordons.liftable``);
    another owner's, or one kept for a failed check, is refused unless ``override_drains``."""

    name: ClassVar[str] = "k8s.uncordon"
    Arguments: ClassVar[type[StrictArguments]] = UncordonArguments

    def plan(self, args: UncordonArguments) -> list[str]:
        if args.only_this_run:
            return [f"kubectl uncordon {args.node}  # if annotated "
                    f"{CORDONED_BY}=execution-<this execution> and no failed check"]
        lines = [f"kubectl uncordon {args.node}"]
        try:
            node = self.backend.get_node(args.node)
        except KubernetesError as exc:
            return [f"{args.node}'s cordon could not be read now ({exc}); it is read again "
                    "before anything is uncordoned", *lines]
        if node.unschedulable and not cordons.liftable(node):
            verdict = ("lifted: override_drains=true" if args.override_drains else
                       "STAYS CORDONED: not lifted without override_drains=true (break-glass)")
            lines.insert(0, f"{args.node} is {cordons.whose(node)}: {verdict}")
        return lines

    def run(self, args: UncordonArguments, ctx: ActionContext) -> ActionResult:
        node = self.backend.get_node(args.node)
        details = {"node": args.node}
        if not node.unschedulable:
            return ActionResult(f"{args.node} already schedulable", details, changed=False)
        if args.only_this_run and not cordons.made_by(node, ctx.execution_id):
            return ActionResult(f"{args.node} left cordoned: {cordons.whose(node)}", details,
                                changed=False)
        if not (args.override_drains or cordons.liftable(node)):
            raise ActionError(f"{args.node} is {cordons.whose(node)}: not uncordoned. To "
                              "return it anyway, ask again with override_drains=true "
                              "(break-glass: one more approval)")
        self.backend.patch_node(args.node, cordons.uncordon_patch(), strategic=True)
        return ActionResult(f"uncordoned {args.node}", details)


class CordonNodesAction(KubernetesAction):
    """Cordon several nodes: all or none (a failure uncordons the ones this call cordoned).
    With ``owner`` each node it cordons is annotated ``gpu-runbook-bot/cordoned-by=OWNER``;
    nodes that were already cordoned are left as they are, unannotated."""

    name: ClassVar[str] = "k8s.cordon_nodes"
    takes_out: ClassVar[tuple[str, ...]] = ("nodes",)
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
            raise ActionError(f"cordoning {listed(args.nodes)} failed, nothing left cordoned "
                              f"by this step: {exc}") from exc
        details = {"cordoned": done, "already_cordoned": already, "owner": args.owner}
        if not done:
            return ActionResult(f"{listed(already)} already cordoned", details, changed=False)
        summary = f"cordoned {listed(done)}"
        if already:
            summary += f"; {listed(already)} already cordoned (left as they were)"
        return ActionResult(summary, details)


class UncordonNodesAction(KubernetesAction):
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
            if not ours or FAILED_CHECK in node.annotations:  # a check found it faulty
                kept.append(name)
                continue
            if node.unschedulable or (args.owner and CORDONED_BY in node.annotations):
                self.backend.patch_node(name, _uncordon_patch(args.owner), strategic=True)
                done.append(name)
        details = {"uncordoned": done, "left_alone": kept, "owner": args.owner}
        why = f"not cordoned by {args.owner}, or kept out for a failed check"
        if not done:
            return ActionResult(
                "nothing to uncordon" + (f" ({why}: {listed(kept)})" if kept else ""),
                details, changed=False)
        summary = f"uncordoned {listed(done)}"
        if kept:
            summary += f"; left {listed(kept)} as they were ({why})"
        return ActionResult(summary, details)


def _uncordon_patch(owner: str | None) -> dict[str, Any]:
    return cordons.uncordon_patch() if owner else {"spec": {"unschedulable": None}}


class LabelAction(KubernetesAction):
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


class TaintAction(KubernetesAction):
    name: ClassVar[str] = "k8s.taint"
    takes_out: ClassVar[tuple[str, ...]] = ("node",)
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


class WaitLabelsAction(KubernetesAction):
    name: ClassVar[str] = "k8s.wait_labels"
    Arguments: ClassVar[type[StrictArguments]] = WaitLabelsArguments

    def plan(self, args: WaitLabelsArguments) -> list[str]:
        wanted = ", ".join(f"no {k}" if v is None else f"{k}={v}"
                           for k, v in args.labels.items())
        return [f"wait until {args.describe('')} carry {wanted} (kubectl get nodes; at most "
                f"{format_duration(args.timeout)})"]

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
            line = f"waiting for labels on {listed(list(pending))}: {text}" if pending else ""
            return not pending, line, text

        waited = self._wait(f"waiting for labels on {args.describe('')}", args.timeout,
                            args.poll, ctx, check)
        return ActionResult(f"{listed([n.name for n in nodes])} carry the labels",
                            {"nodes": [n.name for n in nodes], "waited_seconds": round(waited, 1)},
                            changed=False)


# every action that needs only the backend; the adapter's ACTION_CLASSES (adapter.py) adds
# those that read DCGM through Prometheus
BACKEND_ACTIONS: tuple[type[KubernetesAction], ...] = (
    CordonAction, UncordonAction, CordonNodesAction, UncordonNodesAction, DrainAction,
    LabelAction, TaintAction, WaitLabelsAction, RequestRebootAction, GpuDiagAction,
    SetDriverVersionAction, WaitUpgradeStateAction, WaitValidatorAction, DriverVersionsAction,
    *MIG_ACTIONS, *UPGRADE_ACTIONS, *FLEET_ACTIONS,
)


class KubernetesActions(ActionSet[KubernetesBackend, KubernetesConfig]):
    """Every ``k8s.*``/``gpu_operator.*`` action: ``KubernetesActions(backend, config).all()``."""

    action_classes = BACKEND_ACTIONS
    default_config = KubernetesConfig


__all__ = [
    "BACKEND_ACTIONS", "CORDONED_BY", "CordonAction", "CordonNodesAction", "DrainAction",
    "DriverVersionsAction", "KubernetesActions", "LabelAction", "SetDriverVersionAction",
    "TaintAction", "UncordonAction", "UncordonNodesAction", "WaitLabelsAction",
    "WaitUpgradeStateAction", "WaitValidatorAction",
]
