"""What fair-share review reads from Slurm: sacct jobs, sshare shares, sacctmgr QOS limits.

Parsers of the ``--parsable2`` text of 22.05 (and 24.11) and the sums over a period: GPU-hours
(AllocTRES gres/gpu times the part of the run inside the period), jobs, queue wait (Start -
Submit), peak GPUs at once per QOS. ``CliFairshareSource`` runs the clients through the CLI
backend; nothing here changes Slurm.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from adapters.slurm.transports.cli import CliBackend

SACCT_FIELDS = ("JobID", "Account", "QOS", "User", "Submit", "Start", "End", "AllocTRES",
                "ReqTRES", "State")
SSHARE_FIELDS = ("Account", "User", "RawShares", "NormShares", "RawUsage", "EffectvUsage",
                 "FairShare")
QOS_FIELDS = ("Name", "Priority", "GrpTRES", "MaxTRESPU")
_GPU_TRES = re.compile(r"(?:^|,)gres/gpu=(\d+)")  # the untyped total (24.11 adds gres/gpu:h100=)
_NO_TIME = {"", "Unknown", "None", "N/A"}


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    account: str
    qos: str
    user: str
    submit: float | None  # epoch seconds
    start: float | None  # None: not started (pending)
    end: float | None  # None: still running (or never ran)
    gpus: int  # allocated; for a pending job the GPUs it asks for
    state: str


@dataclass
class Usage:
    """One account (and QOS, or every QOS) over one period."""

    account: str
    qos: str = ""
    gpu_hours: float = 0.0
    jobs: int = 0
    waits: list[float] = field(default_factory=list)  # Start - Submit of jobs started inside
    pending: int = 0  # jobs submitted before the end and not started by then
    pending_wait: float = 0.0  # the longest wait so far of those

    @property
    def mean_wait(self) -> float:
        return sum(self.waits) / len(self.waits) if self.waits else 0.0

    @property
    def max_wait(self) -> float:
        return max([*self.waits, self.pending_wait], default=0.0)


@dataclass(frozen=True)
class Share:
    account: str
    raw_shares: str  # a number or "parent"
    norm_shares: float | None
    raw_usage: float | None
    effective_usage: float | None
    fairshare: float | None


@dataclass(frozen=True)
class Qos:
    name: str
    priority: int
    grp_tres: dict[str, str]
    max_tres_per_user: dict[str, str]

    @property
    def gpu_limit(self) -> int | None:
        value = self.grp_tres.get("gres/gpu")
        return int(value) if value is not None and value.isdigit() else None


class FairshareSource(Protocol):
    """The three texts the review reads; each raises ActionError when its client fails."""

    def sacct(self, start: datetime, end: datetime) -> str: ...

    def sshare(self) -> str: ...

    def qos(self) -> str: ...


class CliFairshareSource:
    """sacct, sshare and sacctmgr through the CLI backend (its environment, timeout, errors)."""

    def __init__(self, cli: CliBackend) -> None:
        self.cli = cli

    @staticmethod
    def sacct_argv(start: datetime, end: datetime) -> list[str]:
        fmt = "%Y-%m-%dT%H:%M:%S"  # Slurm reads a time without a zone as local time
        return ["sacct", "--noheader", "--parsable2", "--allusers", "-X",
                "-S", start.astimezone().strftime(fmt), "-E", end.astimezone().strftime(fmt),
                "--format=" + ",".join(SACCT_FIELDS)]

    def sacct(self, start: datetime, end: datetime) -> str:
        return self.cli.run(self.sacct_argv(start, end)).stdout

    def sshare(self) -> str:
        return self.cli.run(["sshare", "--noheader", "--parsable2", "--all",
                             "--format=" + ",".join(SSHARE_FIELDS)]).stdout

    def qos(self) -> str:
        return self.cli.run(["sacctmgr", "--noheader", "--parsable2", "show", "qos",
                             "format=" + ",".join(QOS_FIELDS)]).stdout


# --- parsing -------------------------------------------------------------------------


def _epoch(value: str) -> float | None:
    value = value.strip()
    if value in _NO_TIME:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()  # naive: local time, as Slurm prints
    except ValueError:
        return None


def gpus_of(tres: str) -> int:
    return sum(int(n) for n in _GPU_TRES.findall(tres or ""))


def parse_sacct(text: str) -> list[JobRecord]:
    """``sacct --noheader --parsable2 -X --format=<SACCT_FIELDS>`` lines as job records."""
    jobs = []
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < len(SACCT_FIELDS) or not cells[0].strip():
            continue
        job_id, account, qos, user, submit, start, end, alloc, req, state = cells[:10]
        begun = _epoch(start)
        gpus = gpus_of(alloc) if begun is not None else gpus_of(req)
        jobs.append(JobRecord(job_id, account.strip(), qos.strip(), user.strip(),
                              _epoch(submit), begun, _epoch(end), gpus,
                              state.split()[0] if state.strip() else ""))
    return jobs


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def parse_sshare(text: str) -> list[Share]:
    """The account rows (no user) of ``sshare --parsable2 --all --format=<SSHARE_FIELDS>``;
    the account names lose the indentation that shows the tree."""
    shares = []
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < len(SSHARE_FIELDS) or cells[1].strip() or not cells[0].strip():
            continue
        account, _, raw, norm, usage, effective, fairshare = cells[:7]
        shares.append(Share(account.strip(), raw.strip(), _number(norm), _number(usage),
                            _number(effective), _number(fairshare)))
    return shares


def _tres(value: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in value.split(",") if "=" in item)


def parse_qos(text: str) -> list[Qos]:
    """``sacctmgr --noheader --parsable2 show qos format=<QOS_FIELDS>`` lines."""
    found = []
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < len(QOS_FIELDS) or not cells[0].strip():
            continue
        name, priority, grp, per_user = cells[:4]
        found.append(Qos(name.strip(), int(priority) if priority.strip().isdigit() else 0,
                         _tres(grp), _tres(per_user)))
    return found


# --- sums over a period ------------------------------------------------------------------


def _overlap(job: JobRecord, start: float, end: float) -> float:
    if job.start is None:
        return 0.0
    return max(0.0, min(job.end if job.end is not None else end, end) - max(job.start, start))


def usage(jobs: Iterable[JobRecord], start: float, end: float,
          by_qos: bool = False) -> dict[tuple[str, str], Usage]:
    """Per (account, QOS) — or (account, "") — what jobs did inside [start, end)."""
    found: dict[tuple[str, str], Usage] = {}
    for job in jobs:
        submitted = job.submit if job.submit is not None else job.start
        if submitted is None or submitted >= end:
            continue
        ran = _overlap(job, start, end)
        started_inside = job.start is not None and start <= job.start < end
        waiting = (job.start is None or job.start >= end) and job.state != "CANCELLED"
        if not (ran > 0 or started_inside or (waiting and (job.end is None or job.end > start))):
            continue
        key = (job.account, job.qos if by_qos else "")
        item = found.setdefault(key, Usage(*key))
        item.jobs += 1
        item.gpu_hours += job.gpus * ran / 3600
        if started_inside and job.start is not None:
            item.waits.append(max(0.0, job.start - submitted))
        elif waiting:
            item.pending += 1
            item.pending_wait = max(item.pending_wait, end - submitted)
    return found


def peak_gpus(jobs: Iterable[JobRecord], start: float, end: float) -> dict[str, int]:
    """Per QOS, the most GPUs its running jobs held at once inside [start, end)."""
    events: dict[str, list[tuple[float, int]]] = {}
    for job in jobs:
        if job.gpus and _overlap(job, start, end) > 0 and job.start is not None:
            begin = max(job.start, start)
            finish = min(job.end if job.end is not None else end, end)
            events.setdefault(job.qos, []).extend([(begin, job.gpus), (finish, -job.gpus)])
    peaks = {}
    for qos, items in events.items():
        held = best = 0
        for _, delta in sorted(items, key=lambda e: (e[0], e[1])):  # ends before starts
            held += delta
            best = max(best, held)
        peaks[qos] = best
    return peaks


def trend(now: float, before: float) -> str:
    """The change from the period before, as people read it: +20%, -50%, new, gone, =."""
    if before <= 0:
        return "new" if now > 0 else "="
    if now <= 0:
        return "gone"
    change = (now - before) / before * 100
    return "=" if abs(change) < 0.5 else f"{change:+.0f}%"


__all__ = ["CliFairshareSource", "FairshareSource", "JobRecord", "Qos", "Share", "Usage",
           "parse_qos", "parse_sacct", "parse_sshare", "peak_gpus", "trend", "usage"]
