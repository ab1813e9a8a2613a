"""The lab's Kubernetes API server with the official `kubernetes` Python client: list and
patch nodes, evictions answered 201 then 429 by the PDB, and a stale Lease update 409."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.lab.fixture import Lab
from tests.lab.kubehelp import TEST_USER_AGENT, settled, wait_until

k8s = pytest.importorskip("kubernetes", reason="the kubernetes client is not installed")
from kubernetes import client, config  # noqa: E402

pytestmark = pytest.mark.lab


@pytest.fixture
def api_client(lab: Lab) -> Iterator[Any]:
    wait_until(lambda: settled(lab), "the Kubernetes pool to settle", timeout=40)
    # kubernetes.config has no annotations (adapters/kubernetes/client.py ignores it the same way)
    api = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=lab["kubeapi"]["kubeconfig"])
    api.user_agent = TEST_USER_AGENT  # these requests test the lab's API, not the bot
    yield api
    api.close()


def name_of(obj: client.V1Node | client.V1Pod) -> str:
    assert obj.metadata is not None and obj.metadata.name is not None
    return obj.metadata.name


def labels_of(node: client.V1Node) -> dict[str, str]:
    assert node.metadata is not None
    return node.metadata.labels or {}


def test_list_and_patch_nodes(lab: Lab, api_client: Any) -> None:
    core = client.CoreV1Api(api_client)
    names = [name_of(n) for n in core.list_node(label_selector="nvidia.com/gpu.present").items]
    assert names == sorted(lab["kubeapi"]["nodes"] + lab["kubeapi"]["handoff_nodes"])
    try:
        node = core.patch_node("gpu05", {"metadata": {"labels": {"client": "python"}}})
        assert labels_of(node)["client"] == "python"
        status = core.read_node("gpu05").status
        assert status is not None and status.allocatable is not None
        assert status.allocatable["nvidia.com/gpu"] == "8"
    finally:
        core.patch_node("gpu05", {"metadata": {"labels": {"client": None}}})
    assert "client" not in labels_of(core.read_node("gpu05"))


def test_eviction_201_then_429_from_the_pdb(lab: Lab, api_client: Any) -> None:
    core = client.CoreV1Api(api_client)
    pods = core.list_namespaced_pod("serving", label_selector="app=inference").items

    def evict(name: str) -> Any:
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace="serving"))
        return core.create_namespaced_pod_eviction(name, "serving", body)

    evict(name_of(pods[0]))  # 201: the PDB allows one disruption
    with pytest.raises(client.ApiException) as blocked:
        evict(name_of(pods[1]))
    assert blocked.value.status == 429
    assert "violate the pod's disruption budget" in (blocked.value.body or "")
    # The first pod goes after its grace period; its replacement turns Ready elsewhere.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            core.read_namespaced_pod(name_of(pods[0]), "serving")
        except client.ApiException as exc:
            assert exc.status == 404
            break
        time.sleep(0.1)
    else:
        pytest.fail("the evicted pod was never deleted")
    wait_until(lambda: settled(lab), "the replacement pod to be Ready", timeout=20)


def test_stale_lease_replace_is_409(lab: Lab, api_client: Any) -> None:
    leases = client.CoordinationV1Api(api_client)
    lease = client.V1Lease(metadata=client.V1ObjectMeta(name="client-test"),
                           spec=client.V1LeaseSpec(holder_identity="replica-a",
                                                   lease_duration_seconds=15))
    created = leases.create_namespaced_lease("default", lease)
    try:
        current = leases.read_namespaced_lease("client-test", "default")
        assert current.spec is not None and created.spec is not None
        current.spec.holder_identity = "replica-b"
        leases.replace_namespaced_lease("client-test", "default", current)
        created.spec.holder_identity = "replica-c"  # still carries the old resourceVersion
        with pytest.raises(client.ApiException) as stale:
            leases.replace_namespaced_lease("client-test", "default", created)
        assert stale.value.status == 409
        assert '"reason": "Conflict"' in (stale.value.body or "")
    finally:
        leases.delete_namespaced_lease("client-test", "default")
