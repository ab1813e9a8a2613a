"""The adapters' in-memory Slurm, Kubernetes, Alertmanager and Prometheus fakes
(adapters/*/fake.py), bundled for window tests: the real ``slurm.*``, ``k8s.*`` and
``alertmanager.*`` actions (the GPU gates too) run over them, so open-window and
close-window are exercised as against the lab (which tests/runbooks does)."""

from __future__ import annotations

from dataclasses import replace

from adapters.actions import Action
from adapters.alertmanager.actions import AlertmanagerActions
from adapters.alertmanager.config import AlertmanagerConfig
from adapters.alertmanager.fake import FakeAlertmanager
from adapters.kubernetes.actions import KubernetesActions
from adapters.kubernetes.backend import Node
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.fake import FakeKubernetes
from adapters.kubernetes.gpu_gate import GpuGateNodesAction
from adapters.prometheus.fake import FakePrometheus
from adapters.slurm.actions import SlurmActions
from adapters.slurm.config import SlurmConfig
from adapters.slurm.fake import FakeSlurm
from adapters.slurm.release import ReservationReleaseAction
from bot.execution.checks.capacity import CapacityEvaluator
from bot.execution.checks.core import Checks
from bot.service import Service

# Kubernetes nodes outside the inventory with free GPUs: the pool keeps its floor while the
# windows and runbooks under test take the inventory's one Kubernetes node out.
SPARE = ("spare01", "spare02")


class Systems:
    """The three fakes and the actions over them."""

    def __init__(self, slurm_nodes: list[str], k8s_nodes: list[str]) -> None:
        self.slurm = FakeSlurm(slurm_nodes)
        self.kubernetes = FakeKubernetes(k8s_nodes)
        self.alertmanager = FakeAlertmanager()
        self.prometheus = FakePrometheus([], gpus=8)  # every GPU reports, none errs

    def actions(self) -> list[Action]:
        return [
            *SlurmActions(self.slurm, sleep=lambda s: None).all(),
            *KubernetesActions(self.kubernetes, sleep=lambda s: None).all(),
            ReservationReleaseAction(self.slurm, SlurmConfig(), lambda s: None,
                                     prometheus=self.prometheus, gpu_settle=0.0),
            GpuGateNodesAction(self.kubernetes, KubernetesConfig(), lambda s: None,
                               prometheus=self.prometheus, gpu_settle=0.0),
            *AlertmanagerActions(AlertmanagerConfig(url="http://alertmanager.invalid:9093"),
                                 self.alertmanager).all(),
        ]

    def guarding(self, bot: Service) -> Service:
        """``bot`` with the capacity guard over these fakes (8 GPUs a Kubernetes node, and
        the SPARE nodes), beside the checks it had."""
        for name in SPARE:
            self.kubernetes.nodes[name] = Node(name=name, boot_id=f"boot-{name}-1")
        for name, node in list(self.kubernetes.nodes.items()):
            self.kubernetes.nodes[name] = replace(node, gpus_allocatable=8)
        guard = CapacityEvaluator(lambda: bot.inventory, self.slurm, self.kubernetes)
        bot.checks = Checks({**bot.checks._evaluators, "capacity": guard},
                            sleep=lambda s: None)
        return bot

    def cordoned(self) -> dict[str, str | None]:
        return {name: node.annotations.get("gpu-runbook-bot/cordoned-by")
                for name, node in self.kubernetes.nodes.items() if node.unschedulable}
