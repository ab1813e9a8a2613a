"""The cluster's guard rails in the rendered overlays: liveness never asks the database
(readiness does); the namespace enforces Pod Security `restricted` and every container meets
it; the NetworkPolicy lets in only the ingress controller and the monitoring namespace, and
out only DNS, the Kubernetes API, Slurm, Prometheus, Alertmanager, the databases and HTTPS;
and every README/docs reference in deploy/ and the Dockerfile names a page and section that
exist."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.kustomize import OVERLAYS, REPO, render

Docs = list[dict[str, Any]]
BOT_LABEL = "app.kubernetes.io/name"
# a reference: README.md#anchor, docs/x.md#anchor, x.md#anchor, or one with the section
# named in quotes (README "Configuration", docs/operations.md, "Alertmanager")
REFERENCE = re.compile(r"""(?P<page>\bREADME(?:\.md)?|\b(?:docs/)?[a-z][a-z0-9_-]*\.md)
                           (?:\#(?P<anchor>[A-Za-z0-9_-]+)|,?\ "(?P<section>[^"]+)")""",
                       re.VERBOSE)


@pytest.fixture(scope="module", params=OVERLAYS)
def docs(request: pytest.FixtureRequest) -> Iterator[Docs]:
    yield render(request.param)


def one(docs: Docs, kind: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


def pod_specs(docs: Docs) -> list[dict[str, Any]]:
    specs = [d["spec"]["template"]["spec"] for d in docs
             if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")]
    specs += [d["spec"]["jobTemplate"]["spec"]["template"]["spec"] for d in docs
              if d["kind"] == "CronJob"]
    assert specs
    return specs


def test_liveness_asks_nothing_of_the_database_readiness_does(docs: Docs) -> None:
    for spec in pod_specs(docs):
        (bot,) = [c for c in spec["containers"] if c["name"] == "bot"]
        assert bot["livenessProbe"]["httpGet"]["path"] == "/livez"
        assert bot["startupProbe"]["httpGet"]["path"] == "/livez"
        assert bot["readinessProbe"]["httpGet"]["path"] == "/healthz"


def test_the_namespace_enforces_pod_security_restricted(docs: Docs) -> None:
    labels = one(docs, "Namespace")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert labels["pod-security.kubernetes.io/enforce-version"] == "latest"


def restricted_problems(spec: dict[str, Any]) -> list[str]:
    """What the Pod Security `restricted` level refuses in a pod spec (the checks that apply
    to these manifests: host namespaces and paths, privilege, capabilities, user, seccomp)."""
    problems = [f"spec.{key}" for key in ("hostNetwork", "hostPID", "hostIPC") if spec.get(key)]
    allowed = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
               "persistentVolumeClaim", "projected", "secret"}
    problems += [f"volume {v['name']}: {sorted(set(v) - {'name'})}" for v in spec.get(
        "volumes", []) if not set(v) - {"name"} <= allowed]
    pod = spec.get("securityContext") or {}
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        ctx, name = c.get("securityContext") or {}, c["name"]
        if ctx.get("privileged"):
            problems.append(f"{name}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in caps.get("drop", []):
            problems.append(f"{name}: capabilities must drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds {caps['add']}")
        if not ctx.get("runAsNonRoot", pod.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot")
        if ctx.get("runAsUser", pod.get("runAsUser")) == 0:
            problems.append(f"{name}: runAsUser 0")
        seccomp = (ctx.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile RuntimeDefault")
        if c.get("ports") and any(p.get("hostPort") for p in c["ports"]):
            problems.append(f"{name}: hostPort")
    return problems


def test_every_pod_meets_restricted(docs: Docs) -> None:
    for spec in pod_specs(docs):
        assert restricted_problems(spec) == []


def test_the_restricted_check_refuses_what_it_should() -> None:
    good = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    bad = {"runAsUser": 0, "capabilities": {"add": ["SYS_ADMIN"]}}
    spec = {"securityContext": {"runAsNonRoot": True,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
            "containers": [{"name": "a", "securityContext": good},
                           {"name": "b", "securityContext": bad}]}
    assert restricted_problems(spec) == [
        "volume h: ['hostPath']", "b: allowPrivilegeEscalation must be false",
        "b: capabilities must drop ALL", "b: adds ['SYS_ADMIN']", "b: runAsUser 0"]


def namespaces(peers: list[dict[str, Any]]) -> set[str]:
    return {p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            for p in peers if "namespaceSelector" in p}


def ports(rule: dict[str, Any]) -> set[tuple[Any, str]]:
    return {(p["port"], p.get("protocol", "TCP")) for p in rule["ports"]}


def test_the_network_policy(docs: Docs) -> None:
    policy = one(docs, "NetworkPolicy")["spec"]
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] == "Deployment"]
    assert all(set(policy["podSelector"]["matchLabels"].items()) <= set(p.items()) for p in pods)
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    assert [namespaces(r["from"]) for r in policy["ingress"]] == [{"ingress-nginx"},
                                                                  {"monitoring"}]
    assert all(ports(r) == {("http", "TCP")} and all(set(p) == {"namespaceSelector"}
                                                      for p in r["from"])
               for r in policy["ingress"])
    allowed = set().union(*(ports(r) for r in policy["egress"]))
    assert allowed == {(53, "UDP"), (53, "TCP"), (443, "TCP"), (6443, "TCP"), (6817, "TCP"),
                       (6819, "TCP"), (6820, "TCP"), (9090, "TCP"), (9093, "TCP"),
                       (5432, "TCP"), (3306, "TCP")}
    dns = [r for r in policy["egress"] if (53, "UDP") in ports(r)]
    assert [namespaces(r["to"]) for r in dns] == [{"kube-system"}]
    for rule in policy["egress"]:  # kustomize adds the bot's labels to peers' podSelectors
        for peer in rule["to"]:
            assert BOT_LABEL not in (peer.get("podSelector") or {}).get("matchLabels", {}), peer
    (slack,) = [r for r in policy["egress"] if ports(r) == {(443, "TCP")}]
    assert slack["to"][0]["ipBlock"]["except"] == ["10.0.0.0/8", "172.16.0.0/12",
                                                   "192.168.0.0/16"]


def slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(page: Path) -> set[str]:
    return {m.strip() for m in re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)}


def references() -> list[tuple[str, str, str | None, str | None]]:
    """(where, page, anchor, section) of each reference in deploy/ (the lab's own pages
    aside) and the Dockerfile."""
    files = [REPO / "Dockerfile"] + [
        p for p in sorted((REPO / "deploy").rglob("*"))
        if p.is_file() and "lab" not in p.relative_to(REPO / "deploy").parts[:1]
        and p.suffix not in (".pyc", ".png")]
    found = []
    for path in files:
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for m in REFERENCE.finditer(line):
                found.append((f"{path.relative_to(REPO)}:{n}", m["page"], m["anchor"],
                              m["section"]))
    return found


def page_of(page: str) -> Path:
    if page.startswith("README"):
        return REPO / "README.md"
    return REPO / "docs" / page.removeprefix("docs/")


def test_every_docs_reference_in_deploy_resolves() -> None:
    found = references()
    assert any(page == "docs/slack.md" for _, page, _, _ in found)
    bad = []
    for where, page, anchor, section in found:
        path = page_of(page)
        if not path.is_file():
            bad.append(f"{where}: {page}: no such page")
        elif anchor and anchor not in {slug(s) for s in sections(path)}:
            bad.append(f"{where}: {page}#{anchor}: no such section")
        elif section and section not in sections(path):
            bad.append(f'{where}: {page} "{section}": no such section')
    assert not bad, "\n".join(bad)


def test_the_reference_scan_reads_both_forms() -> None:
    line = 'see README "Container image" and docs/operations.md#connect-to-slurm, slack.md#x'
    assert [(m["page"], m["anchor"], m["section"]) for m in REFERENCE.finditer(line)] == [
        ("README", None, "Container image"), ("docs/operations.md", "connect-to-slurm", None),
        ("slack.md", "x", None)]
