"""The ``kubernetes:`` section of the bot configuration."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class GpuOperatorConfig(BaseModel):
    """Where the NVIDIA GPU Operator keeps its driver settings and what its nodes report.

    ``driver_mode``: ``clusterpolicy`` sets ``spec.driver.version`` of the ClusterPolicy
    ``clusterpolicy``; ``nvidiadriver`` sets ``spec.version`` of an NVIDIADriver
    (``nvidia.com/v1alpha1``), one per node pool: ``nvidiadrivers`` maps a pool name to
    its NVIDIADriver's name (a pool not listed is taken as the NVIDIADriver's own name).

    ``driver_version_label``: the node label that reports the installed driver version.
    GPU Feature Discovery publishes ``nvidia.com/cuda.driver-version.full``; the lab's
    operator writes ``lab.gpu-runbook-bot/driver-version``. ``None``: nodes report no
    version and waits rely on the upgrade state alone.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    clusterpolicy: str = "cluster-policy"
    namespace: str = "gpu-operator"
    driver_mode: Literal["clusterpolicy", "nvidiadriver"] = "clusterpolicy"
    nvidiadrivers: dict[str, str] = Field(default_factory=dict)
    driver_version_label: str | None = "nvidia.com/cuda.driver-version.full"
    upgrade_state_label: str = "nvidia.com/gpu-driver-upgrade-state"
    gpu_node_selector: str = "nvidia.com/gpu.present=true"  # the GPU nodes of the cluster
    validator_selector: str = "app=nvidia-operator-validator"  # validator DaemonSet's pods


class GpuDiagConfig(BaseModel):
    """``dcgmi diag`` on a node only in Kubernetes (``k8s.gpu_diag``): a Job pinned to the
    node (``nodeName``, so a cordon does not keep it off), asking for every GPU of it, in
    ``namespace`` (the bot's own by default: its Role grants Jobs there), running ``image``
    with ``command`` and the level appended (1 quick to 4 long; ``level`` the default). DCGM's
    diagnostics need ``security_context``'s SYS_ADMIN: the namespace's Pod Security level
    must allow it. ``tolerations`` let it onto a tainted GPU node; ``ttl_seconds`` is how
    long Kubernetes keeps a Job the bot could not delete. ``k8s.gpu_identity`` runs
    ``identity_command`` the same way (the image must have nvidia-smi)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str = Field(default="gpu-runbook-bot",
                           pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    image: str = Field(default="nvcr.io/nvidia/cloud-native/dcgm:3.3.5-1-ubuntu22.04",
                       min_length=1)
    command: list[str] = Field(default_factory=lambda: ["dcgmi", "diag", "-r"], min_length=1)
    level: int = Field(default=2, ge=1, le=4)
    timeout: float = Field(default=1800.0, gt=0)  # seconds the Job may take
    tolerations: list[dict[str, str]] = Field(
        default_factory=lambda: [{"operator": "Exists"}])
    security_context: dict[str, Any] = Field(
        default_factory=lambda: {"capabilities": {"add": ["SYS_ADMIN"]}})
    service_account: str | None = None
    ttl_seconds: int = Field(default=3600, ge=0)
    # k8s.gpu_identity (swap-gpu's evidence): one "index, serial, uuid" line per GPU
    identity_command: list[str] = Field(default_factory=lambda: [
        "nvidia-smi", "--query-gpu=index,serial,uuid", "--format=csv,noheader"], min_length=1)


class KubernetesConfig(BaseModel):
    """How the bot reaches the Kubernetes API.

    ``kubeconfig``: a kubeconfig file (``context`` picks one of its contexts, default its
    current context); ``None`` uses the in-cluster service account (the bot running as a pod).
    ``request_timeout`` bounds every API request; ``eviction_retry`` is the pause between
    evictions a PodDisruptionBudget refused (429), as ``kubectl drain`` does (5 s).
    ``reboot_request_label``: the node label ``k8s.request_reboot`` sets to ask the site's
    reboot agent (a kured-style agent or a site DaemonSet) to reboot the node; the bot never
    reboots a node itself.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kubeconfig: str | None = None
    context: str | None = None
    request_timeout: float = Field(default=10.0, gt=0)
    eviction_retry: float = Field(default=5.0, gt=0)
    connection_pool_size: int = Field(default=32, ge=1)  # concurrent requests per client
    reboot_request_label: str = Field(default="gpu-runbook-bot/reboot-requested",
                                      pattern=r"^([a-z0-9.-]{1,253}/)?[A-Za-z0-9][-A-Za-z0-9_.]"
                                              r"{0,61}[A-Za-z0-9]$")
    gpu_operator: GpuOperatorConfig = Field(default_factory=GpuOperatorConfig)
    gpu_diag: GpuDiagConfig = Field(default_factory=GpuDiagConfig)
