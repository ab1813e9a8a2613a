"""``ClientBackend``: the ``KubernetesBackend`` over the official ``kubernetes`` client.

An API server that does not answer never holds a step or a check past its time, and a
request that reached the server is never sent twice behind the caller's back.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

from adapters.actions import ActionTimeout
from adapters.kubernetes.backend import (
    Eviction,
    KubernetesConflict,
    KubernetesError,
    KubernetesNotFound,
    KubernetesUnavailable,
    Lease,
    Node,
    Pod,
)
from adapters.kubernetes.config import KubernetesConfig

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


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
    ``deadline(...)`` (a step's deadline, a check's timeout). Answers are read as JSON
    (``_preload_content=False``) into the records of ``adapters.kubernetes.backend``; API
    errors become ``KubernetesError`` with the HTTP status and the Status message verbatim.
    urllib3 retries only connection attempts, so an eviction or a patch is never repeated
    silently.
    """

    def __init__(self, config: KubernetesConfig, api_client: k8s.ApiClient | None = None) -> None:
        self.config = config
        self.api_client = api_client or make_api_client(config)
        self.url = str(self.api_client.configuration.host)
        self.core = k8s.CoreV1Api(self.api_client)
        self.custom = k8s.CustomObjectsApi(self.api_client)
        self.coordination = k8s.CoordinationV1Api(self.api_client)
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

    def _call(self, request: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one API method; the decoded JSON answer, or a KubernetesError."""
        limit = self._timeout(request)
        try:
            response = fn(*args, _preload_content=False, _request_timeout=limit, **kwargs)
            data = response.data
        except k8s.ApiException as exc:
            raise self._api_error(request, exc) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise self._transport_error(request, exc, limit) from exc
        return json.loads(data) if data else {}

    def _api_error(self, request: str, exc: k8s.ApiException) -> KubernetesError:
        status = int(exc.status or 0)
        body: Any = None
        try:
            body = json.loads(exc.body) if exc.body else None
        except ValueError:
            body = None
        if isinstance(body, dict) and body.get("kind") == "Status":
            reason = str(body.get("reason") or exc.reason or "")
            message = str(body.get("message") or "")
        else:
            reason = str(exc.reason or "")
            message = (exc.body or "").strip()[:300] if isinstance(exc.body, str) else ""
        text = f"Kubernetes API {request} answered {status} {reason}".rstrip()
        if message:
            text += f": {message}"
        kind: type[KubernetesError] = KubernetesError
        if status == 404:
            kind = KubernetesNotFound
        elif status == 409:
            kind = KubernetesConflict
        elif status == 0 or status >= 500:
            kind = KubernetesUnavailable
            text = (f"Kubernetes API not answering at {self.url}: {request} answered "
                    f"{status} {reason}" + (f": {message}" if message else "")
                    + " (check the API server and its logs; retry when it answers again)")
        return kind(text, status=status, reason=reason, api_message=message, request=request)

    def _transport_error(self, request: str, exc: urllib3.exceptions.HTTPError,
                         limit: float) -> KubernetesError:
        cause: BaseException = exc
        if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
            cause = exc.reason
        if isinstance(cause, urllib3.exceptions.TimeoutError):
            what = f"no answer within {limit:.3g}s (timeout)"
        else:
            what = f"{type(cause).__name__}: {cause}"
        return KubernetesUnavailable(
            f"Kubernetes API not answering at {self.url}: {request}: {what}; check that the "
            "API server runs and is reachable (a change this request carried may or may not "
            "have been applied: the step is idempotent, retry it)",
            status=0, reason="Timeout" if "timeout" in what else "Unreachable",
            request=request)

    # --- nodes --------------------------------------------------------------------

    def get_node(self, name: str) -> Node:
        try:
            return Node.from_api(self._call(f"GET /api/v1/nodes/{name}", self.core.read_node,
                                            name))
        except KubernetesNotFound as exc:
            raise KubernetesNotFound(
                f'Kubernetes has no node "{name}" (kubectl get nodes lists them): check the '
                f"node name ({exc.api_message or 'NotFound'})", status=404,
                reason="NotFound", api_message=exc.api_message, request=exc.request) from exc

    def list_nodes(self, label_selector: str | None = None) -> list[Node]:
        query = f"?labelSelector={label_selector}" if label_selector else ""
        body = self._call(f"GET /api/v1/nodes{query}", self.core.list_node,
                          label_selector=label_selector)
        return [Node.from_api(item) for item in body.get("items") or []]

    def patch_node(self, name: str, patch: Mapping[str, Any], *,
                   strategic: bool = False) -> Node:
        return Node.from_api(self._call(
            f"PATCH /api/v1/nodes/{name}", self.core.patch_node, name, dict(patch),
            _content_type=STRATEGIC if strategic else MERGE))

    # --- pods ---------------------------------------------------------------------

    def pods_on_node(self, node: str) -> list[Pod]:
        return self.list_pods(field_selector=f"spec.nodeName={node}")

    def list_pods(self, namespace: str | None = None, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[Pod]:
        query = "&".join(f"{k}={v}" for k, v in (("labelSelector", label_selector),
                                                  ("fieldSelector", field_selector)) if v)
        if namespace is None:
            body = self._call(f"GET /api/v1/pods?{query}".rstrip("?"),
                              self.core.list_pod_for_all_namespaces,
                              label_selector=label_selector, field_selector=field_selector)
        else:
            body = self._call(f"GET /api/v1/namespaces/{namespace}/pods?{query}".rstrip("?"),
                              self.core.list_namespaced_pod, namespace,
                              label_selector=label_selector, field_selector=field_selector)
        return [Pod.from_api(item) for item in body.get("items") or []]

    def evict(self, namespace: str, name: str, grace_seconds: int | None = None) -> Eviction:
        options = (k8s.V1DeleteOptions(grace_period_seconds=grace_seconds)
                   if grace_seconds is not None else None)
        body = k8s.V1Eviction(api_version="policy/v1", kind="Eviction",
                              metadata=k8s.V1ObjectMeta(name=name, namespace=namespace),
                              delete_options=options)
        request = f"POST /api/v1/namespaces/{namespace}/pods/{name}/eviction"
        limit = self._timeout(request)
        try:
            self.core.create_namespaced_pod_eviction(
                name, namespace, body, _preload_content=False, _request_timeout=limit)
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
        if namespace is None:
            result = self._call(f"GET /apis/{group}/{version}/{plural}/{name}",
                                self.custom.get_cluster_custom_object,
                                group, version, plural, name)
        else:
            result = self._call(
                f"GET /apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}",
                self.custom.get_namespaced_custom_object, group, version, namespace, plural,
                name)
        return dict(result)

    def patch_custom_object(self, group: str, version: str, plural: str, name: str,
                            patch: Mapping[str, Any],
                            namespace: str | None = None) -> dict[str, Any]:
        if namespace is None:
            result = self._call(f"PATCH /apis/{group}/{version}/{plural}/{name}",
                                self.custom.patch_cluster_custom_object,
                                group, version, plural, name, dict(patch), _content_type=MERGE)
        else:
            result = self._call(
                f"PATCH /apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}",
                self.custom.patch_namespaced_custom_object, group, version, namespace, plural,
                name, dict(patch), _content_type=MERGE)
        return dict(result)

    def driver_versions(self, label_selector: str | None = None) -> dict[str, str | None]:
        label = self.config.gpu_operator.driver_version_label
        selector = label_selector or self.config.gpu_operator.gpu_node_selector
        return {node.name: node.labels.get(label) if label else None
                for node in self.list_nodes(selector)}

    # --- leases -------------------------------------------------------------------

    def get_lease(self, namespace: str, name: str) -> Lease | None:
        try:
            return Lease.from_api(self._call(
                f"GET /apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}",
                self.coordination.read_namespaced_lease, name, namespace))
        except KubernetesNotFound:
            return None

    def create_lease(self, lease: Lease) -> Lease:
        return Lease.from_api(self._call(
            f"POST /apis/coordination.k8s.io/v1/namespaces/{lease.namespace}/leases",
            self.coordination.create_namespaced_lease, lease.namespace, lease.to_api()))

    def replace_lease(self, lease: Lease) -> Lease:
        return Lease.from_api(self._call(
            f"PUT /apis/coordination.k8s.io/v1/namespaces/{lease.namespace}/leases/{lease.name}",
            self.coordination.replace_namespaced_lease, lease.name, lease.namespace,
            lease.to_api()))

    def delete_lease(self, namespace: str, name: str) -> None:
        with contextlib.suppress(KubernetesNotFound):
            self._call(f"DELETE /apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/"
                       f"{name}", self.coordination.delete_namespaced_lease, name, namespace)

    def close(self) -> None:
        self.api_client.close()  # type: ignore[no-untyped-call]


def make_backend(config: KubernetesConfig) -> ClientBackend:
    return ClientBackend(config)
