"""The kustomize manifests (deploy/kubernetes): both overlays render with real `kubectl
kustomize`, and what they render is a deployable bot: replicas and strategy per overlay, the
PodDisruptionBudget, probes on /healthz, the Slack, /alerts token and database Secrets
referenced (never inlined), a non-root, read-only, capability-free pod, the RBAC objects bound
to the pod's ServiceAccount, a configuration the bot accepts (and that guards /alerts with
the token), alert rules promtool accepts, and the GPU alert rules in step with
deploy/prometheus/gpu-alerts.yaml."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import Config, shipped_runbooks
from bot.runtime.access import TOKEN_ENV, AlertsAuthError, alerts_access
from bot.runtime.startup import exit_deadline
from tests.deploy.kustomize import KUSTOMIZE, OVERLAYS, REPO, render

NAMESPACE = "gpu-runbook-bot"
SLACK_ENV = ["SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET", "SLACK_APP_TOKEN"]
# Values that would be a credential in plain text.
SECRET_LOOKING = re.compile(r"xox[abpr]-|xapp-|://[^/\s:@]+:[^/\s@]+@|BEGIN [A-Z ]*PRIVATE KEY")


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    yield request.param, render(request.param)


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind
             and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} rendered, want 1"
    return found[0]


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def container(docs: list[dict[str, Any]], name: str = "bot") -> dict[str, Any]:
    return next(c for c in pod_spec(docs)["containers"] if c["name"] == name)


def env_of(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container(docs).get("env", [])}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_the_gpu_alerts_copy_is_in_step() -> None:
    out = subprocess.run([str(KUSTOMIZE / "sync"), "--check"], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_object_rendered(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, docs = rendered
    kinds = sorted(d["kind"] for d in docs)
    want = ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "ConfigMap", "Deployment",
            "Namespace", "NetworkPolicy", "PodDisruptionBudget", "PrometheusRule",
            "PrometheusRule", "Role",
            "RoleBinding", "Service", "ServiceAccount", "ServiceMonitor"]
    if overlay == "single":
        want.append("PersistentVolumeClaim")
    assert kinds == sorted(want)
    for doc in docs:
        if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]


def test_replicas_strategy_and_database(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, docs = rendered
    deployment = one(docs, "Deployment", "gpu-runbook-bot")
    env = env_of(docs)
    if overlay == "single":
        assert deployment["spec"]["replicas"] == 1
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}
        assert env["RUNBOOK_DB_URL"]["value"] == "sqlite:////var/lib/gpu-runbook-bot/bot.db"
        data = next(v for v in pod_spec(docs)["volumes"] if v["name"] == "data")
        assert data == {"name": "data",
                        "persistentVolumeClaim": {"claimName": "gpu-runbook-bot-data"}}
        one(docs, "PersistentVolumeClaim", "gpu-runbook-bot-data")
        mount = next(m for m in container(docs)["volumeMounts"] if m["name"] == "data")
        assert mount["mountPath"] == "/var/lib/gpu-runbook-bot"
    else:
        assert deployment["spec"]["replicas"] == 2
        assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
        assert env["RUNBOOK_DB_URL"]["valueFrom"] == {
            "secretKeyRef": {"name": "gpu-runbook-bot-db", "key": "url"}}
    # Leader election finds its Lease's namespace from the pod.
    assert env["POD_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}}


def test_pdb_service_and_monitor_select_the_pods(
        rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    pdb = one(docs, "PodDisruptionBudget", "gpu-runbook-bot")["spec"]
    assert pdb["maxUnavailable"] == 1 and "minAvailable" not in pdb
    assert matches(pdb["selector"]["matchLabels"], labels)
    service = one(docs, "Service", "gpu-runbook-bot")
    assert matches(service["spec"]["selector"], labels)
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    monitor = one(docs, "ServiceMonitor", "gpu-runbook-bot")["spec"]
    assert matches(monitor["selector"]["matchLabels"], service["metadata"]["labels"])
    assert monitor["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]


def test_probes_on_healthz(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    bot = container(docs)
    assert bot["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert bot["args"] == ["runbook", "serve", "--host", "0.0.0.0", "--port", "8080",
                           "--init-db"]
    # Readiness asks the database; liveness (and the start, which gates it) never does, so a
    # database outage makes replicas unready and restarts none (tests/deploy/
    # test_cluster_policy.py, tests/bot/runtime/test_liveness.py).
    assert bot["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    for probe in ("startupProbe", "livenessProbe"):
        assert bot[probe]["httpGet"] == {"path": "/livez", "port": "http"}, probe


def test_secrets_are_referenced_never_inlined(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    assert not [d for d in docs if d["kind"] == "Secret"]
    env = env_of(docs)
    for name in SLACK_ENV:
        assert env[name]["valueFrom"] == {"secretKeyRef": {
            "name": "gpu-runbook-bot-slack", "key": name, "optional": True}}, name
    # optional: without it the bot itself refuses to start, saying what to set
    assert env[TOKEN_ENV]["valueFrom"] == {"secretKeyRef": {
        "name": "gpu-runbook-bot-alerts", "key": "token", "optional": True}}
    for spec in pod_spec(docs)["containers"]:
        for item in spec.get("env", []):
            if re.search(r"TOKEN|SECRET|PASSWORD|DB_URL", item["name"]) and "value" in item:
                assert not SECRET_LOOKING.search(item["value"]), item
                assert item["value"].startswith("sqlite:"), item
    text = yaml.safe_dump_all(docs)
    assert not SECRET_LOOKING.search(text), SECRET_LOOKING.search(text)
    key = next(v for v in pod_spec(docs)["volumes"] if v["name"] == "munge-key")
    assert key["secret"]["secretName"] == "gpu-runbook-bot-munge"


def test_pod_runs_non_root_read_only_without_capabilities(
        rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    spec = pod_spec(docs)
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] == 10001 and pod["runAsGroup"] == 10001 and pod["fsGroup"] == 10001
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    assert {c["name"] for c in spec["containers"]} == {"bot", "munged"}
    for item in spec["containers"]:
        ctx = item["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False, item["name"]
        assert ctx["readOnlyRootFilesystem"] is True, item["name"]
        assert ctx["capabilities"] == {"drop": ["ALL"]}, item["name"]
        assert "privileged" not in ctx and "runAsUser" not in ctx, item["name"]
        assert item["image"] == "localhost/gpu-runbook-bot:0.1.0", item["name"]
    assert not spec.get("hostNetwork") and not spec.get("hostPID")


def test_rbac_is_bound_to_the_pods_service_account(
        rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    assert pod_spec(docs)["serviceAccountName"] == account
    for binding_kind, role_kind in (("ClusterRoleBinding", "ClusterRole"),
                                    ("RoleBinding", "Role")):
        binding = one(docs, binding_kind)
        role = one(docs, role_kind)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                      "kind": role_kind, "name": role["metadata"]["name"]}
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
            assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule


def test_both_overlays_grant_the_same() -> None:
    def rbac(docs: list[dict[str, Any]]) -> list[Any]:
        return [d["rules"] for d in docs if d["kind"] in ("ClusterRole", "Role")]

    assert rbac(render("single")) == rbac(render("ha"))


def test_the_configuration_is_one_the_bot_accepts(
        rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    spec = pod_spec(docs)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container(docs)["volumeMounts"]}
    config_map = one(docs, "ConfigMap", volumes["config"]["configMap"]["name"])
    one(docs, "ConfigMap", volumes["runbooks"]["configMap"]["name"])
    assert env_of(docs)["RUNBOOK_CONFIG"]["value"] == f"{mounts['config']}/config.yaml"
    raw = yaml.safe_load(config_map["data"]["config.yaml"])
    config = Config.model_validate(raw)
    assert config.kubernetes is not None and config.kubernetes.kubeconfig is None
    assert config.slurm is not None and config.slurm.slurm_conf == \
        f"{mounts['slurm-conf']}/slurm.conf"
    # the Slurm clients with the munged sidecar: the backend every shipped runbook can use
    assert config.slurm.backend == "cli"
    assert env_of(docs)["SLURM_CONF"]["value"] == config.slurm.slurm_conf
    # slurmrestd's token (backend: rest, commented in the base): a file of the mounted
    # Secret, never a value in the ConfigMap, and a Secret the pod starts without
    rest = yaml.safe_load(re.sub(r"(?m)^  # (rest:|  (url|user|token_file):)", r"  \1",
                                 config_map["data"]["config.yaml"]))
    assert rest["slurm"]["rest"]["token_file"] == f"{mounts['slurm-jwt']}/token"
    assert volumes["slurm-jwt"]["secret"]["secretName"] == "gpu-runbook-bot-slurm-jwt"
    assert volumes["slurm-jwt"]["secret"]["optional"] is True
    # the shipped runbooks of the bot's own package, then the site's ConfigMap
    assert config.runbooks.shipped and config.runbooks.exclude == []
    assert config.runbook_paths == [*sorted(shipped_runbooks().glob("*.yaml")),
                                    Path(mounts["runbooks"])]
    assert config.server.port == 8080
    assert config.database_url is None  # RUNBOOK_DB_URL, per overlay
    # /alerts on 0.0.0.0 takes the token of the Secret, and without it the bot does not start
    host = container(docs)["args"][container(docs)["args"].index("--host") + 1]
    assert config.server.alerts_auth == "bearer" and config.server.alerts_token_file is None
    assert alerts_access(config.server, host, {TOKEN_ENV: "t" * 32}).token == "t" * 32
    with pytest.raises(AlertsAuthError, match=TOKEN_ENV):
        alerts_access(config.server, host, {})
    assert not SECRET_LOOKING.search(config_map["data"]["config.yaml"])
    # SIGTERM: serve ends, or writes its stacks and exits, before the kubelet's SIGKILL
    assert spec["terminationGracePeriodSeconds"] > exit_deadline(config)


def test_prometheus_rules(rendered: tuple[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    _, docs = rendered
    bot_rules = one(docs, "PrometheusRule", "gpu-runbook-bot")["spec"]
    gpu_rules = one(docs, "PrometheusRule", "gpu-runbook-bot-gpu-alerts")["spec"]
    source = yaml.safe_load((REPO / "deploy" / "prometheus" / "gpu-alerts.yaml").read_text())
    assert gpu_rules == source
    # Every metric the bot's rules read is one bot/runtime/*metrics.py exports (a real
    # scrape: tests/deploy/test_alert_rules.py).
    serving = "".join(p.read_text() for p in (REPO / "bot" / "runtime").glob("*metrics.py"))
    for group in bot_rules["groups"]:
        for rule in group["rules"]:
            for metric in re.findall(r"\b(runbook_[a-z_]+)\b", rule["expr"]):
                family = re.sub(r"_(total|bucket|sum|count)$", "", metric)
                assert f'"{family}"' in serving, (rule["alert"], metric)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package; the lab "
                    "installs it): the rule files were not checked by promtool")
    for name, spec in (("bot", bot_rules), ("gpu", gpu_rules)):
        path = tmp_path / f"{name}.rules.yaml"
        path.write_text(yaml.safe_dump(spec))
        out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                             text=True, check=False, stdin=subprocess.DEVNULL)
        assert out.returncode == 0, out.stdout + out.stderr
