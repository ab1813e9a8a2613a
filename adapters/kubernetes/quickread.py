"""``QuickReader``: the node view's Kubernetes reads (nodes, pods) over urllib3, without
importing the official client, whose import is most of ``runbook node``'s start.

It sends the requests ``client.ClientBackend`` sends, with the same connection settings
(``access.resolve``), and answers with the same records and errors (the error texts are
built here for both). ``reading.make_reader`` gives the official client when ``resolve``
cannot.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import urllib3

from adapters.kubernetes.access import Access
from adapters.kubernetes.backend import (
    KubernetesConflict,
    KubernetesError,
    KubernetesNotFound,
    KubernetesUnavailable,
    Node,
    Pod,
)
from adapters.kubernetes.config import KubernetesConfig
from kit.packages import package_version

# What kubernetes.client's ApiClient sends as its User-Agent (a test compares the two).
USER_AGENT = f"OpenAPI-Generator/{package_version('kubernetes')}/python"


class Failure(Exception):
    """A non-2xx answer (or a TLS failure: status 0), as ``ApiException`` carries it."""

    def __init__(self, status: int, reason: str, body: str | None) -> None:
        super().__init__(f"{status} {reason}")
        self.status, self.reason, self.body = status, reason, body


class QuickReader:
    """The reads of ``KubernetesBackend`` the node view and the inventory use."""

    def __init__(self, config: KubernetesConfig, access: Access) -> None:
        self.config = config
        self.access = access
        self.url = access.host
        pool_args: dict[str, Any] = {  # what kubernetes.client.rest.RESTClientObject builds
            "cert_reqs": ssl.CERT_REQUIRED if access.verify else ssl.CERT_NONE,
            "ca_certs": access.ca_file, "cert_file": access.cert_file,
            "key_file": access.key_file, "ca_cert_data": None,
            "retries": urllib3.Retry(total=2, connect=2, read=0, status=0, other=0,
                                     redirect=0),
            "maxsize": config.connection_pool_size}
        if access.server_name:
            pool_args["server_hostname"] = access.server_name
        self.pool = urllib3.PoolManager(**pool_args)

    def _get(self, request: str, path: str, query: Mapping[str, str | None]) -> Any:
        """GET ``path`` as the generated client would; the decoded JSON, or KubernetesError."""
        url = self.access.host + path
        pairs = [f"{key}={quote(str(value))}" for key, value in query.items() if value]
        if pairs:
            url += "?" + "&".join(pairs)
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        authorization = self.access.header()
        if authorization:
            headers["authorization"] = authorization
        limit = self.config.request_timeout
        try:
            response = self._send(url, headers, limit)
        except Failure as exc:
            raise api_error(self.url, request, exc.status, exc.reason, exc.body) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise transport_error(self.url, request, exc, limit) from exc
        return json.loads(response) if response else {}

    def _send(self, url: str, headers: dict[str, str], limit: float) -> bytes:
        try:
            response = self.pool.request("GET", url, fields={}, headers=headers,
                                         timeout=urllib3.Timeout(total=limit),
                                         preload_content=False)
        except urllib3.exceptions.SSLError as exc:  # as kubernetes.client.rest does
            raise Failure(0, f"{type(exc).__name__}\n{exc}", None) from exc
        data = response.data
        if not 200 <= response.status <= 299:
            try:
                body: str | None = data.decode("utf-8")
            except UnicodeDecodeError:
                body = None
            raise Failure(response.status, response.reason or "", body)
        return bytes(data or b"")

    def get_node(self, name: str) -> Node:
        try:
            return Node.from_api(self._get(f"GET /api/v1/nodes/{name}",
                                           f"/api/v1/nodes/{quote(name, safe='')}", {}))
        except KubernetesNotFound as exc:
            raise node_not_found(name, exc) from exc

    def list_nodes(self, label_selector: str | None = None) -> list[Node]:
        query = f"?labelSelector={label_selector}" if label_selector else ""
        body = self._get(f"GET /api/v1/nodes{query}", "/api/v1/nodes",
                         {"labelSelector": label_selector})
        return [Node.from_api(item) for item in body.get("items") or []]

    def pods_on_node(self, node: str) -> list[Pod]:
        return self.list_pods(field_selector=f"spec.nodeName={node}")

    def list_pods(self, namespace: str | None = None, label_selector: str | None = None,
                  field_selector: str | None = None) -> list[Pod]:
        label, selectors = pod_listing(namespace, label_selector, field_selector)
        path = ("/api/v1/pods" if namespace is None
                else f"/api/v1/namespaces/{quote(namespace, safe='')}/pods")
        body = self._get(label, path, selectors)
        return [Pod.from_api(item) for item in body.get("items") or []]

    def close(self) -> None:
        self.pool.clear()


def node_not_found(name: str, exc: KubernetesNotFound) -> KubernetesNotFound:
    return KubernetesNotFound(
        f'Kubernetes has no node "{name}" (kubectl get nodes lists them): check the '
        f"node name ({exc.api_message or 'NotFound'})", status=404,
        reason="NotFound", api_message=exc.api_message, request=exc.request)


def api_error(url: str, request: str, status: int | None, reason: str | None,
              body_text: Any) -> KubernetesError:
    """An answer that is not 2xx, with the HTTP status and the Status message verbatim."""
    status = int(status or 0)
    body: Any = None
    try:
        body = json.loads(body_text) if body_text else None
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        reason = str(body.get("reason") or reason or "")
        message = str(body.get("message") or "")
    else:
        reason = str(reason or "")
        message = body_text.strip()[:300] if isinstance(body_text, str) else ""
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
        text = (f"Kubernetes API not answering at {url}: {request} answered "
                f"{status} {reason}" + (f": {message}" if message else "")
                + " (check the API server and its logs; retry when it answers again)")
    return kind(text, status=status, reason=reason, api_message=message, request=request)


def transport_error(url: str, request: str, exc: urllib3.exceptions.HTTPError,
                    limit: float) -> KubernetesError:
    """No HTTP answer: a timeout, a refused connection."""
    cause: BaseException = exc
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        cause = exc.reason
    if isinstance(cause, urllib3.exceptions.TimeoutError):
        what = f"no answer within {limit:.3g}s (timeout)"
    else:
        what = f"{type(cause).__name__}: {cause}"
    # a read changed nothing; a write may or may not have reached the API server
    maybe = ("" if request.startswith("GET ") else " (a change this request carried may "
             "or may not have been applied: the step is idempotent, retry it)")
    return KubernetesUnavailable(
        f"Kubernetes API not answering at {url}: {request}: {what}; check that the "
        f"API server runs and is reachable{maybe}",
        status=0, reason="Timeout" if "timeout" in what else "Unreachable",
        request=request)


def pod_listing(namespace: str | None, label_selector: str | None,
                field_selector: str | None) -> tuple[str, dict[str, str | None]]:
    """A pod listing's label in errors ("GET /api/v1/pods?fieldSelector=...") and its query
    parameters, the same for both readers (this one and the official client's)."""
    selectors = {"labelSelector": label_selector, "fieldSelector": field_selector}
    query = "&".join(f"{k}={v}" for k, v in selectors.items() if v)
    where = "/api/v1/pods" if namespace is None else f"/api/v1/namespaces/{namespace}/pods"
    return f"GET {where}?{query}".rstrip("?"), selectors
