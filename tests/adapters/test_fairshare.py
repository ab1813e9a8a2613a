"""``report.fairshare`` over canned Slurm 22.05 text (sacct/sshare/sacctmgr --parsable2) and the
fake Kubernetes backend: GPU-hours clipped to the period, queue waits, pending jobs, the trend,
the accounts that wait most, QOS GPU limits against the peak, shares, Kueue present and
absent, the PNG chart, and "unknown" (never a failure) for a part whose source fails."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest

from adapters.actions import ActionContext, ActionError
from adapters.kubernetes.backend import KubernetesUnavailable
from adapters.kubernetes.fake import FakeKubernetes
from adapters.reports.fairshare import (
    KUEUE,
    PNG_SIGNATURE,
    FairshareArguments,
    FairshareReviewAction,
    kueue_lines,
)
from adapters.slurm import fairshare as slurm
from adapters.slurm.backend import SlurmError
from adapters.slurm.config import SlurmConfig
from adapters.slurm.transports.cli import CliBackend

DAY = 86400.0
NOW = datetime(2026, 3, 31, 8, 0, tzinfo=UTC).timestamp()


def local(epoch: float) -> str:
    """A time as sacct prints it (ISO 8601, local time, no zone)."""
    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%dT%H:%M:%S")


def job(job_id: int, account: str, qos: str, submit: float, start: float | None,
        end: float | None, gpus: int, state: str = "COMPLETED") -> str:
    alloc = f"billing={gpus},cpu={gpus},gres/gpu={gpus},mem=1000M,node=1" if start else ""
    return "|".join([str(job_id), account, qos, "root", local(submit),
                     local(start) if start else "Unknown", local(end) if end else "Unknown",
                     alloc, f"billing=1,cpu=1,gres/gpu={gpus},node=1", state])


# Two periods of 10 days; "now" is NOW. ml-research: 2 GPUs for 5h now (after a 10-minute
# wait), 4 GPUs x 1h before; cv-research: 8 GPUs x 1h now after a 2h wait, one job pending
# for 3h, nothing before. One job straddles the start of the period: 1h before, 1h inside.
START = NOW - 10 * DAY
SACCT = "\n".join([
    job(101, "ml-research", "gpu-normal", START + DAY, START + DAY + 600,
        START + DAY + 600 + 5 * 3600, 2),
    job(102, "cv-research", "gpu-capped", START + 2 * DAY, START + 2 * DAY + 7200,
        START + 2 * DAY + 10800, 8),
    job(103, "cv-research", "gpu-capped", NOW - 3 * 3600, None, None, 4, "PENDING"),
    job(90, "ml-research", "gpu-normal", START - 3 * DAY, START - 3 * DAY + 60,
        START - 3 * DAY + 3660, 4),
    job(91, "ml-research", "normal", START - 3600, START - 3600, START + 3600, 1, "TIMEOUT"),
    "",
])
SSHARE = """\
root|||0.000000|1200|1.000000|
 root|root|1|0.333333|0|0.000000|1.000000
 cv-research||1|0.333333|800|0.666667|
  cv-research|root|1|1.000000|800|1.000000|0.200000
 ml-research||1|0.333333|400|0.333333|
  ml-research|root|1|1.000000|400|1.000000|0.600000
"""
QOS = """\
normal|0||
gpu-normal|10||
gpu-capped|5|gres/gpu=16|gres/gpu=8
"""


class Source:
    """The three texts, or a failure like the real client's, per part."""

    def __init__(self, sacct: str = SACCT, sshare: str = SSHARE, qos: str = QOS,
                 fail: frozenset[str] = frozenset()) -> None:
        self.texts = {"sacct": sacct, "sshare": sshare, "qos": qos}
        self.fail = fail
        self.asked: list[tuple[datetime, datetime]] = []

    def _text(self, part: str) -> str:
        if part in self.fail:
            raise SlurmError(f"slurmdbd is not answering ({part})", [part])
        return self.texts[part]

    def sacct(self, start: datetime, end: datetime) -> str:
        self.asked.append((start, end))
        return self._text("sacct")

    def sshare(self) -> str:
        return self._text("sshare")

    def qos(self) -> str:
        return self._text("qos")


