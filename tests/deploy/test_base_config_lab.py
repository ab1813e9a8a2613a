"""The configuration a site installs (deploy/kubernetes/base, rendered by kustomize) runs the
shipped runbooks: its parts marked SITE filled in with the lab's (people, slurm.conf, the node
commands, the kubeconfig that stands in for the pod's service account, Prometheus), its own
choices kept (the Slurm backend, node discovery by label, the GPU Operator's names), it plans
every shipped runbook without a refusal, and runs resume-node and reset-gpu on the lab."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.config import load_config
from bot.service import Service
from bot.store import db
from kit.errors import Refused
from tests.deploy.kustomize import REPO, render
from tests.lab.fixture import Lab
from tests.runbooks.test_slurm_runbooks import node, resume_everything, run

pytestmark = pytest.mark.lab

# the parts of the base a site fills in (SITE), or adds, taken from the lab's configuration
SITE_SECTIONS = ("users", "requesters", "approvers", "etcd", "mariadb", "host_commands",
                 "prometheus", "alertmanager", "drivers", "remediation", "alert_rules")
# every shipped runbook, with parameters for the lab (gpu05 is in both pools)
REQUESTS: dict[str, dict[str, str]] = {
    "close-maintenance": {"name": "maint-gpu03"},
    "drain-node": {"node": "gpu03", "reason": "XID 79"},
    "drain-nodes": {"nodes": "gpu[03-04]", "reason": "row 4"},
    "drift-report": {}, "fairshare-review": {}, "gpu-usage-report": {},
    "handoff-node": {"node": "gpu04", "to": "kubernetes"},
    "mig-reconfigure": {"node": "gpu05", "layout": "all-3g.40gb"},
    "nccl-test": {"nodes": "gpu[03-04]"},
    "open-maintenance": {"name": "maint-gpu03", "nodes": "gpu03"},
    "quarantine-node": {"node": "gpu05", "reason": "GpuXid XID 79 on GPU 3"},
    "reset-gpu": {"node": "gpu05", "gpu": "3", "reason": "XID 48"},
    # the safety copy inside the lab's mariadb.backup_dir (the default is a site's folder)
    "restore-slurmdbd": {"backup": "/var/backups/slurm_acct_db.sql.gz",
                         "safety_copy": "/tmp/base-config-safety-copy.sql"},
    "resume-node": {"node": "gpu05"},
    "resume-nodes": {"nodes": "gpu[03-04]"},
    "rollback-driver": {"nodes": "gpu04", "version": "535.161.08"},
    "selftest": {},
    "swap-gpu": {"node": "gpu05", "gpu": "1", "reason": "XID 79"},
    "upgrade-driver": {"version": "550.54.15", "canary": "gpu03", "nodes": "gpu04"},
}
# planned by a window or need files of the site: covered by their own lab tests
ELSEWHERE = {"open-window", "close-window", "restore-etcd", "upgrade-slurm"}


def base_config() -> dict[str, Any]:
    docs = render("single")
    config_map = next(d for d in docs if d["kind"] == "ConfigMap"
                      and "config.yaml" in (d.get("data") or {}))
    loaded: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    return loaded


def sited(base: dict[str, Any], lab: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """The base as a site fills it in, the lab standing in for the site."""
    config = {**base, **{key: lab[key] for key in SITE_SECTIONS if key in lab}}
    site_runbooks = tmp_path / "site-runbooks"  # the ConfigMap gpu-runbook-bot-runbooks
    site_runbooks.mkdir()
    config["runbooks"] = {**base["runbooks"], "paths": [str(site_runbooks)]}
    config["database_url"] = f"sqlite:///{tmp_path / 'bot.db'}"
    config["slurm"] = {**base["slurm"], "slurm_conf": lab["slurm"]["slurm_conf"],
                       "commands": lab["slurm"]["commands"]}
    config["kubernetes"] = {**base["kubernetes"], "kubeconfig": lab["kubernetes"]["kubeconfig"],
                            "gpu_operator": {**base["kubernetes"]["gpu_operator"],
                                             **lab["kubernetes"]["gpu_operator"]}}
    config["engine"] = {**base.get("engine", {}), "poll_seconds": 0.1}
    return config


@pytest.fixture
def site_bot(lab: Lab, tmp_path: Path) -> Iterator[Service]:
    base = base_config()
    assert base["slurm"]["backend"] == "cli" and base["inventory"]["discover"] is True
    lab_raw = yaml.safe_load((lab.dir / "bot.yaml").read_text())
    path = tmp_path / "config.yaml"  # read as the pod reads its ConfigMap: a file
    path.write_text(yaml.safe_dump(sited(base, lab_raw, tmp_path)))
    db.init(f"sqlite:///{tmp_path / 'bot.db'}")  # what the pod's serve --init-db does
    bot = Service.from_config(load_config(path))
    assert {"gpu01", "gpu05", "gpu08"} <= set(bot.inventory.nodes)  # discovered by label
    assert "gpu05" in bot.inventory.kubernetes and "gpu05" in bot.inventory.slurm
    yield bot


def test_every_shipped_runbook_plans_without_a_refusal(site_bot: Service) -> None:
    shipped = {path.stem for path in (REPO / "runbooks").glob("*.yaml")}
    assert shipped == set(REQUESTS) | ELSEWHERE  # a new runbook is added here
    refused = {}
    for name, params in REQUESTS.items():
        try:
            site_bot.plan(name, params)
        except Refused as exc:
            refused[name] = str(exc)
    assert refused == {}, "\n".join(f"{k}: {v}" for k, v in refused.items())


def test_the_base_runs_resume_node_and_reset_gpu(lab: Lab, site_bot: Service) -> None:
    try:
        drained = run(site_bot, "drain-node", {"node": "gpu03", "reason": "XID 79"})
        assert drained.state == "succeeded", drained.error
        resumed = run(site_bot, "resume-node", {"node": "gpu03"})
        assert resumed.state == "succeeded", resumed.error
        assert node(lab, "gpu03")["state"] == "IDLE"
        reset = run(site_bot, "reset-gpu", {"node": "gpu02", "gpu": "3", "reason": "XID 48"})
        assert reset.state == "succeeded", reset.error
        assert node(lab, "gpu02")["state"] == "IDLE"
    finally:
        resume_everything(lab, "gpu02", "gpu03")
