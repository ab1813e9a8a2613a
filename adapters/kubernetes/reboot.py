"""``k8s.request_reboot``: ask the site's reboot agent to reboot a node, wait until it is back.

The bot never reboots a node itself: it sets the node label ``reboot_request_label``
(kubernetes config) that a kured-style agent or a site DaemonSet acts on, then waits until
the node's ``status.nodeInfo.bootID`` changed and it is Ready again, and removes the label.
The bootID from before is kept in an annotation, so a run resumed after a crash waits on.
"""

from __future__ import annotations

import time
from typing import ClassVar

from pydantic import Field

from adapters.actions import (
    ActionContext,
    ActionError,
    ActionResult,
    ActionStopped,
    ActionTimeout,
    Seconds,
    StrictArguments,
)
from adapters.kubernetes.backend import KubernetesError, Node
from adapters.kubernetes.base import KubernetesAction, NodeArguments
from kit.durations import format_duration

BOOT_ID_BEFORE = "gpu-runbook-bot/boot-id-before-reboot"  # annotation: the bootID asked from


class RequestRebootArguments(NodeArguments):
    timeout: Seconds = 1800.0  # until the node booted again and is Ready
    poll: Seconds = Field(default=5.0, le=60)


class RequestRebootAction(KubernetesAction):
    """Label the node, wait for a new bootID and Ready, remove the label (and the
    annotation). A label already there with the annotation is a request of an earlier run:
    it waits on. When the node does not come back in time the request is withdrawn (the
    label removed, so a late agent does not reboot it unannounced) and the step fails."""

    name: ClassVar[str] = "k8s.request_reboot"
    takes_out: ClassVar[tuple[str, ...]] = ("node",)
    Arguments: ClassVar[type[StrictArguments]] = RequestRebootArguments

    @property
    def label(self) -> str:
        return self.config.reboot_request_label

    def plan(self, args: RequestRebootArguments) -> list[str]:
        return [f"kubectl label node {args.node} {self.label}=<unix time> --overwrite  "
                f"# the site's reboot agent reboots it; bootID kept in {BOOT_ID_BEFORE}",
                f"wait until {args.node} booted again (new status.nodeInfo.bootID) and is "
                f"Ready (at most {format_duration(args.timeout)})",
                f"kubectl label node {args.node} {self.label}-"]

    def run(self, args: RequestRebootArguments, ctx: ActionContext) -> ActionResult:
        node = self.backend.get_node(args.node)
        before = node.annotations.get(BOOT_ID_BEFORE) if self.label in node.labels else None
        if before:
            ctx.progress(f"a reboot of {args.node} was already requested "
                         f"({self.label}={node.labels[self.label]}): waiting for it")
        else:
            before = self._request(node, ctx)
        try:
            waited, after = self._wait_back(args, before, ctx)
        except ActionError as exc:
            text = f"{exc}{self._withdraw(args.node)}"
            kind = type(exc) if type(exc) in (ActionTimeout, ActionStopped) else ActionError
            raise kind(text) from exc
        self._clear(args.node)
        ctx.progress(f"{args.node} rebooted and Ready; {self.label} removed")
        return ActionResult(f"{args.node} rebooted (bootID {before[:8]}... -> {after[:8]}...) "
                            "and is Ready",
                            {"node": args.node, "label": self.label, "boot_id_before": before,
                             "boot_id_after": after, "waited_seconds": round(waited, 1)})

    def _request(self, node: Node, ctx: ActionContext) -> str:
        if not node.boot_id:
            raise ActionError(f"{node.name} reports no status.nodeInfo.bootID: a reboot could "
                              "not be told from no reboot; reboot it by hand")
        ctx.checkpoint(f"about to ask for a reboot of {node.name}")
        stamp = str(int(time.time()))
        self.backend.patch_node(node.name, {"metadata": {
            "labels": {self.label: stamp}, "annotations": {BOOT_ID_BEFORE: node.boot_id}}})
        ctx.progress(f"asked for a reboot of {node.name}: {self.label}={stamp} (the site's "
                     "reboot agent acts on it)")
        return node.boot_id

    def _wait_back(self, args: RequestRebootArguments, before: str,
                   ctx: ActionContext) -> tuple[float, str]:
        seen: list[Node] = []
        state = ["not read yet"]

        def check() -> tuple[bool, str, str]:
            node = self.backend.get_node(args.node)
            seen[:] = [node]
            rebooted = node.boot_id != before
            state[0] = ("booted again, not Ready" if rebooted else
                        "still Ready on the same bootID" if node.ready else
                        "NotReady on the same bootID")
            if rebooted and node.ready:
                return True, "", ""
            return False, f"{args.node}: {state[0]}" if rebooted or not node.ready else "", ""

        try:
            waited = self._wait(f"waiting for {args.node} to reboot", args.timeout, args.poll,
                                ctx, check)
        except ActionTimeout as exc:
            raise ActionTimeout(
                f"{args.node} did not come back from a reboot within "
                f"{format_duration(args.timeout)} ({state[0]}): no reboot agent acted on the "
                f"label {self.label}, or the node did not boot (the bot does not reboot nodes "
                "itself: a kured-style agent or a site DaemonSet must watch that label)"
            ) from exc
        return waited, seen[0].boot_id

    def _clear(self, name: str) -> None:
        self.backend.patch_node(name, {"metadata": {"labels": {self.label: None},
                                                    "annotations": {BOOT_ID_BEFORE: None}}})

    def _withdraw(self, name: str) -> str:
        try:
            self._clear(name)
        except KubernetesError as exc:
            return f"; removing {self.label} failed too ({exc}): remove it by hand"
        return f"; the reboot request ({self.label}) was withdrawn"


__all__ = ["BOOT_ID_BEFORE", "RequestRebootAction", "RequestRebootArguments"]
