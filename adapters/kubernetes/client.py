"""``ClientBackend``: the ``KubernetesBackend`` over the official ``kubernetes`` client.

An API server that does not answer never holds a step or a check past its time, and a
request that reached the server is never sent twice behind the caller's back. Requests go
through the client's ``ApiClient`` (configuration, authentication, connection pool), not its
generated API classes, whose import alone costs every command a second of CPU.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

from adapters.actions import ActionTimeout
from adapters.kubernetes.backend import (
    Eviction,
    Job,
    KubernetesError,
    KubernetesNotFound,
    Lease,
    Node,
    Pod,
)
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.quickread import (
    api_error,
    node_not_found,
    pod_listing,
    transport_error,
)

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
# The paths of the API methods used, as the generated client writes them.
NODE = "/api/v1/nodes/{name}"
CLUSTER_OBJECT = "/apis/{group}/{version}/{plural}/{name}"
CLUSTER_OBJECTS = "/apis/{group}/{version}/{plural}"
NAMESPACED_OBJECT = "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
LEASE = LEASES + "/{name}"
JOBS = "/apis/batch/v1/namespaces/{namespace}/jobs"
JOB = JOBS + "/{name}"
POD_LOG = "/api/v1/namespaces/{namespace}/pods/{name}/log"


def make_api_client(config: KubernetesConfig) -> k8s.ApiClient:
    """An ApiClient for the configured cluster; ActionError when it cannot be configured."""
    configuration = k8s.Configuration()
    try:
        if config.kubeconfig is None:
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration)
        else:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=config.kubeconfig, context=config.context,
                client_configuration=configuration, persist_config=False)
    except (ConfigException, OSError) as exc:
        where = ("the in-cluster service account (kubernetes.kubeconfig is not set)"
                 if config.kubeconfig is None else f"kubeconfig {config.kubeconfig}")
        raise KubernetesError(f"cannot configure the Kubernetes client from {where}: {exc}") \
            from exc
    configuration.retries = urllib3.Retry(total=2, connect=2, read=0, status=0, other=0,
                                          redirect=0)
    configuration.connection_pool_maxsize = config.connection_pool_size
    return k8s.ApiClient(configuration)


class ClientBackend:
    """``KubernetesBackend`` over ``kubernetes.client``; ``api_client`` may be given (tests).

    The ApiClient comes from the kubeconfig (or the in-cluster service account). Every
    request carries ``_request_timeout``: ``request_timeout``, or less within
    ``deadline(...)`` (a step's deadline, a check's timeout). Each request is the one the
    generated API method sends (``_send``); answers are read as JSON into the records of
    ``adapters.kubernetes.backend``; API errors become ``KubernetesError`` with the HTTP
    status and the Status message verbatim.
    urllib3 retries only connection attempts, so an eviction or a patch is never repeated
    silently.
    """

    def __init__(self, config: KubernetesConfig, api_client: k8s.ApiClient | None = None) -> None:
        self.config = config
        self.api_client = api_client or make_api_client(config)
        self.url = str(self.api_client.configuration.host)
        self._local = threading.local()

    # --- plumbing -----------------------------------------------------------------

    @contextlib.contextmanager
    def deadline(self, until: float | None) -> Iterator[None]:
        """Within: this thread's requests end by ``until`` (a ``time.monotonic()`` value) or
        after ``request_timeout``, whichever comes first (None: no deadline of its own)."""
        before: float | None = getattr(self._local, "deadline", None)
        if until is not None and before is not None:
            until = min(until, before)
        self._local.deadline = until if until is not None else before
        try:
            yield
        finally:
            self._local.deadline = before

    def _timeout(self, request: str) -> float:
        """The time one request may take; ActionTimeout when the deadline has passed."""
        limit = self.config.request_timeout
        until: float | None = getattr(self._local, "deadline", None)
        if until is not None:
            left = until - time.monotonic()
            if left < 0.05:
                raise ActionTimeout(f"no time left to ask the Kubernetes API ({request}): "
                                    "the step's or check's timeout has passed")
            limit = min(limit, left)
        return limit

    def _send(self, method: str, path: str, limit: float, names: Mapping[str, str],
              query: Mapping[str, str | None] | None = None, body: Any = None,
              content_type: str | None = None, accept: str = "application/json") -> bytes:
        """One request as the generated API method sends it: ``path``'s ``{placeholders}``
        filled from ``names`` and quoted alike, JSON asked for, a Content-Type only where the
        method sets one (patches). The body of a 2xx answer, else ApiException."""
        headers = {"Accept": accept}
        if content_type:
            headers["Content-Type"] = content_type
        request = self.api_client.param_serialize(
            method=method, resource_path=path, path_params=dict(names) or None,
            query_params=[(key, value) for key, value in (query or {}).items()
                          if value is not None],
            header_params=headers, body=body, auth_settings=["BearerToken"])
        response = self.api_client.call_api(*request, _request_timeout=limit)
        response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status <= 299:
            raise k8s.ApiException.from_response(http_resp=response, body=None, data=None)
        return bytes(response.data or b"")

    def _call(self, request: str, method: str, path: str, names: Mapping[str, str],
              **options: Any) -> Any:
        """One request (``_send``); the decoded JSON answer, or a KubernetesError."""
        limit = self._timeout(request)
        try:
            data = self._send(method, path, limit, names, **options)
        except k8s.ApiException as exc:
            raise self._api_error(request, exc) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise self._transport_error(request, exc, limit) from exc
        return json.loads(data) if data else {}

    def _api_error(self, request: str, exc: k8s.ApiException) -> KubernetesError:
        return api_error(self.url, request, exc.status, exc.reason, exc.body)

    def _transport_error(self, request: str, exc: urllib3.exceptions.HTTPError,
                         limit: float) -> KubernetesError:
        return transport_error(self.url, request, exc, limit)

    # --- nodes --------------------------------------------------------------------

    def get_node(self, name: str) -> Node:
        try:
            return Node.from_api(self._call(f"GET /api/v1/nodes/{name}", "GET", NODE,
                                            {"name": name}))
        except KubernetesNotFound as exc:
            raise node_not_found(name, exc) from exc

    def list_nodes(self, label_selector: str | None = None) -> list[Node]:
        query = f"?labelSelector={label_selector}" if label_selector else ""
        body = self._call(f"GET /api/v1/nodes{query}", "GET", "/api/v1/nodes", {},
                          query={"labelSelector": label_selector})
        return [Node.from_api(item) for item in body.get("items") or []]

    def patch_node(self, name: str, patch: Mapping[str, Any], *,
                   strategic: bool = False) -> Node:
        return Node.from_api(self._call(
            f"PATCH /api/v1/nodes/{name}", "PATCH", NODE, {"name": name}, body=dict(patch),
            content_type=STRATEGIC if strategic else MERGE))

    # --- pods ---------------------------------------------------------------------

    def pods_on_node(self, node: str) -> list[Pod]:
        return self.list_pods(field_selector=f"spec.nodeName={node}")

    def list_pods(self, namespace: str | None = None, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[Pod]:
        label, selectors = pod_listing(namespace, label_selector, field_selector)
        if namespace is None:
            body = self._call(label, "GET", "/api/v1/pods", {}, query=selectors)
        else:
            body = self._call(label, "GET", "/api/v1/namespaces/{namespace}/pods",
                              {"namespace": namespace}, query=selectors)
        return [Pod.from_api(item) for item in body.get("items") or []]

    def evict(self, namespace: str, name: str, grace_seconds: int | None = None) -> Eviction:
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": name, "namespace": namespace}}
        if grace_seconds is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_seconds}
        request = f"POST /api/v1/namespaces/{namespace}/pods/{name}/eviction"
        limit = self._timeout(request)
        try:
            self._send("POST", "/api/v1/namespaces/{namespace}/pods/{name}/eviction", limit,
                       {"namespace": namespace, "name": name}, body=body)
        except k8s.ApiException as exc:
            if exc.status == 429:
                try:
                    status = json.loads(exc.body or "{}")
                except ValueError:
                    status = {"message": exc.body or ""}
                return Eviction.blocked_by(status if isinstance(status, dict) else {})
            if exc.status == 404:
                return Eviction("gone")
            raise self._api_error(request, exc) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise self._transport_error(request, exc, limit) from exc
        return Eviction("evicted")

    # --- custom objects -----------------------------------------------------------

    def get_custom_object(self, group: str, version: str, plural: str, name: str,
                          namespace: str | None = None) -> dict[str, Any]:
        names = {"group": group, "version": version, "plural": plural, "name": name}
        if namespace is None:
            result = self._call(f"GET /apis/{group}/{version}/{plural}/{name}", "GET",
                                CLUSTER_OBJECT, names)
        else:
            result = self._call(
                f"GET /apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}", "GET",
                NAMESPACED_OBJECT, {**names, "namespace": namespace})
        return dict(result)

    def patch_custom_object(self, group: str, version: str, plural: str, name: str,
                            patch: Mapping[str, Any],
                            namespace: str | None = None) -> dict[str, Any]:
        names = {"group": group, "version": version, "plural": plural, "name": name}
        if namespace is None:
            result = self._call(f"PATCH /apis/{group}/{version}/{plural}/{name}", "PATCH",
                                CLUSTER_OBJECT, names, body=dict(patch), content_type=MERGE)
        else:
            result = self._call(
                f"PATCH /apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}",
                "PATCH", NAMESPACED_OBJECT, {**names, "namespace": namespace},
                body=dict(patch), content_type=MERGE)
        return dict(result)

    def list_custom_objects(self, group: str, version: str,
                            plural: str) -> list[dict[str, Any]]:
        result = self._call(f"GET /apis/{group}/{version}/{plural}", "GET", CLUSTER_OBJECTS,
                            {"group": group, "version": version, "plural": plural})
        return [dict(item) for item in result.get("items") or []]

    def driver_versions(self, label_selector: str | None = None) -> dict[str, str | None]:
        label = self.config.gpu_operator.driver_version_label
        selector = label_selector or self.config.gpu_operator.gpu_node_selector
        return {node.name: node.labels.get(label) if label else None
                for node in self.list_nodes(selector)}

    # --- jobs ---------------------------------------------------------------------

    def create_job(self, namespace: str, body: Mapping[str, Any]) -> Job:
        return Job.from_api(self._call(f"POST /apis/batch/v1/namespaces/{namespace}/jobs",
                                       "POST", JOBS, {"namespace": namespace},
                                       body=dict(body)))

    def get_job(self, namespace: str, name: str) -> Job | None:
        try:
            return Job.from_api(self._call(
                f"GET /apis/batch/v1/namespaces/{namespace}/jobs/{name}", "GET", JOB,
                {"namespace": namespace, "name": name}))
        except KubernetesNotFound:
            return None

    def delete_job(self, namespace: str, name: str) -> None:
        with contextlib.suppress(KubernetesNotFound):
            self._call(f"DELETE /apis/batch/v1/namespaces/{namespace}/jobs/{name}", "DELETE",
                       JOB, {"namespace": namespace, "name": name},
                       body={"propagationPolicy": "Background"})

    def pod_log(self, namespace: str, name: str, tail_lines: int = 200) -> str:
        request = f"GET /api/v1/namespaces/{namespace}/pods/{name}/log"
        limit = self._timeout(request)
        try:
            data = self._send("GET", POD_LOG, limit, {"namespace": namespace, "name": name},
                              query={"tailLines": str(tail_lines)},
                              accept="text/plain")  # as read_namespaced_pod_log asks
        except k8s.ApiException as exc:
            raise self._api_error(request, exc) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise self._transport_error(request, exc, limit) from exc
        return data.decode(errors="replace")

    # --- leases -------------------------------------------------------------------

    def get_lease(self, namespace: str, name: str) -> Lease | None:
        try:
            return Lease.from_api(self._call(
                f"GET /apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}",
                "GET", LEASE, {"namespace": namespace, "name": name}))
        except KubernetesNotFound:
            return None

    def create_lease(self, lease: Lease) -> Lease:
        return Lease.from_api(self._call(
            f"POST /apis/coordination.k8s.io/v1/namespaces/{lease.namespace}/leases", "POST",
            LEASES, {"namespace": lease.namespace}, body=lease.to_api()))

    def replace_lease(self, lease: Lease) -> Lease:
        return Lease.from_api(self._call(
            f"PUT /apis/coordination.k8s.io/v1/namespaces/{lease.namespace}/leases/{lease.name}",
            "PUT", LEASE, {"namespace": lease.namespace, "name": lease.name},
            body=lease.to_api()))

    def delete_lease(self, namespace: str, name: str) -> None:
        with contextlib.suppress(KubernetesNotFound):
            self._call(f"DELETE /apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/"
                       f"{name}", "DELETE", LEASE, {"namespace": namespace, "name": name})

    def close(self) -> None:
        self.api_client.close()  # type: ignore[no-untyped-call]


def make_backend(config: KubernetesConfig) -> ClientBackend:
    return ClientBackend(config)
