"""Prometheus and Alertmanager in the bot, against the lab's real daemons: promql checks pass,
fail, fail on one series of many (judged by its whole label set, not by host and GPU), fail
on no data and fail closed with Prometheus down; the alerts gate; and the whole
alert path — a lab fault xid=79 on gpu02 travels Prometheus -> Alertmanager -> the bot's
/alerts webhook (`runbook serve`, with the lab's bearer token) -> one swap-gpu proposal for
gpu02."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from bot.config import EngineConfig, load_config
from bot.service import Service
from bot.store import db
from bot.store.schema import proposals as proposals_table
from tests.lab.fixture import Lab
from tests.lab.kubehelp import wait_until
from tests.runbooks.test_slurm_runbooks import node, resume_everything, run

pytestmark = pytest.mark.lab

CHECKS = {
    "name": "gpu-checks", "version": "1.0.0", "summary": "checks only", "risk": "low",
    "params": {"node": {"type": "node", "required": True},
               "metric": {"type": "text", "default": "DCGM_FI_DEV_GPU_TEMP"}},
    "pre_checks": [
        {"name": "GPUs below 90 C", "promql": 'max({__name__="{{ metric }}",'
                                              'Hostname="{{ node }}"})', "expect": "< 90"},
        {"name": "no critical alert", "alerts": {"node": "{{ node }}", "severity": "critical"}},
    ],
    "steps": [{"id": "note", "action": "chat.notify", "with": {"message": "checked"}}],
}
# One series per GPU, labelled by UUID only (no Hostname, node or gpu label), hottest first.
BY_UUID = {
    "name": "gpu-checks-by-uuid", "version": "1.0.0", "summary": "every GPU, by UUID",
    "risk": "low", "params": {"node": {"type": "node", "required": True}},
    "pre_checks": [{"name": "every GPU below 90 C", "expect": "< 90", "promql":
                    'sort_desc(max by (UUID) (DCGM_FI_DEV_GPU_TEMP{Hostname="{{ node }}"}))'}],
    "steps": [{"id": "note", "action": "chat.notify", "with": {"message": "checked"}}],
}


@pytest.fixture
def checks_bot(lab: Lab, tmp_path: Path) -> Service:
    folder = tmp_path / "runbooks"
    folder.mkdir()
    (folder / "gpu-checks.yaml").write_text(yaml.safe_dump(CHECKS))
    (folder / "gpu-checks-by-uuid.yaml").write_text(yaml.safe_dump(BY_UUID))
    config = load_config(lab.dir / "bot.yaml").model_copy(update={
        "database_url": f"sqlite:///{tmp_path / 'bot.db'}", "runbook_paths": [folder],
        "engine": EngineConfig(lease_seconds=10, poll_seconds=0.1)})
    return Service.from_config(config)


def prometheus_sees(lab: Lab, query: str) -> bool:
    url = lab["monitoring"]["prometheus_url"] + "/api/v1/query?query=" + urllib.parse.quote(query)
    with urllib.request.urlopen(url, timeout=5) as response:
        return bool(json.loads(response.read())["data"]["result"])


def test_promql_check_passes_and_fails(lab: Lab, checks_bot: Service) -> None:
    wait_until(lambda: prometheus_sees(lab, 'DCGM_FI_DEV_GPU_TEMP{Hostname="gpu03"}'),
               "the first scrape", timeout=60)
    assert run(checks_bot, "gpu-checks", {"node": "gpu03"}).state == "succeeded"
    lab.lab("fault", "gpu03", "temp=95")
    try:
        wait_until(lambda: prometheus_sees(lab, 'DCGM_FI_DEV_GPU_TEMP{Hostname="gpu03"} > 90'),
                   "the hot GPU", timeout=30)
        ex = run(checks_bot, "gpu-checks", {"node": "gpu03"})
        assert ex.state == "failed"
        assert "GPUs below 90 C' failed: 1 of 1 series not < 90" in (ex.error or "")
        assert "nothing was run" in (ex.error or "")
    finally:
        lab.lab("fault", "gpu03", "clear")


def test_one_hot_gpu_of_eight_fails_the_check(lab: Lab, checks_bot: Service) -> None:
    """Eight series that share no host or GPU label: the one hot GPU fails the check even
    though seven passing series come after it."""
    query = 'DCGM_FI_DEV_GPU_TEMP{Hostname="gpu03", gpu="5"}'
    wait_until(lambda: prometheus_sees(lab, query), "the first scrape", timeout=60)
    cool = 'max(DCGM_FI_DEV_GPU_TEMP{Hostname="gpu03"}) < 90'  # no fault left by another test
    wait_until(lambda: prometheus_sees(lab, cool), "gpu03 cool", timeout=60)
    before = run(checks_bot, "gpu-checks-by-uuid", {"node": "gpu03"})
    assert before.state == "succeeded", before.error
    lab.lab("fault", "gpu03", "temp=95", "gpu=5")
    try:
        wait_until(lambda: prometheus_sees(lab, query + " > 90"), "the hot GPU", timeout=30)
        url = (lab["monitoring"]["prometheus_url"] + "/api/v1/query?query="
               + urllib.parse.quote(query))
        with urllib.request.urlopen(url, timeout=5) as response:
            uuid = json.loads(response.read())["data"]["result"][0]["metric"]["UUID"]
        ex = run(checks_bot, "gpu-checks-by-uuid", {"node": "gpu03"})
        assert ex.state == "failed"
        assert ("'every GPU below 90 C' failed: 1 of 8 series not < 90: "
                f'{{UUID="{uuid}"}} 95') in (ex.error or "")
    finally:
        lab.lab("fault", "gpu03", "clear")


def test_no_data_fails_the_check(lab: Lab, checks_bot: Service) -> None:
    ex = run(checks_bot, "gpu-checks", {"node": "gpu03", "metric": "DCGM_FI_DEV_NO_SUCH"})
    assert ex.state == "failed" and "no data for" in (ex.error or "")


def test_prometheus_down_fails_closed(lab: Lab, checks_bot: Service) -> None:
    assert lab.lab("service", "prometheus", "stop").returncode == 0
    try:
        ex = run(checks_bot, "gpu-checks", {"node": "gpu03"})
        assert ex.state == "failed" and "not answering" in (ex.error or "")
    finally:
        assert lab.lab("service", "prometheus", "start").returncode == 0


@pytest.fixture
def served(lab: Lab, tmp_path: Path) -> Iterator[tuple[dict[str, str], str]]:
    """`runbook serve` on the lab's bot port, with its own database."""
    config = yaml.safe_load((lab.dir / "bot.yaml").read_text())
    config["database_url"] = f"sqlite:///{tmp_path / 'served.db'}"
    (tmp_path / "bot.yaml").write_text(yaml.safe_dump(config))
    env = {**lab.env, "RUNBOOK_CONFIG": str(tmp_path / "bot.yaml")}
    port = lab["monitoring"]["bot_port"]
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "bot", "serve", "--port", str(port)],
                              env=env, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as response:
                status: int = response.status
                return status == 200
        except OSError:
            return False

    try:
        wait_until(healthy, "runbook serve", timeout=30)
        yield env, url
    finally:
        server.terminate()
        server.wait(10)
        log.close()