def cluster_queue(name: str = "serving-gpus", quota: str = "32", used: str = "20") -> dict[
        str, object]:
    usage = [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": used}]}]
    return {"metadata": {"name": name},
            "spec": {"cohort": "serving", "resourceGroups": [{
                "coveredResources": ["nvidia.com/gpu", "cpu"], "flavors": [{
                    "name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": quota},
                                                  {"name": "cpu", "nominalQuota": "500m"}]}]}]},
            "status": {"admittedWorkloads": 10, "pendingWorkloads": 2, "flavorsUsage": usage,
                       "flavorsReservation": usage}}


def kube(*queues: Mapping[str, object], installed: bool = True) -> FakeKubernetes:
    fake = FakeKubernetes([])
    if installed:
        fake.served.add(KUEUE)
    for queue in queues:
        name = str(queue["metadata"]["name"])  # type: ignore[index]
        fake.objects[(*KUEUE, None, name)] = dict(queue)
    return fake


def review(tmp_path: Path, source: Source | None = None, kubernetes: FakeKubernetes | None = None,
           **args: object) -> tuple[str, dict[str, object]]:
    action = FairshareReviewAction(source or Source(), kubernetes, clock=lambda: NOW)
    arguments = FairshareArguments(period=10 * DAY, chart_dir=str(tmp_path), **args)
    ctx = ActionContext(execution_id=7, step_id="review", deadline=time.monotonic() + 60)
    result = action.run(arguments, ctx)
    assert result.changed is False
    return result.summary, dict(result.details)


# --- parsing ----------------------------------------------------------------------------


def test_sacct_lines_become_jobs_with_allocated_or_requested_gpus() -> None:
    jobs = {j.job_id: j for j in slurm.parse_sacct(SACCT)}
    assert jobs["101"].gpus == 2 and jobs["101"].account == "ml-research"
    assert jobs["101"].start == pytest.approx(START + DAY + 600)
    assert jobs["103"].start is None and jobs["103"].end is None
    assert jobs["103"].gpus == 4  # pending: what it asks for (ReqTRES)
    assert jobs["91"].state == "TIMEOUT"
    # 24.11 adds the typed count beside the total: only the total counts
    assert slurm.gpus_of("cpu=2,gres/gpu:h100=2,gres/gpu=2,node=1") == 2
    assert slurm.parse_sacct("garbage\n|||\n") == []


def test_sshare_keeps_account_rows_without_their_indentation() -> None:
    shares = {s.account: s for s in slurm.parse_sshare(SSHARE)}
    assert set(shares) == {"root", "cv-research", "ml-research"}
    assert shares["cv-research"].norm_shares == pytest.approx(0.333333)
    assert shares["cv-research"].effective_usage == pytest.approx(0.666667)
    assert shares["cv-research"].fairshare is None  # 22.05 prints it on the user rows only


def test_qos_lines_give_the_gpu_limit() -> None:
    found = {q.name: q for q in slurm.parse_qos(QOS)}
    assert found["gpu-capped"].gpu_limit == 16
    assert found["gpu-capped"].max_tres_per_user == {"gres/gpu": "8"}
    assert found["normal"].gpu_limit is None and found["gpu-normal"].priority == 10


def test_cli_source_runs_the_clients_parsable_without_a_shell() -> None:
    seen: list[list[str]] = []

    def runner(argv: list[str], *, env: Mapping[str, str],
               timeout: float) -> subprocess.CompletedProcess[str]:
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, "out", "")

    source = slurm.CliFairshareSource(CliBackend(SlurmConfig(), runner=runner))
    assert source.sacct(datetime.fromtimestamp(START, UTC), datetime.fromtimestamp(NOW, UTC)) \
        == "out"
    source.sshare()
    source.qos()
    assert seen[0][:5] == ["sacct", "--noheader", "--parsable2", "--allusers", "-X"]
    assert seen[0][-1] == "--format=" + ",".join(slurm.SACCT_FIELDS)
    assert seen[0][seen[0].index("-S") + 1] == local(START)
    assert seen[1][0] == "sshare" and "--all" in seen[1]
    assert seen[2][:5] == ["sacctmgr", "--noheader", "--parsable2", "show", "qos"]


# --- sums -------------------------------------------------------------------------------


