"""Canary driver upgrades through the GPU Operator: ``gpu_operator.canary_driver`` labels the
canary nodes and gives them a second NVIDIADriver (its nodeSelector that label, its version
the new one), or removes both; ``gpu_operator.set_upgrade_policy`` sets the ClusterPolicy's
upgradePolicy (maxParallelUpgrades, maxUnavailable, drain) before the rest follows.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from pydantic import Field, field_validator

from adapters.actions import ActionContext, ActionError, ActionResult, Seconds, StrictArguments
from adapters.kubernetes.backend import KubernetesNotFound
from adapters.kubernetes.base import check_label_key, listed
from adapters.kubernetes.gpu_operator import (
    CLUSTERPOLICY,
    NVIDIADRIVER,
    OBJECT_NAME,
    VERSION,
    _OperatorAction,
)
from adapters.slurm import hostlist

MANAGED_BY = {"app.kubernetes.io/managed-by": "gpu-runbook-bot"}


class CanaryDriverArguments(StrictArguments):
    name: str = Field(default="gpu-runbook-bot-canary", pattern=OBJECT_NAME)
    nodes: str = Field(min_length=1, description="hostlist: the canary nodes")
    label: str = "gpu-runbook-bot/driver-canary"
    version: str | None = Field(default=None, pattern=VERSION)  # required unless remove
    remove: bool = False  # the NVIDIADriver deleted and the label taken off the nodes
    others: str = ""  # must be empty: the ClusterPolicy upgrades every other GPU node

    _label = field_validator("label")(check_label_key)

    def names(self) -> list[str]:
        if self.others:
            raise ActionError(f"nodes={self.others} does not apply to the Kubernetes pool: the "
                              "GPU Operator's ClusterPolicy upgrades every GPU node after the "
                              "canaries; leave nodes= out")
        if not self.remove and not self.version:
            raise ActionError("a canary NVIDIADriver needs a version")
        return hostlist.expand(self.nodes)


class CanaryDriverAction(_OperatorAction):
    name: ClassVar[str] = "gpu_operator.canary_driver"
    Arguments: ClassVar[type[StrictArguments]] = CanaryDriverArguments

    def _object(self, args: CanaryDriverArguments) -> dict[str, Any]:
        (group, version, plural), policy = CLUSTERPOLICY, self.operator.clusterpolicy
        try:
            driver = ((self.backend.get_custom_object(group, version, plural, policy)
                       .get("spec") or {}).get("driver") or {})
        except KubernetesNotFound:
            driver = {}
        spec = {key: driver[key] for key in ("repository", "image") if driver.get(key)}
        return {"apiVersion": f"{NVIDIADRIVER[0]}/{NVIDIADRIVER[1]}", "kind": "NVIDIADriver",
                "metadata": {"name": args.name, "labels": MANAGED_BY},
                "spec": {"driverType": "gpu", **spec, "version": args.version,
                         "nodeSelector": {args.label: "true"}}}

    def _nodes_of(self, args: CanaryDriverArguments) -> list[str]:
        if not args.remove and self.operator.driver_version_label is None:
            raise ActionError("a canary upgrade is followed by each node's driver version: set "
                              "kubernetes.gpu_operator.driver_version_label (without it an "
                              "upgrade-done node on the old driver looks done)")
        return args.names()

    def plan(self, args: CanaryDriverArguments) -> list[str]:
        nodes = self._nodes_of(args)
        plural = f"{NVIDIADRIVER[2]}.{NVIDIADRIVER[0]}"
        if args.remove:
            return [f"kubectl delete {plural} {args.name} --ignore-not-found",
                    *(f"kubectl label node {n} {args.label}-" for n in nodes)]
        spec = json.dumps({"version": args.version, "nodeSelector": {args.label: "true"}},
                          separators=(",", ":"))
        return [*(f"kubectl label node {n} {args.label}=true --overwrite" for n in nodes),
                f"kubectl apply {plural} {args.name} (spec {spec}; image and repository "
                "as the ClusterPolicy's)"]

    def run(self, args: CanaryDriverArguments, ctx: ActionContext) -> ActionResult:
        nodes = self._nodes_of(args)
        if args.remove:
            return self._remove(args, nodes)
        labelled = []
        for node in nodes:
            if self.backend.get_node(node).labels.get(args.label) != "true":
                self.backend.patch_node(node, {"metadata": {"labels": {args.label: "true"}}})
                labelled.append(node)
        group, version, plural = NVIDIADRIVER
        try:
            current = self.backend.get_custom_object(group, version, plural, args.name)
        except KubernetesNotFound:
            current = None
        spec = (current or {}).get("spec") or {}
        details = {"object": f"{plural}.{group}/{args.name}", "labelled": labelled,
                   "nodes": nodes, "version": args.version}
        if current is None:
            self.backend.create_custom_object(group, version, plural, self._object(args))
        elif spec.get("version") != args.version or \
                spec.get("nodeSelector") != {args.label: "true"}:
            self.backend.patch_custom_object(group, version, plural, args.name, {"spec": {
                "version": args.version, "nodeSelector": {args.label: "true"}}})
        elif not labelled:
            return ActionResult(f"{args.name} already puts {listed(nodes)} on driver "
                                f"{args.version}", details, changed=False)
        ctx.progress(f"{plural}/{args.name}: driver {args.version} for {listed(nodes)}")
        return ActionResult(f"NVIDIADriver {args.name} puts {listed(nodes)} "
                            f"({args.label}=true) on driver {args.version}", details)

    def _remove(self, args: CanaryDriverArguments, nodes: list[str]) -> ActionResult:
        group, version, plural = NVIDIADRIVER
        try:
            self.backend.get_custom_object(group, version, plural, args.name)
            existed = True
        except KubernetesNotFound:
            existed = False
        if existed:
            self.backend.delete_custom_object(group, version, plural, args.name)
        unlabelled = []
        for node in nodes:
            if args.label in self.backend.get_node(node).labels:
                self.backend.patch_node(node, {"metadata": {"labels": {args.label: None}}})
                unlabelled.append(node)
        details = {"object": f"{plural}.{group}/{args.name}", "deleted": existed,
                   "unlabelled": unlabelled}
        return ActionResult(f"NVIDIADriver {args.name} removed; {listed(nodes)} follow the "
                            "ClusterPolicy again", details, changed=existed or bool(unlabelled))


class UpgradePolicyArguments(StrictArguments):
    max_parallel: int = Field(ge=0, le=1000)  # maxParallelUpgrades (0: no limit)
    max_unavailable: int | str = "25%"  # nodes, or a percentage of the GPU nodes
    drain: bool = True
    drain_timeout: Seconds = 300.0
    delete_emptydir: bool = True

    @field_validator("max_unavailable")
    @classmethod
    def _unavailable(cls, value: int | str) -> int | str:
        if isinstance(value, int) or value.isdigit():
            return int(value)
        if not re.fullmatch(r"\d{1,3}%", value):
            raise ValueError(f"maxUnavailable {value!r} is a number of nodes or a percentage")
        return value


class SetUpgradePolicyAction(_OperatorAction):
    """The ClusterPolicy's ``spec.driver.upgradePolicy``: autoUpgrade on, at most
    ``max_parallel`` nodes upgrading at once, ``maxUnavailable``, and the drain of each node."""

    name: ClassVar[str] = "gpu_operator.set_upgrade_policy"
    Arguments: ClassVar[type[StrictArguments]] = UpgradePolicyArguments

    @staticmethod
    def _policy(args: UpgradePolicyArguments) -> dict[str, Any]:
        return {"autoUpgrade": True, "maxParallelUpgrades": args.max_parallel,
                "maxUnavailable": args.max_unavailable,
                "drain": {"enable": args.drain, "force": False,
                          "timeoutSeconds": int(args.drain_timeout),
                          "deleteEmptyDir": args.delete_emptydir}}

    def plan(self, args: UpgradePolicyArguments) -> list[str]:
        self._driver_object(None)  # the ClusterPolicy mode only
        patch = json.dumps({"spec": {"driver": {"upgradePolicy": self._policy(args)}}},
                           separators=(",", ":"))
        return [f"kubectl patch {CLUSTERPOLICY[2]}.{CLUSTERPOLICY[0]} "
                f"{self.operator.clusterpolicy} --type merge -p '{patch}'"]

    def run(self, args: UpgradePolicyArguments, ctx: ActionContext) -> ActionResult:
        (group, version, plural), name = self._driver_object(None)
        obj = self.backend.get_custom_object(group, version, plural, name)
        before = ((obj.get("spec") or {}).get("driver") or {}).get("upgradePolicy") or {}
        wanted = self._policy(args)
        merged = {**before, **wanted, "drain": {**(before.get("drain") or {}),
                                                **wanted["drain"]}}
        details = {"object": f"{plural}.{group}/{name}", "before": before, "policy": merged}
        if merged == before:
            return ActionResult(f"{plural}/{name} already has that upgrade policy", details,
                                changed=False)
        self.backend.patch_custom_object(group, version, plural, name,
                                         {"spec": {"driver": {"upgradePolicy": wanted}}})
        return ActionResult(f"{plural}/{name}: maxParallelUpgrades {args.max_parallel}, "
                            f"maxUnavailable {args.max_unavailable}, drain "
                            f"{'on' if args.drain else 'off'}", details)


CANARY_ACTIONS = (CanaryDriverAction, SetUpgradePolicyAction)
