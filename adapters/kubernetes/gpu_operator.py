"""The ``gpu_operator.*`` actions: set the NVIDIA GPU Operator's driver version and wait
for its rolling upgrade (node upgrade-state labels, the validator pods).

They change only the ClusterPolicy or NVIDIADriver object; the operator itself drains and
upgrades the nodes, so nothing here touches a node or a pod.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from pydantic import Field

from adapters.actions import (
    WHOLE_POOL,
    ActionContext,
    ActionError,
    ActionResult,
    ActionStopped,
    ActionTimeout,
    Seconds,
    StrictArguments,
)
from adapters.kubernetes import cordons
from adapters.kubernetes.backend import KubernetesConflict, KubernetesError, Node
from adapters.kubernetes.base import KubernetesAction, NodeSetArguments, listed
from adapters.kubernetes.config import GpuOperatorConfig
from kit.durations import format_duration

OBJECT_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
VERSION = r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$"
UPGRADE_DONE, UPGRADE_FAILED = "upgrade-done", "upgrade-failed"
CLUSTERPOLICY = ("nvidia.com", "v1", "clusterpolicies")
NVIDIADRIVER = ("nvidia.com", "v1alpha1", "nvidiadrivers")


class SetDriverVersionArguments(StrictArguments):
    version: str = Field(pattern=VERSION)
    pool: str | None = Field(default=None, pattern=OBJECT_NAME)  # driver_mode nvidiadriver


class WaitUpgradeStateArguments(NodeSetArguments):
    pool: str | None = Field(default=None, pattern=OBJECT_NAME)  # driver_mode nvidiadriver
    version: str | None = Field(default=None, pattern=VERSION)  # default: the operator's target
    timeout: Seconds = 3600.0
    poll: Seconds = 2.0
    hint: str = Field(default="", max_length=500)  # added to a stop (failed, timeout, cancel)


class WaitValidatorArguments(NodeSetArguments):
    timeout: Seconds = 600.0
    poll: Seconds = 2.0


class DriverVersionsArguments(NodeSetArguments):
    pool: str | None = Field(default=None, pattern=OBJECT_NAME)
    expect: str | None = Field(default=None, pattern=VERSION)  # fail unless every node has it


class _OperatorAction(KubernetesAction):
    @property
    def operator(self) -> GpuOperatorConfig:
        return self.config.gpu_operator

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
    takes_out: ClassVar[tuple[str, ...]] = (WHOLE_POOL,)
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
                f"stop at {UPGRADE_FAILED} (at most {format_duration(args.timeout)})"]

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
                done_now = [n.name for n in nodes if done(n)]
                raise ActionError(self._failed_text(failed, version, nodes, state)
                                  + (f" Done (on driver {version}): {listed(done_now)}."
                                     if done_now and version_label else "")
                                  + (f" {args.hint}" if args.hint else ""))
            pending = [n for n in nodes if not done(n)]
            text = "; ".join(f"{n.name} {state(n)[0]}" + (f" (driver {state(n)[1]})"
                                                           if version_label else "")
                             for n in pending[:20])
            return not pending, "", text

        ctx.progress(f"waiting for the driver upgrade to {version or '(operator target)'}")
        try:
            waited = self._wait(f"driver upgrade to {version}", args.timeout, args.poll, ctx,
                                check)
        except (ActionTimeout, ActionStopped) as exc:  # a cancel or a timeout: what next
            if not args.hint:
                raise
            raise type(exc)(f"{exc}. {args.hint}") from exc
        names = [n.name for n in nodes]
        return ActionResult(
            f"{listed(names)} {UPGRADE_DONE} on driver {version}",
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
                f"{format_duration(args.timeout)})"]

    def run(self, args: WaitValidatorArguments, ctx: ActionContext) -> ActionResult:
        nodes: list[Node] = []
        ready: dict[str, str] = {}
        pending: dict[str, str] = {}

        def check() -> tuple[bool, str, str]:
            nonlocal nodes
            nodes = self._nodes(args, self.operator.gpu_node_selector)
            pods = self.backend.list_pods(self.operator.namespace,
                                          label_selector=self.operator.validator_selector)
            pending.clear()
            for node in nodes:
                mine = [p for p in pods if p.node == node.name and not p.deleting]
                good = next((p for p in mine if p.ready), None)
                if good is not None:
                    ready[node.name] = good.key
                else:
                    ready.pop(node.name, None)
                    pending[node.name] = (", ".join(p.describe() for p in mine)
                                          or "no validator pod")
            said = [f"{name}: {why}" for name, why in pending.items()]
            line = ("validator not Ready on " + "; ".join(said[:10])) if said else ""
            return not said, line, "; ".join(said[:20])

        try:
            waited = self._wait("waiting for the GPU Operator validator", args.timeout,
                                args.poll, ctx, check)
        except ActionTimeout as exc:
            raise ActionTimeout(str(exc) + self._keep_out(nodes, pending, ctx)) from exc
        return ActionResult(f"validator Ready on {listed([n.name for n in nodes])}",
                            {"pods": ready, "waited_seconds": round(waited, 1)}, changed=False)

    def _keep_out(self, nodes: list[Node], pending: dict[str, str], ctx: ActionContext) -> str:
        """A failed validation: each cordoned node it failed on is kept out for it (the
        failed-check annotation), so no routine return to service lifts its cordon."""
        kept = []
        for node in nodes:
            if node.name in pending and node.unschedulable:
                try:
                    self.backend.patch_node(node.name, cordons.failed_check_patch(
                        ctx.execution_id, f"GPU Operator validator not Ready: "
                        f"{pending[node.name]}"), strategic=True)
                    kept.append(node.name)
                except KubernetesError as exc:
                    return f". Could not mark {node.name} as failed ({exc}): it stays cordoned"
        return (f". {listed(kept)} stays cordoned, marked as a failed check "
                f"({cordons.FAILED_CHECK})" if kept else "")


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
        summary = "; ".join(f"{v} on {listed(n, 5)}" for v, n in sorted(groups.items()))
        return ActionResult(f"driver {summary} (operator target {target})", details,
                            changed=False)
