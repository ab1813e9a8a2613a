"""In-memory Slurm, Kubernetes and Alertmanager backends for window tests: the real
``slurm.*``, ``k8s.*`` and ``alertmanager.*`` actions run over them, so open-window and
close-window are exercised exactly as against the lab (which tests/runbooks does)."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from adapters.actions import Action
from adapters.alertmanager import (
    AlertmanagerActions,
    AlertmanagerConfig,
    MatchersLike,
    Silence,
    matchers_from,
)
from adapters.kubernetes.actions import KubernetesActions
from adapters.kubernetes.backend import KubernetesNotFound, Node
from adapters.slurm.actions import SlurmActions
from tests.adapters.test_slurm_parsing import FakeBackend as FakeSlurm


class FakeKubernetes:
    def __init__(self, nodes: list[str]) -> None:
        self.nodes = {name: Node(name=name) for name in nodes}

    def get_node(self, name: str) -> Node:
        if name not in self.nodes:
            raise KubernetesNotFound(f"nodes {name} not found", status=404)
        return self.nodes[name]

    def list_nodes(self, label_selector: str | None = None) -> list[Node]:
        return list(self.nodes.values())

    def patch_node(self, name: str, patch: Mapping[str, Any], *,
                   strategic: bool = False) -> Node:
        node = self.get_node(name)
        spec = patch.get("spec") or {}
        annotations = dict(node.annotations)
        for key, value in ((patch.get("metadata") or {}).get("annotations") or {}).items():
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        node = replace(node, annotations=annotations,
                       unschedulable=bool(spec.get("unschedulable", node.unschedulable)))
        self.nodes[name] = node
        return node


class FakeAlertmanager:
    def __init__(self) -> None:
        self.silences: dict[str, Silence] = {}
        self._ids = itertools.count(1)

    def alerts(self, filters: Mapping[str, str] | None = None, **_: Any) -> list[Any]:
        return []

    def create_silence(self, matchers: MatchersLike, starts: datetime | None, ends: datetime,
                       created_by: str, comment: str, *, regex: Collection[str] = (),
                       silence_id: str | None = None) -> str:
        silence_id = silence_id or f"s{next(self._ids)}"
        self.silences[silence_id] = Silence(
            silence_id, matchers_from(matchers, regex), starts or datetime.now(UTC), ends,
            created_by, comment, "active")
        return silence_id

    def find_silences(self, matchers: MatchersLike | None = None, *,
                      regex: Collection[str] = (), exact: bool = False,
                      created_by: str | None = None) -> list[Silence]:
        wanted = set(matchers_from(matchers or {}, regex))
        return [s for s in self.silences.values() if s.state == "active"
                and (created_by is None or s.created_by == created_by)
                and ((set(s.matchers) == wanted) if exact else wanted <= set(s.matchers))]

    def get_silence(self, silence_id: str) -> Silence | None:
        return self.silences.get(silence_id)

    def expire_silence(self, silence_id: str) -> bool:
        silence = self.silences.get(silence_id)
        if silence is None or silence.state == "expired":
            return False
        self.silences[silence_id] = replace(silence, state="expired")
        return True

    def active(self) -> list[str]:
        return [" ".join(str(m) for m in s.matchers) for s in self.silences.values()
                if s.state == "active"]


class Systems:
    """The three fakes and the actions over them."""

    def __init__(self, slurm_nodes: list[str], k8s_nodes: list[str]) -> None:
        self.slurm = FakeSlurm(slurm_nodes)
        self.kubernetes = FakeKubernetes(k8s_nodes)
        self.alertmanager = FakeAlertmanager()

    def actions(self) -> list[Action]:
        return [
            *SlurmActions(self.slurm, sleep=lambda s: None).all(),
            *KubernetesActions(self.kubernetes, sleep=lambda s: None).all(),  # type: ignore[arg-type]
            *AlertmanagerActions(AlertmanagerConfig(url="http://alertmanager.invalid:9093"),
                                 self.alertmanager).all(),
        ]

    def cordoned(self) -> dict[str, str | None]:
        return {name: node.annotations.get("gpu-runbook-bot/cordoned-by")
                for name, node in self.kubernetes.nodes.items() if node.unschedulable}