def proposals(env: dict[str, str]) -> list[dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "bot", "proposals", "--json"], env=env,
                          capture_output=True, text=True, timeout=30, check=True)
    return list(json.loads(done.stdout))


def proposed(env: dict[str, str], runbook: str) -> bool:
    """Whether the served bot's database holds an open proposal of ``runbook``: read directly,
    as a poll (a `runbook proposals` run costs a second or two of CPU, which a poll every
    half second took from the very daemons the alert travels through)."""
    url = yaml.safe_load(Path(env["RUNBOOK_CONFIG"]).read_text())["database_url"]
    engine = db.connect(url, migrate=False)
    try:
        with engine.connect() as conn:
            return conn.execute(select(proposals_table.c.id).where(
                proposals_table.c.runbook == runbook,
                proposals_table.c.state == "open")).first() is not None
    finally:
        engine.dispose()


def test_xid_79_becomes_one_swap_gpu_proposal(lab: Lab, served: Any) -> None:
    env, url = served
    # /alerts takes only the lab's bearer token, which Alertmanager sends (credentials_file)
    request = urllib.request.Request(url + "/alerts", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    refused.value.close()  # the error holds the response and its socket
    assert refused.value.code == 401
    # the test before restarts Prometheus: the path is timed from a Prometheus that scrapes
    # again (a fresh sample), not from one still starting (seen to take a minute under load)
    wait_until(lambda: prometheus_sees(
        lab, 'time() - timestamp(DCGM_FI_DEV_GPU_TEMP{Hostname="gpu02"}) < 3'),
        "Prometheus scraping again", timeout=60)
    started = time.monotonic()
    # GPU 4: an alert no earlier test raised (tests/lab/test_monitoring.py uses GPU 3 here)
    lab.lab("fault", "gpu02", "xid=79", "xid_gpu=4")
    try:
        wait_until(lambda: proposed(env, "swap-gpu"), "a swap-gpu proposal", timeout=60,
                   every=0.2)
        elapsed = time.monotonic() - started
        found = [p for p in proposals(env) if p["runbook"] == "swap-gpu"]
        assert found[0]["params"] == {"node": "gpu02", "gpu": "4", "reason": "XID 79 on GPU 4"}
        assert found[0]["alertname"] == "GpuXid"  # through the XID table: 79 is swap
        # 79 is listed in remediation.quarantine: the node is taken out at once, without a
        # person (risk low, the served engine runs it); the swap waits for one
        assert found[0]["note"].startswith("XID 79: swap (remediation.xid); quarantined by "
                                           "execution ")
        wait_until(lambda: "DRAIN" in node(lab, "gpu02")["state"], "gpu02 quarantined",
                   timeout=60)
        reason = node(lab, "gpu02")["reason"]
        assert reason.startswith("quarantine: GpuXid XID 79 on GPU 4 (alert "), reason
        time.sleep(3)  # Prometheus re-sends the firing alert every 2 s: still one proposal
        assert len([p for p in proposals(env) if p["runbook"] == "swap-gpu"]) == 1
        print(f"fault to proposal: {elapsed:.1f}s")
    finally:
        lab.lab("fault", "gpu02", "clear")
        resume_everything(lab, "gpu02")


def test_capacity_guard_refuses_and_break_glass_costs_an_approval(lab: Lab, checks_bot: Service,
                                                                   tmp_path: Path) -> None:
    from kit.errors import Refused

    config = checks_bot.config.model_copy(update={"runbook_paths": [
        Path(__file__).resolve().parents[2] / "runbooks"]})
    bot = Service.from_config(config)
    with pytest.raises(Refused, match=r"capacity guard: .*Slurm pool: 40 free GPUs now, 32 "
                                      r"after taking gpu01 out \(floor 36\)"):
        bot.request("drain-node", {"node": "gpu01", "reason": "test", "min_free_gpus": "36"},
                    "alice")
    execution_id = bot.request("drain-node", {"node": "gpu01", "reason": "test",
                                              "min_free_gpus": "36"}, "alice", break_glass=True)
    ex = bot.get(execution_id)
    assert ex.plan.break_glass and ex.approvals_required == 2  # medium risk: 1, +1
    bot.cancel(execution_id, "alice")


def test_node_view_shows_all_three_systems(lab: Lab, checks_bot: Service) -> None:
    from bot.surfaces import nodeview

    lab.lab("fault", "gpu05", "xid=79", "xid_gpu=2")
    try:
        wait_until(lambda: prometheus_sees(lab, 'DCGM_FI_DEV_XID_ERRORS{Hostname="gpu05"} == 79'),
                   "the XID in Prometheus", timeout=30)
        (view,) = nodeview.build(checks_bot, ["gpu05"])
        assert view.slurm is not None and view.slurm["gpus_total"] == 8
        assert view.kubernetes is not None and view.kubernetes["gpus_allocatable"] == 8
        assert len(view.gpus) == 8 and view.gpus["2"]["xid"] == 79
        assert view.gpus["0"]["driver"] == lab["default_driver_version"]
        shown = nodeview.text(view)
        assert "Slurm: idle" in shown and "Kubernetes: schedulable" in shown
    finally:
        lab.lab("fault", "gpu05", "clear")
