"""Canary driver upgrades through the GPU Operator: ``gpu_operator.skip_upgrade`` puts the
operator's ``nvidia.com/gpu-driver-upgrade.skip=true`` on every GPU node but the canaries
(the operator leaves such a node in upgrade-required on its old driver) and, with
``remove``, takes it off the nodes it put it on; ``gpu_operator.set_upgrade_policy`` sets
the ClusterPolicy's upgradePolicy (maxParallelUpgrades, maxUnavailable, drain).
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from pydantic import Field, field_validator

from adapters.actions import ActionContext, ActionError, ActionResult, Seconds, StrictArguments
from adapters.kubernetes.backend import Node
from adapters.kubernetes.base import check_label_key, listed
from adapters.kubernetes.gpu_operator import CLUSTERPOLICY, _OperatorAction
from kit import hostlist

SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"
SET_BY = "gpu-runbook-bot/upgrade-skip-set"  # a label: which skip labels are the bot's


class SkipUpgradeArguments(StrictArguments):
    canary: str = Field(min_length=1, description="hostlist: the nodes left to upgrade")
    kubernetes_names: dict[str, str] = Field(default_factory=dict)  # bot name -> node name
    remove: bool = False  # take the skip label off the nodes marked SET_BY=true
    label: str = SKIP_LABEL
    marker: str = SET_BY
    others: str = ""  # must be empty: every GPU node but the canaries is held back

    _label = field_validator("label", "marker")(check_label_key)

    def names(self) -> list[str]:
        if self.others:
            raise ActionError(f"nodes={self.others} does not apply to the Kubernetes pool: the "
                              "GPU Operator upgrades every GPU node after the canaries; "
                              "leave nodes= out")
        return [self.kubernetes_names.get(n, n) for n in hostlist.expand(self.canary)]


class SkipUpgradeAction(_OperatorAction):
    """Hold every GPU node but the canaries back from the operator's driver upgrade."""

    name: ClassVar[str] = "gpu_operator.skip_upgrade"
    Arguments: ClassVar[type[StrictArguments]] = SkipUpgradeArguments

    def _canaries(self, args: SkipUpgradeArguments) -> list[str]:
        if self.operator.driver_version_label is None:
            raise ActionError("a canary upgrade is followed by each node's driver version: set "
                              "kubernetes.gpu_operator.driver_version_label (without it an "
                              "upgrade-done node on the old driver looks done)")
        return args.names()

    def plan(self, args: SkipUpgradeArguments) -> list[str]:
        canaries = self._canaries(args)
        if args.remove:
            return [f"kubectl label nodes -l {args.marker}=true {args.label}- {args.marker}-"
                    " (only the nodes this bot held back)"]
        return [f"kubectl label node NODE {args.label}=true {args.marker}=true for every node "
                f"matching {self.operator.gpu_node_selector} but {listed(canaries)}; a node "
                f"that already has {args.label}=true (the site's) is left as it is"]

    def run(self, args: SkipUpgradeArguments, ctx: ActionContext) -> ActionResult:
        canaries = self._canaries(args)
        if args.remove:
            return self._remove(args)
        nodes = {n.name: n for n in self.backend.list_nodes(self.operator.gpu_node_selector)}
        self._check_canaries(args, canaries, nodes)
        labelled, held, site, freed = [], [], [], []
        for name, node in nodes.items():
            ours = node.labels.get(args.marker) == "true"
            if name in canaries:
                if ours:  # held back by an earlier run: a canary now
                    self.backend.patch_node(name, {"metadata": {"labels": {
                        args.label: None, args.marker: None}}})
                    freed.append(name)
            elif ours:
                held.append(name)
            elif node.labels.get(args.label) == "true":
                site.append(name)
            else:  # one patch: the label and the bot's mark together
                self.backend.patch_node(name, {"metadata": {"labels": {
                    args.label: "true", args.marker: "true"}}})
                labelled.append(name)
        held = sorted(held + labelled)
        if labelled:
            ctx.progress(f"{args.label}=true on {listed(labelled)}")
        details = {"canaries": canaries, "held": held, "labelled": labelled,
                   "site_skipped": sorted(site), "freed": freed}
        return ActionResult(f"{listed(held)} held back ({args.label}=true); canaries "
                            f"{listed(canaries)} upgrade first"
                            + (f"; the site skips {listed(sorted(site))}" if site else ""),
                            details, changed=bool(labelled or freed))

    @staticmethod
    def _check_canaries(args: SkipUpgradeArguments, canaries: list[str],
                        nodes: dict[str, Node]) -> None:
        missing = [n for n in canaries if n not in nodes]
        if missing:
            raise ActionError(f"canary {listed(missing)} is not a GPU node of the cluster")
        skipped = [n for n in canaries if nodes[n].labels.get(args.label) == "true"
                   and nodes[n].labels.get(args.marker) != "true"]
        if skipped:
            raise ActionError(f"canary {listed(skipped)} carries {args.label}=true (the "
                              "site's): the operator would never upgrade it; choose another "
                              "canary or remove that label first")

    def _remove(self, args: SkipUpgradeArguments) -> ActionResult:
        released = []
        for node in self.backend.list_nodes(f"{args.marker}=true"):
            self.backend.patch_node(node.name, {"metadata": {"labels": {
                args.label: None, args.marker: None}}})
            released.append(node.name)
        return ActionResult((f"{args.label} removed from {listed(released)}: they upgrade "
                             "now" if released else f"no node carries {args.marker}=true"),
                            {"released": released}, changed=bool(released))


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


UPGRADE_ACTIONS = (SkipUpgradeAction, SetUpgradePolicyAction)
