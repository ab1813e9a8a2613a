"""A maintenance window against the lab: opening it makes a real Slurm MAINT reservation,
cordons the node in the lab's Kubernetes API (marked as the window's), silences the nodes'
alerts in the real Alertmanager and runs the runbook inside; closing it removes all three.
And the weekly gpu-usage-report against the lab's Slurm accounting and Prometheus."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from adapters.alertmanager.backend import HttpAlertmanagerBackend
from adapters.kubernetes.cordons import CORDONED_BY
from bot.config import EngineConfig, load_config
from bot.execution.engine import Engine
from bot.schedule import windows
from bot.service import Service
from bot.store import audit
from tests.lab.fixture import Lab
from tests.lab.kubehelp import api, nodes
from tests.runbooks.reporthelp import report_summary

pytestmark = pytest.mark.lab


@pytest.fixture
def bot(lab: Lab, tmp_path: Path) -> Iterator[Service]:
    config = load_config(lab.dir / "bot.yaml")
    config = config.model_copy(update={
        "database_url": f"sqlite:///{tmp_path / 'bot.db'}",
        "engine": EngineConfig(lease_seconds=10, poll_seconds=0.1),
    })
    yield Service.from_config(config)


def reservations(lab: Lab) -> str:
    return lab.run("scontrol", "show", "reservation").stdout


def silences(bot: Service) -> list[str]:
    assert bot.config.alertmanager is not None
    backend = HttpAlertmanagerBackend(bot.config.alertmanager)
    return [" ".join(str(m) for m in s.matchers) for s in backend.find_silences()
            if s.created_by == "gpu-runbook-bot"]


def seen_states(bot: Service, node: str, names: tuple[str, ...]) -> dict[str, str]:
    """Post these alerts about ``node`` to the lab's Alertmanager; each one's state once
    Alertmanager has decided on it (active or suppressed)."""
    assert bot.config.alertmanager is not None
    url = f"{bot.config.alertmanager.url}/api/v2/alerts"
    ends = (datetime.now(UTC) + timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = json.dumps([{"labels": {"alertname": name, "node": node, "test": "window"},
                        "endsAt": ends} for name in names]).encode()  # gone in 30 s
    urllib.request.urlopen(urllib.request.Request(
        url, body, {"Content-Type": "application/json"}, method="POST"), timeout=10).close()
    backend = HttpAlertmanagerBackend(bot.config.alertmanager)
    deadline = time.monotonic() + 20
    while True:
        states = {a.labels["alertname"]: a.state for a in backend.alerts(silenced=True)
                  if a.labels.get("test") == "window"}
        if len(states) == len(names) and "unprocessed" not in states.values():
            return states
        assert time.monotonic() < deadline, f"Alertmanager did not decide: {states}"
        time.sleep(0.2)


def settle(bot: Service, window_id: int, done: str, seconds: float = 180) -> windows.Window:
    """Advance the window and run its executions until it is ``done`` (open or closed)."""
    engine = Engine(bot)
    deadline = time.monotonic() + seconds
    try:
        while True:
            windows.advance(bot, window_id)
            engine.run_pending(once=True)
            window = windows.get(bot, window_id)
            finished = window.state == done and (done != windows.OPEN
                                                 or windows.inside_done(window))
            if finished or window.state in (windows.FAILED, windows.MISSED):
                return window
            assert time.monotonic() < deadline, f"window {window_id} is {window.state}"
            time.sleep(0.2)
    finally:
        engine.close()


def cleanup(lab: Lab, bot: Service, window_id: int) -> None:
    lab.run("scontrol", "delete", f"ReservationName=window-{window_id}")
    api(lab, "PATCH", "/api/v1/nodes/gpu05",
        {"spec": {"unschedulable": None}, "metadata": {"annotations": {CORDONED_BY: None}}},
        ctype="application/strategic-merge-patch+json")
    assert bot.config.alertmanager is not None
    backend = HttpAlertmanagerBackend(bot.config.alertmanager)
    for silence in backend.find_silences():
        if silence.created_by == "gpu-runbook-bot" and "window" in silence.comment:
            backend.expire_silence(silence.id)


def test_a_window_opens_and_closes_on_the_lab(lab: Lab, bot: Service) -> None:
    assert "gpu05" in bot.inventory.kubernetes and "gpu04" in bot.inventory.slurm
    window = windows.create(bot, "gpu[04-05]", "alice", start="now", duration="30m",
                            reason="lab window test", runbooks=[("selftest", {})])
    try:
        windows.approve(bot, window.id, "carol")
        windows.open_now(bot, window.id, "alice")
        opened = settle(bot, window.id, windows.OPEN)
        assert opened.state == windows.OPEN, opened.report
        shown = reservations(lab)
        assert f"ReservationName=window-{window.id}" in shown
        assert "Nodes=gpu[04-05]" in shown and "MAINT" in shown
        gpu05 = nodes(lab)["gpu05"]
        assert gpu05["spec"].get("unschedulable") is True
        assert gpu05["metadata"]["annotations"][CORDONED_BY] == f"window-{window.id}"
        assert 'alertname!~"Gpu.*" node=~"gpu04|gpu05"' in silences(bot)
        assert [run["state"] for run in opened.runs] == ["succeeded"]
        # the real Alertmanager: the window's noise is silenced, a GPU fault is not
        assert seen_states(bot, "gpu04", ("GpuXidFallenOffBus", "WindowNoise")) == {
            "GpuXidFallenOffBus": "active", "WindowNoise": "suppressed"}

        windows.cancel(bot, window.id, "alice")  # an open window closes now
        closed = settle(bot, window.id, windows.CLOSED)
        assert closed.state == windows.CLOSED, closed.report
        assert f"window-{window.id}" not in reservations(lab)
        gpu05 = nodes(lab)["gpu05"]
        assert not gpu05["spec"].get("unschedulable")
        assert CORDONED_BY not in (gpu05["metadata"].get("annotations") or {})
        assert 'node=~"gpu04|gpu05"' not in silences(bot)
        assert closed.report is not None and "selftest" in closed.report
        assert audit.verify(bot.db).ok
    finally:
        cleanup(lab, bot, window.id)


def test_gpu_usage_report_on_the_lab(lab: Lab, bot: Service) -> None:
    account = lab["account"]
    # any node: others may be drained
    submitted = lab.run("sbatch", "--parsable", "-o", "/dev/null", "-J", "report-test", "-A",
                        account, "--gres=gpu:2", "--wrap", "sleep 1")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 90
    while f"{account}|COMPLETED" not in lab.run("sacct", "-n", "-X", "-P", "-j", job, "-o",
                                                "account,state", "-S", "now-1hour").stdout:
        assert time.monotonic() < deadline, (
            f"sacct never reported job {job} as completed; squeue says: "
            + lab.run("squeue", "-j", job, "-o", "%i %T %r").stdout)
        time.sleep(0.5)
    summary = report_summary(bot, "gpu-usage-report", {"period": "1d", "idle_for": "1m"})
    assert summary.startswith("GPU usage report, ")
    assert "GPU-hours and queue wait per account (sacct):" in summary
    assert "unknown: Slurm accounting" not in summary
    line = next(line for line in summary.splitlines() if line.strip().startswith(account))
    assert float(line.split()[1]) >= 0.0 and int(line.split()[2]) >= 1  # GPU-hours, jobs
    assert "Allocated but idle GPUs" in summary and "unknown: Prometheus" not in summary
    assert "Nodes drained for more than 1d:" in summary
