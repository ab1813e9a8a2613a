"""The shipped drift-report runbook through the bot, over fake sources: the configuration's
pinned drivers reach the action through the ``drivers`` template fact (and its plan), the
report is the step's summary, and /metrics shows the last report's counts."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from prometheus_client import generate_latest

from adapters.reports.drift.report import DriftReportAction
from adapters.reports.drift.sources import DaemonVersions
from bot.config.drivers import DriversConfig
from bot.execution.checks.core import Checks
from bot.runbooks.catalogue import Catalogue
from bot.runbooks.params import Inventory
from bot.runtime import metrics
from bot.service import Service
from bot.store import db
from tests.adapters.test_drift import PINNED, Kubernetes, Prometheus, Reads, fleet
from tests.conftest import lab_config
from tests.runbooks.reporthelp import report_summary

RUNBOOK = Path(__file__).resolve().parents[3] / "runbooks" / "drift-report.yaml"
DRIVERS = {"pools": {"slurm": {"pinned": PINNED, "cuda": ["12.2"]},
                     "kubernetes": {"pinned": PINNED, "cuda": ["12.2"]}}}


def make_bot(tmp_path: Path, sqlite_url: str) -> Service:
    folder = tmp_path / "runbooks"
    folder.mkdir()
    shutil.copy(RUNBOOK, folder / RUNBOOK.name)
    config = lab_config(sqlite_url, folder, drivers=DRIVERS,
                        inventory={"nodes": [f"gpu0{i}" for i in range(1, 8)]})
    action = DriftReportAction(Prometheus(fleet()), Kubernetes(
        {"gpu05": PINNED, "gpu06": "550.54.15", "gpu07": PINNED}), DaemonVersions(Reads()))
    slurm = frozenset({"gpu01", "gpu02", "gpu03", "gpu04"})
    kubernetes = frozenset({"gpu05", "gpu06", "gpu07"})
    return Service(config=config, db=db.connect(config.resolved_database_url()),
                   catalogue=Catalogue([action]), checks=Checks({}, sleep=lambda s: None),
                   inventory=Inventory(nodes=slurm | kubernetes, slurm=slurm,
                                       kubernetes=kubernetes))


def test_the_drivers_fact_is_each_pools_pin_and_floor() -> None:
    facts = DriversConfig.model_validate(
        {"pools": {"slurm": {"pinned": PINNED, "cuda": ["12.2", "11.8"]}}}).template_facts()
    assert facts == {"slurm": {"pinned": PINNED, "floor": "535.54.03", "cuda": "12.2"},
                     "kubernetes": {"pinned": None, "floor": None, "cuda": None}}


def scrape(bot: Service) -> str:
    registry, _ = metrics.registry_for(bot)
    return generate_latest(registry).decode()


def test_the_report_runs_and_metrics_show_its_counts(tmp_path: Path, sqlite_url: str) -> None:
    bot = make_bot(tmp_path, sqlite_url)
    assert "runbook_drift_nodes" not in scrape(bot)  # no report yet: no gauge
    plan = bot.plan("drift-report", {})
    (step,) = plan.steps
    assert step.args["drivers"]["slurm"] == {"pinned": PINNED, "floor": "535.54.03",
                                             "cuda": "12.2"}
    assert step.args["slurm_nodes"] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert step.operations[0] == "slurm pool: pinned driver 535.161.08, floor 535.54.03 (CUDA 12.2)"
    started = time.time()
    summary = report_summary(bot, "drift-report")
    assert "fix: runbook run rollback-driver pool=slurm nodes=gpu02 version=535.161.08" in summary
    text = scrape(bot)
    assert 'runbook_drift_nodes{kind="driver_floor",pool="slurm"} 1.0' in text
    assert 'runbook_drift_nodes{kind="driver_pinned",pool="kubernetes"} 1.0' in text
    assert 'runbook_drift_nodes{kind="vbios",pool="slurm"} 1.0' in text
    assert 'runbook_drift_nodes{kind="slurmd",pool="slurm"} 1.0' in text
    assert 'runbook_drift_nodes{kind="unknown",pool="kubernetes"} 0.0' in text
    assert 'runbook_drift_nodes_checked{pool="slurm"} 4.0' in text
    assert 'runbook_drift_source_up{source="prometheus"} 1.0' in text
    stamp = next(line for line in text.splitlines()
                 if line.startswith("runbook_drift_report_timestamp_seconds "))
    assert started <= float(stamp.split()[1]) <= time.time()
