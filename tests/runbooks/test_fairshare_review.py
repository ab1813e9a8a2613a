"""fairshare-review against the lab: jobs under two accounts (one in the QOS with a GPU limit)
in the real Slurm accounting, the runbook run end to end, the report names both accounts with
GPU-hours and waits, the QOS limit, the shares and the Kueue ClusterQueue the Kubernetes fake
serves; the PNG chart is written and uploaded once into the thread of the lab's Slack fake.
Also: the documented stop (Slurm answering nothing fails the step; nothing to undo) and a
cancel before it ran."""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slack_sdk import WebClient

from adapters.reports.fairshare import PNG_SIGNATURE
from bot.config import EngineConfig, load_config
from bot.execution.engine import Engine
from bot.service import Service
from bot.store import audit
from bot.surfaces.slack.poster import Poster
from tests.lab.fixture import REPO, Lab

pytestmark = pytest.mark.lab
RUNBOOK = REPO / "runbooks" / "fairshare-review.yaml"


@pytest.fixture(scope="module")
def bot(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    config = load_config(lab.dir / "bot.yaml")
    config = config.model_copy(update={
        "database_url": f"sqlite:///{tmp_path_factory.mktemp('fairshare') / 'bot.db'}",
        "engine": EngineConfig(lease_seconds=10, poll_seconds=0.1),
        "runbook_paths": [RUNBOOK],  # this runbook only: others change while it runs
    })
    yield Service.from_config(config)


def drive(bot: Service, execution_id: int) -> tuple[str, str | None]:
    engine = Engine(bot)
    try:
        ex = engine.drive(execution_id)
    finally:
        engine.close()
    return ex.state, ex.error


def finished_step(bot: Service, execution_id: int) -> dict[str, object]:
    with bot.db.connect() as conn:
        done = [e for e in audit.events(conn, execution_id=execution_id)
                if e["kind"] == "step_finished"]
    assert len(done) == 1, done
    return dict(done[0]["data"])


def lab_files(url: str) -> list[dict[str, Any]]:
    """What the lab's Slack fake received through files_upload_v2 (earlier runs' too)."""
    with urllib.request.urlopen(f"{url}/_lab/files", timeout=10) as answer:
        return list(json.load(answer))


def submit_and_wait(lab: Lab) -> list[str]:
    """Two 1-second jobs per account, each account in its own QOS, all finished in sacct."""
    jobs = []
    for account, qos, gpus in ((lab["account"], lab["qos"], 2),
                               (lab["second_account"], lab["capped_qos"], 1)):
        for _ in range(2):
            done = lab.run("sbatch", "--parsable", "-o", "/dev/null", "-J", "fairshare-test",
                           "-A", account, f"--qos={qos}", f"--gres=gpu:{gpus}", "-t", "1",
                           "--wrap", "sleep 1")
            assert done.returncode == 0, done.stderr
            jobs.append(done.stdout.strip().split(";")[0])
    deadline = time.monotonic() + 60
    while True:
        # asked as the report asks (a time window, not job IDs): on a lab just started, a
        # window query lists finished jobs a moment after a query by ID does
        # one job per line; a state may hold spaces ("CANCELLED by 0", from other tests)
        listed = dict(line.split("|", 1) for line in lab.run(
            "sacct", "-n", "-X", "-P", "--allusers", "-o", "jobid,state",
            "-S", "now-1days", "-E", "now").stdout.splitlines() if "|" in line)
        states = [listed.get(job, "") for job in jobs]
        if all(s == "COMPLETED" for s in states):
            return jobs
        assert time.monotonic() < deadline, (
            f"sacct never reported jobs {jobs} as completed: {states}; squeue says: "
            + lab.run("squeue", "-o", "%i %T %r").stdout)
        time.sleep(0.3)


def test_the_review_names_both_accounts_the_limit_kueue_and_posts_the_chart(
        lab: Lab, bot: Service, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNBOOK_REPORT_DIR", str(tmp_path))
    submit_and_wait(lab)
    execution_id = bot.request("fairshare-review", {"period": "1d"}, "alice")
    assert drive(bot, execution_id) == ("succeeded", None)
    step = finished_step(bot, execution_id)
    summary = str(step["summary"])
    lines = summary.splitlines()
    assert lines[0].startswith("Fair-share review, ") and "(1d), against the 1d before" in lines[0]
    details = step["details"]
    assert isinstance(details, dict)
    rows = {(r["account"], r["qos"]): r for r in details["accounts"]}
    for account, qos in ((lab["account"], lab["qos"]),
                         (lab["second_account"], lab["capped_qos"])):
        # the columns are as wide as the longest account and QOS seen in the period
        row = next((line.split() for line in lines if line.split()[:2] == [account, qos]),
                   None)
        assert row is not None, summary
        assert int(row[5]) >= 2, row  # jobs (1-second jobs: GPU-hours print as 0.00)
        assert rows[(account, qos)]["gpu_hours"] > 0 and rows[(account, qos)]["jobs"] >= 2
        assert any(line.startswith(f"  {n}. {account}: mean ") for n in range(1, 6)
                   for line in lines), summary
    limit = f"  {lab['capped_qos']}: GrpTRES gres/gpu={lab['capped_qos_gpus']}: peak "
    assert any(line.startswith(limit) for line in lines), summary
    assert any(line.startswith(f"  {lab['second_account']}: share ") for line in lines), summary
    assert "  serving-gpus (cohort serving): 10 admitted, 2 pending workloads" in lines
    assert "    nvidia.com/gpu in flavor h100: quota 32, used 20 (62%), reserved 20" in lines
    assert "unknown" not in summary, summary
    chart = Path(details["chart"]["path"])
    png = chart.read_bytes()
    assert chart == tmp_path / f"fairshare-review-{execution_id}.png"
    assert png.startswith(PNG_SIGNATURE)
    assert details["chart"]["sha256"] == hashlib.sha256(png).hexdigest()
    assert f"this period and the one before): {chart}" in summary

    # The channel: the lab's Slack fake gets the PNG once, in the execution's thread.
    slack = lab["slack"]
    tokens = json.loads(Path(slack["tokens_file"]).read_text())
    client = WebClient(token=tokens["bot_token"], base_url=slack["api_url"], timeout=10)
    before = {f["id"] for f in lab_files(slack["url"])}
    poster = Poster(bot, client, slack["channel"], 1.0)
    poster.tick()
    poster.tick()
    files = [f for f in lab_files(slack["url"]) if f["id"] not in before]
    assert len(files) == 1 and files[0]["name"] == chart.name and files[0]["completed"]
    assert files[0]["channel"] == slack["channel"]
    assert files[0]["thread_ts"] and files[0]["sha256"] == hashlib.sha256(png).hexdigest()
    with urllib.request.urlopen(f"{slack['url']}/_lab/files/content?id={files[0]['id']}",
                                timeout=10) as answer:
        assert answer.read() == png


def test_slurm_answering_nothing_stops_the_review(lab: Lab, bot: Service,
                                                   tmp_path: Path) -> None:
    """The documented stop: sacct, sacctmgr and sshare all failing fail the step (it changed
    nothing, so nothing is undone); here the Slurm clients are not where the config says."""
    assert bot.config.slurm is not None
    broken = bot.config.model_copy(update={
        "slurm": bot.config.slurm.model_copy(update={"bin_dir": str(tmp_path)}),
        "database_url": f"sqlite:///{tmp_path / 'bot.db'}"})
    other = Service.from_config(broken)
    execution_id = other.request("fairshare-review", {"period": "1d"}, "alice")
    state, error = drive(other, execution_id)
    assert state == "failed"
    assert error is not None and "could not read anything from Slurm" in error
    assert "sacct not found in " + str(tmp_path) in error


def test_a_cancel_before_it_ran(lab: Lab, bot: Service) -> None:
    execution_id = bot.request("fairshare-review", {}, "alice")
    bot.cancel(execution_id, "alice")
    assert bot.get(execution_id).state == "cancelled"
    with bot.db.connect() as conn:
        kinds = [e["kind"] for e in audit.events(conn, execution_id=execution_id)]
    assert "step_started" not in kinds and any("cancel" in k for k in kinds), kinds
