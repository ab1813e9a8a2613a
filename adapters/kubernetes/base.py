"""What every ``k8s.*`` and ``gpu_operator.*`` action shares: name and label checks, the
node arguments, and ``KubernetesAction`` (API calls within the step's deadline, polling).

It talks to the API only through ``KubernetesBackend``, never the client directly.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from typing import Any

from pydantic import Field, field_validator, model_validator

from adapters.actions import (
    ActionBase,
    ActionContext,
    ActionError,
    ActionResult,
    ActionTimeout,
    StrictArguments,
)
from adapters.kubernetes.backend import KubernetesBackend, Node
from adapters.kubernetes.config import KubernetesConfig
from kit.durations import format_duration

NODE_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
_SELECTOR = re.compile(r"^[A-Za-z0-9._/=!,()\s-]{1,1024}$")


def listed(items: list[str], limit: int = 10) -> str:
    """``a, b, c`` and, past ``limit`` items, ``and N more``."""
    text = ", ".join(items[:limit])
    return text + (f" and {len(items) - limit} more" if len(items) > limit else "")


def check_label_key(key: str) -> str:
    if len(key) > 316 or not _LABEL_KEY.match(key):
        raise ValueError(f"{key!r} is not a Kubernetes label key (prefix/name, name at most "
                         "63 of [A-Za-z0-9_.-])")
    return key


def check_label_value(value: str) -> str:
    if not _LABEL_VALUE.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes label value (at most 63 of "
                         "[A-Za-z0-9_.-], starting and ending alphanumeric)")
    return value


def check_labels(value: dict[str, str | None]) -> dict[str, str | None]:
    """Label keys and values (None: the label is removed, or must be absent)."""
    for key, item in value.items():
        check_label_key(key)
        if item is not None:
            check_label_value(item)
    return value


def check_node_names(value: list[str]) -> list[str]:
    for name in value:
        if not re.match(NODE_NAME, name):
            raise ValueError(f"{name!r} is not a Kubernetes node name")
    return value


class NodeArguments(StrictArguments):
    node: str = Field(pattern=NODE_NAME, description="Kubernetes node name")


class NodeSetArguments(StrictArguments):
    """The nodes to watch: one ``node``, a list of ``nodes``, or a ``label_selector``."""

    node: str | None = Field(default=None, pattern=NODE_NAME)
    nodes: list[str] = Field(default_factory=list)
    label_selector: str | None = None

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: list[str]) -> list[str]:
        return check_node_names(value)

    @field_validator("label_selector")
    @classmethod
    def _selector(cls, value: str | None) -> str | None:
        if value is not None and not _SELECTOR.match(value):
            raise ValueError(f"{value!r} is not a label selector like 'a=b,c!=d,e in (f,g)'")
        return value

    @model_validator(mode="after")
    def _at_most_one(self) -> NodeSetArguments:
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


class KubernetesAction(ActionBase[KubernetesBackend, KubernetesConfig]):
    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every ``run`` asks the API within the step's deadline: a request the API server
        does not answer ends when the step's time is up, not ``request_timeout`` later
        (through the backend's ``deadline``; a backend without one is used as it is)."""
        super().__init_subclass__(**kwargs)
        run = cls.__dict__.get("run")
        if run is None:
            return

        @functools.wraps(run)
        def within_deadline(self: KubernetesAction, args: Any,
                            ctx: ActionContext) -> ActionResult:
            deadline = getattr(self.backend, "deadline", None)
            if deadline is None:
                return run(self, args, ctx)  # type: ignore[no-any-return]
            with deadline(ctx.deadline):
                return run(self, args, ctx)  # type: ignore[no-any-return]

        setattr(cls, "run", within_deadline)  # noqa: B010 (mypy: a method is not assignable)

    def _nodes(self, args: NodeSetArguments, default_selector: str | None) -> list[Node]:
        """The nodes ``args`` names (ActionError for unknown ones) or its selector matches."""
        if args.node:
            return [self.backend.get_node(args.node)]
        if args.nodes:
            found = {n.name: n for n in self.backend.list_nodes()}
            missing = [name for name in args.nodes if name not in found]
            if missing:
                raise ActionError(f"Kubernetes has no node {listed(missing)} (kubectl get "
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
                raise ActionTimeout(f"{what}: still not done after {format_duration(limit)}: "
                                    f"{pending}")
            ctx.checkpoint(what)
            self._sleep(max(0.01, ctx.pause(min(poll, deadline - time.monotonic()))))
