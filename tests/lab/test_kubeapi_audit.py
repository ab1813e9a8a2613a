"""The lab API server's request log (deploy/lab/kubeapi/audit.py): each request as RBAC sees
it (verb, apiGroup, resource, subresource, namespace, name, or a non-resource URL), with its
user agent and answer, one JSON line each in $LAB/log/kubeapi-audit.jsonl."""

from __future__ import annotations

import contextlib
import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.lab.fixture import REPO, Lab

sys.path.insert(0, str(REPO / "deploy" / "lab"))
from kubeapi.audit import RequestLog, attributes


@pytest.mark.parametrize(("method", "path", "want"), [
    ("GET", "/api/v1/nodes/gpu05", ("get", "", "nodes", None, None, "gpu05")),
    ("GET", "/api/v1/nodes?labelSelector=a%3Db", ("list", "", "nodes", None, None, None)),
    ("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu05",
     ("list", "", "pods", None, None, None)),
    ("GET", "/api/v1/namespaces/serving/pods?watch=true",
     ("watch", "", "pods", None, "serving", None)),
    ("POST", "/api/v1/namespaces/serving/pods/p1/eviction",
     ("create", "", "pods", "eviction", "serving", "p1")),
    ("PATCH", "/api/v1/nodes/gpu05/status", ("patch", "", "nodes", "status", None, "gpu05")),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/default/leases/bot",
     ("update", "coordination.k8s.io", "leases", None, "default", "bot")),
    ("POST", "/apis/coordination.k8s.io/v1/namespaces/default/leases",
     ("create", "coordination.k8s.io", "leases", None, "default", None)),
    ("DELETE", "/apis/nvidia.com/v1/clusterpolicies/cluster-policy",
     ("delete", "nvidia.com", "clusterpolicies", None, None, "cluster-policy")),
    ("DELETE", "/api/v1/namespaces/serving/pods",
     ("deletecollection", "", "pods", None, "serving", None)),
    ("GET", "/api/v1/namespaces/serving", ("get", "", "namespaces", None, None, "serving")),
    ("GET", "/api/v1/namespaces", ("list", "", "namespaces", None, None, None)),
])
def test_rbac_attributes(method: str, path: str, want: tuple[object, ...]) -> None:
    got = attributes(method, path)
    assert (got["verb"], got["apiGroup"], got["resource"], got["subresource"],
            got["namespace"], got["name"]) == want


@pytest.mark.parametrize("path", ["/version", "/api", "/api/v1", "/apis",
                                  "/apis/coordination.k8s.io/v1", "/healthz"])
def test_non_resource_urls(path: str) -> None:
    assert attributes("GET", path) == {"verb": "get", "nonResourceURL": path}


def test_request_log_appends_json_lines(tmp_path: Path) -> None:
    log = RequestLog(tmp_path / "log" / "audit.jsonl")
    log.record("PATCH", "/api/v1/nodes/gpu05?fieldManager=x", "kubectl/v1.29.14", 200)
    log.record("GET", "/version", "probe", 200)
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "log" / "audit.jsonl").read_text().splitlines()]
    assert lines[0]["verb"] == "patch" and lines[0]["path"] == "/api/v1/nodes/gpu05"
    assert lines[0]["userAgent"] == "kubectl/v1.29.14" and lines[0]["code"] == 200
    assert lines[1]["nonResourceURL"] == "/version"


@pytest.mark.lab
def test_the_lab_logs_every_request(lab: Lab) -> None:
    agent = f"grb-audit-test/{time.monotonic_ns()}"
    url = lab["kubeapi"]["url"]
    for method, path in (("GET", "/api/v1/nodes/gpu05"), ("GET", "/api/v1/nodes/no-such-node"),
                         ("DELETE", "/api/v1/namespaces/serving/pods/no-such-pod")):
        request = urllib.request.Request(url + path, method=method,
                                         headers={"User-Agent": agent})
        with contextlib.suppress(urllib.error.HTTPError):  # 404s are logged too
            urllib.request.urlopen(request, timeout=10).close()
    log = Path(lab["kubeapi"]["audit_log"])
    mine = [e for e in map(json.loads, log.read_text().splitlines()) if e["userAgent"] == agent]
    assert [(e["verb"], e["resource"], e["name"], e["code"]) for e in mine] == [
        ("get", "nodes", "gpu05", 200), ("get", "nodes", "no-such-node", 404),
        ("delete", "pods", "no-such-pod", 404)]