def test_gpu_hours_are_clipped_to_the_period_and_waits_counted_once() -> None:
    jobs = slurm.parse_sacct(SACCT)
    now = slurm.usage(jobs, START, NOW)
    before = slurm.usage(jobs, START - 10 * DAY, START)
    assert now[("ml-research", "")].gpu_hours == pytest.approx(2 * 5 + 1 * 1)
    assert before[("ml-research", "")].gpu_hours == pytest.approx(4 * 1 + 1 * 1)
    assert now[("ml-research", "")].waits == [600.0]  # 91 started before the period
    cv = now[("cv-research", "")]
    assert cv.gpu_hours == pytest.approx(8.0) and cv.waits == [7200.0]
    assert cv.pending == 1 and cv.pending_wait == pytest.approx(3 * 3600)
    assert cv.max_wait == pytest.approx(3 * 3600) and cv.jobs == 2  # the pending one
    assert ("cv-research", "") not in before
    by_qos = slurm.usage(jobs, START, NOW, by_qos=True)
    assert set(by_qos) == {("ml-research", "gpu-normal"), ("ml-research", "normal"),
                           ("cv-research", "gpu-capped")}


def test_peak_gpus_counts_overlapping_jobs_and_not_touching_ones() -> None:
    jobs = slurm.parse_sacct("\n".join([
        job(1, "a", "q", 0, 1000, 2000, 4), job(2, "a", "q", 0, 1500, 2500, 4),
        job(3, "a", "q", 0, 2500, 3000, 8)]))  # starts as 2 ends: never 16 at once
    assert slurm.peak_gpus(jobs, 0, 4000) == {"q": 8}
    assert slurm.peak_gpus(jobs, 0, 1200) == {"q": 4}


def test_the_trend_in_words() -> None:
    assert slurm.trend(12, 10) == "+20%"
    assert slurm.trend(5, 10) == "-50%"
    assert slurm.trend(3, 0) == "new" and slurm.trend(0, 3) == "gone"
    assert slurm.trend(0, 0) == "=" and slurm.trend(10.01, 10) == "="


# --- the report -------------------------------------------------------------------------


def test_the_report_names_usage_trend_waiters_limits_shares_and_kueue(tmp_path: Path) -> None:
    summary, details = review(tmp_path, kubernetes=kube(cluster_queue()))
    lines = summary.splitlines()
    assert lines[0].startswith("Fair-share review, 2026-03-21 08:00 to 2026-03-31 08:00 UTC "
                               "(10d), against the 10d before")
    cv = next(line.split() for line in lines if line.startswith("  cv-research  gpu-capped"))
    assert cv[2:5] == ["8.00", "0.00", "new"] and cv[5] == "2" and cv[-1] == "1"
    ml = next(line.split() for line in lines if line.startswith("  ml-research  gpu-normal"))
    assert ml[2:5] == ["10.00", "4.00", "+150%"]
    assert "  total: 19.00 GPU-hours, 5.00 the period before (+280%)" in lines
    waiters = lines.index("Accounts that wait most (mean queue wait of jobs started in the "
                          "period):")
    assert lines[waiters + 1] == ("  1. cv-research: mean 2h, max 3h over 1 started jobs, "
                                  "1 still pending")
    assert lines[waiters + 2].startswith("  2. ml-research: mean 10m, max 10m over 1 started jobs")
    assert ("  gpu-capped: GrpTRES gres/gpu=16: peak 8 GPUs at once (50% of it), 8.00 of 3840 "
            "possible GPU-hours (0.2%)") in lines
    assert "  normal: no GPU limit (peak 1 GPUs at once, 1.00 GPU-hours)" in lines
    assert "  cv-research: share 33.3% (raw 1), usage 66.7%: over its share" in lines
    shares = slurm.parse_sshare(SSHARE.replace(" ml-research||1|0.333333|400|0.333333|",
                                               " ml-research||1|0.333333|400|0.333333|0.6"))
    assert {s.account: s.fairshare for s in shares}["ml-research"] == pytest.approx(0.6)
    assert "  serving-gpus (cohort serving): 10 admitted, 2 pending workloads" in lines
    assert ("    nvidia.com/gpu in flavor h100: quota 32, used 20 (62%), reserved 20"
            in lines)
    assert details["problems"] == [] and details["total_gpu_hours"] == 19.0
    assert details["kueue"] == [{"name": "serving-gpus", "cohort": "serving", "pending": 2,
                                 "admitted": 10, "resources": [
                                     {"flavor": "h100", "resource": "nvidia.com/gpu",
                                      "quota": 32.0, "used": 20.0, "reserved": 20.0},
                                     {"flavor": "h100", "resource": "cpu", "quota": 0.5,
                                      "used": 0.0, "reserved": 0.0}]}]


def test_one_sacct_covers_both_periods(tmp_path: Path) -> None:
    source = Source()
    review(tmp_path, source)
    assert source.asked == [(datetime.fromtimestamp(NOW - 20 * DAY, UTC),
                             datetime.fromtimestamp(NOW, UTC))]


