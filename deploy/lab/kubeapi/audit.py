"""The request log (`--audit-log FILE`): one JSON line per request, with the attributes RBAC
authorizes on, as the real API server's authorizer sees them.

    {"ts": ..., "verb": "create", "apiGroup": "", "resource": "pods",
     "subresource": "eviction", "namespace": "serving", "name": "inference-7x",
     "userAgent": "OpenAPI-Generator/31.0.0/python", "code": 201, "method": "POST",
     "path": "/api/v1/namespaces/serving/pods/inference-7x/eviction"}

Verbs are RBAC's: get, list, watch (GET of one object, of a collection, with ?watch), create
(POST, also for subresources such as pods/eviction), update (PUT), patch, delete (DELETE of
one object) and deletecollection. A path outside /api and /apis (discovery, /version,
/healthz) is a non-resource URL: verb get, ``nonResourceURL`` set, no resource. Requests
are recorded whatever the answer (a 404 or 409 was still asked), and so are the lab's
readiness probes (their user agent tells them apart). Used by tests/deploy/test_rbac.py
to check the bot's ClusterRole against what the bot really sends.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

_METHOD_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def attributes(method: str, raw_path: str) -> dict[str, Any]:
    """RBAC's view of one request: verb, apiGroup, resource, subresource, namespace, name."""
    url = urlsplit(raw_path)
    path = url.path.rstrip("/") or "/"
    query = parse_qs(url.query)
    parts = path.split("/")[1:]
    group: str | None = None
    rest: list[str] = []
    if parts[:2] == ["api", "v1"] and len(parts) > 2:
        group, rest = "", parts[2:]
    elif parts[0] == "apis" and len(parts) > 3:
        group, rest = parts[1], parts[3:]
    if group is None or not rest:
        return {"verb": "get" if method in ("GET", "HEAD") else method.lower(),
                "nonResourceURL": path}
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else None
    if method in ("GET", "HEAD"):
        watching = query.get("watch", [""])[-1] in ("1", "true", "True")
        verb = "watch" if watching else ("get" if name else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = _METHOD_VERBS.get(method, method.lower())
    return {"verb": verb, "apiGroup": group, "resource": resource, "subresource": subresource,
            "namespace": namespace, "name": name}


class RequestLog:
    """Appends one JSON line per request to ``path``; safe across the server's threads."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the run
        self._lock = threading.Lock()

    def record(self, method: str, path: str, user_agent: str, code: int) -> None:
        entry = {"ts": round(time.time(), 3), **attributes(method, path),
                 "userAgent": user_agent, "code": code, "method": method,
                 "path": urlsplit(path).path}
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()
