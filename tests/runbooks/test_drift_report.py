"""drift-report against the lab: one Slurm node's driver below the CUDA floor and another
node's VBIOS changed (`lab fault`) reach the report through the DCGM simulator and the real
Prometheus, each with its fix, and /metrics shows the counts; the Kubernetes API failing is
said in the report, which still judges the rest; a cancelled request reports nothing."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest

from adapters.reports.drift.sources import dcgm_gpus, labels_query
from bot.config import EngineConfig, load_config
from bot.execution.engine import Engine
from bot.runtime import metrics
from bot.service import Service
from bot.store import audit
from tests.lab.fixture import Lab
from tests.runbooks.reporthelp import report_summary

pytestmark = pytest.mark.lab

OLD_DRIVER, ODD_VBIOS = "530.30.02", "96.00.99.00.01"


@pytest.fixture(scope="module")
def bot(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    config = load_config(lab.dir / "bot.yaml")
    folder = tmp_path_factory.mktemp("drift")
    config = config.model_copy(update={
        "database_url": f"sqlite:///{folder / 'bot.db'}",
        "engine": EngineConfig(lease_seconds=10, poll_seconds=0.1),
    })
    yield Service.from_config(config)


@pytest.fixture
def faults(lab: Lab) -> Iterator[None]:
    """gpu03 on an old driver, gpu02 with another VBIOS; their fault files restored after."""
    files = {name: lab.dir / "faults" / f"{name}.json" for name in ("gpu02", "gpu03")}
    saved = {name: path.read_bytes() if path.exists() else None for name, path in files.items()}
    try:
        lab.lab("fault", "gpu03", f"driver={OLD_DRIVER}")
        lab.lab("fault", "gpu02", f"vbios={ODD_VBIOS}")
        yield
    finally:
        for name, path in files.items():
            if saved[name] is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(saved[name] or b"")


def wait_for_labels(bot: Service, seconds: float = 15) -> None:
    """Until Prometheus has scraped both faults (it scrapes every second in the lab)."""
    prometheus = bot.backends["prometheus"]
    deadline = time.monotonic() + seconds
    while True:
        gpus = dcgm_gpus(prometheus.query(labels_query("DCGM_FI_DEV_GPU_TEMP")))
        drivers = {g.driver for g in gpus.get("gpu03", [])}
        vbios = {g.vbios for g in gpus.get("gpu02", [])}
        if drivers == {OLD_DRIVER} and vbios == {ODD_VBIOS}:
            return
        assert time.monotonic() < deadline, f"Prometheus shows gpu03 {drivers}, gpu02 {vbios}"
        time.sleep(0.3)


def run_report(bot: Service) -> str:
    return report_summary(bot, "drift-report")


def test_the_report_lists_the_drifted_nodes_with_their_fixes(lab: Lab, bot: Service,
                                                             faults: None) -> None:
    wait_for_labels(bot)
    pinned = lab["default_driver_version"]
    summary = run_report(bot)
    lines = summary.splitlines()
    assert f"slurm pool: pinned driver {pinned}; CUDA 12.2 needs 535.54.03 or newer" in lines
    assert "GPU Operator: v23.9.2, ClusterPolicy driver 535.161.08, state ready" in lines
    assert any(re.fullmatch(r"Slurm: slurmctld \d+\.\d+\.\d+", line) for line in lines), summary
    assert (f"    gpu03: driver {OLD_DRIVER} is below 535.54.03, the lowest driver for CUDA "
            f"12.2, pinned {pinned}") in lines
    assert f"      fix: runbook run rollback-driver pool=slurm nodes=gpu03 version={pinned}" \
        in lines
    gpu02 = next(line for line in lines if line.startswith("    gpu02: VBIOS "))
    assert gpu02.startswith(f"    gpu02: VBIOS {ODD_VBIOS} on GPU 0,1,2,3,4,5,6,7; ")
    assert lines[lines.index(gpu02) + 1].startswith("      fix: firmware update: by the vendor")
    kubernetes = summary.split("\nKubernetes pool")[1]
    assert "out of line: none" in kubernetes and "unknown" not in summary
    text = generate_latest(metrics.registry_for(bot)[0]).decode()
    assert 'runbook_drift_nodes{kind="driver_floor",pool="slurm"} 1.0' in text
    assert 'runbook_drift_nodes{kind="vbios",pool="slurm"} 1.0' in text
    assert 'runbook_drift_nodes{kind="driver_pinned",pool="kubernetes"} 0.0' in text
    assert 'runbook_drift_source_up{source="kubernetes"} 1.0' in text
    assert "runbook_drift_report_timestamp_seconds " in text


def test_a_source_that_fails_is_said_and_the_rest_reported(lab: Lab, bot: Service) -> None:
    lab.lab("fault", "kube", "api=500")
    try:
        summary = run_report(bot)
    finally:
        lab.lab("fault", "kube", "api=ok")
    assert "unknown: kubernetes did not answer" in summary
    assert "\nSlurm pool (" in summary and "GPU Operator" not in summary
    text = generate_latest(metrics.registry_for(bot)[0]).decode()
    assert 'runbook_drift_source_up{source="kubernetes"} 0.0' in text


def test_a_cancelled_report_reports_nothing(bot: Service) -> None:
    execution_id = bot.request("drift-report", {}, "alice")
    bot.cancel(execution_id, "alice")
    engine = Engine(bot)
    try:
        ex = engine.drive(execution_id)
    finally:
        engine.close()
    assert ex.state == "cancelled"
    with bot.db.connect() as conn:
        kinds = [e["kind"] for e in audit.events(conn, execution_id=execution_id)]
    assert "step_started" not in kinds and "step_finished" not in kinds