def test_the_chart_is_a_png_whose_path_and_hash_are_kept(tmp_path: Path) -> None:
    summary, details = review(tmp_path)
    chart = details["chart"]
    assert isinstance(chart, dict)
    path = Path(chart["path"])
    assert path == tmp_path / "fairshare-review-7.png"
    png = path.read_bytes()
    assert png.startswith(PNG_SIGNATURE) and len(png) > 1000
    assert chart["sha256"] == hashlib.sha256(png).hexdigest()
    assert summary.endswith(f"this period and the one before): {path}")


def test_kueue_not_installed_is_said_not_failed(tmp_path: Path) -> None:
    summary, details = review(tmp_path, kubernetes=kube(installed=False))
    assert "  Kueue is not installed (the API server serves no clusterqueues.kueue.x-k8s.io)" \
        in summary.splitlines()
    assert details["kueue"] == "not installed" and details["problems"] == []


def test_kueue_installed_without_queues_and_without_a_kubernetes_section(tmp_path: Path) -> None:
    summary, _ = review(tmp_path, kubernetes=kube())
    assert "  no ClusterQueue" in summary.splitlines()
    summary, details = review(tmp_path)
    assert "  unknown: no kubernetes section is configured" in summary.splitlines()
    assert details["kueue"] is None


def test_an_unanswering_kubernetes_api_is_unknown(tmp_path: Path) -> None:
    class Down(FakeKubernetes):
        def list_custom_objects(self, group: str, version: str,
                                plural: str) -> list[dict[str, object]]:
            raise KubernetesUnavailable("Kubernetes API not answering at https://x")

    summary, details = review(tmp_path, kubernetes=Down([]))
    assert "  unknown: the Kubernetes API did not answer (Kubernetes API not answering at " \
           "https://x)" in summary.splitlines()
    assert details["problems"] == ["kueue: Kubernetes API not answering at https://x"]


def test_a_part_whose_source_fails_says_unknown(tmp_path: Path) -> None:
    summary, details = review(tmp_path, Source(fail=frozenset({"sshare", "sacct"})))
    lines = summary.splitlines()
    assert "  unknown: Slurm accounting did not answer (slurmdbd is not answering (sacct))" \
        in lines
    assert "  unknown: sshare did not answer (slurmdbd is not answering (sshare))" in lines
    assert "Chart: none (Slurm accounting did not answer)" in lines
    assert any(line.startswith("  gpu-capped: GrpTRES gres/gpu=16: peak 0") for line in lines)
    problems = details["problems"]
    assert isinstance(problems, list)
    assert [p.split(":")[0] for p in problems] == ["accounting", "shares"]


def test_nothing_answering_fails_the_step(tmp_path: Path) -> None:
    with pytest.raises(ActionError, match="could not read anything from Slurm"):
        review(tmp_path, Source(fail=frozenset({"sshare", "sacct", "qos"})))


def test_no_jobs_in_either_period(tmp_path: Path) -> None:
    summary, details = review(tmp_path, Source(sacct=""))
    assert "  no jobs in either period" in summary.splitlines()
    assert "  none: no job started or waited in the period" in summary.splitlines()
    assert Path(details["chart"]["path"]).read_bytes().startswith(PNG_SIGNATURE)  # type: ignore[index]


def test_the_plan_reads_only() -> None:
    action = FairshareReviewAction(Source(), kube())
    lines = action.plan(FairshareArguments(chart_dir="/srv/reports"))
    assert lines[0].startswith("sacct --parsable2 --allusers -X over the last 30d and the 30d")
    assert "chart: a PNG of GPU-hours per account under /srv/reports" in lines
    assert lines[-1] == "reads only; changes nothing"
    assert "Kueue: skipped" in "\n".join(FairshareReviewAction(Source()).plan(
        FairshareArguments()))


def test_kueue_quantities() -> None:
    lines, row = kueue_lines(cluster_queue(quota="1k", used="250"))
    assert lines[1] == "    nvidia.com/gpu in flavor h100: quota 1k, used 250 (25%), reserved 250"
    assert row["resources"][1]["quota"] == 0.5


def test_the_chart_module_does_not_import_matplotlib_at_import() -> None:
    code = ("import sys, adapters.reports.fairshare, adapters.registry; "
            "adapters.registry.registered(); print('matplotlib' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).parents[2])
    assert done.stdout.strip() == "False"
