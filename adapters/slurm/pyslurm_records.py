"""pyslurm 25.11's objects turned into the adapter's records (and scontrol's words into
pyslurm's), and pyslurm's errors into ``SlurmError``.

Pure functions of pyslurm objects (``Node``, ``Job``, ``Reservation``, ``db.Job``, ``RPCError``):
nothing here talks to slurmctld or slurmdbd.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from adapters.slurm import parsing
from adapters.slurm.backend import Job, NodeInfo, Reservation, SlurmctldUnreachable, SlurmError

# scontrol's reservation flag words -> the members of pyslurm.ReservationFlags
RESERVATION_FLAGS = {
    "MAINT": "MAINTENANCE",
    "MAGNETIC": "MAGNETIC",
    "FLEX": "FLEX",
    "IGNORE_JOBS": "IGNORE_RUNNING_JOBS",
    "ANY_NODES": "ANY_NODES",
    "STATIC_ALLOC": "STATIC_NODES",
    "PART_NODES": "PARTITION_NODES_ONLY",
    "USER_DELETE": "USER_DELETION",
    "PURGE_COMP": "PURGE",
    "SPEC_NODES": "SPECIFIC_NODES",
    "NO_HOLD_JOBS_AFTER": "NO_JOB_HOLD_AFTER_END",
    "OVERLAP": "OVERLAP",
}
_FLAG_WORDS = {member: word for word, member in RESERVATION_FLAGS.items()}
# pyslurm sets these through Reservation.reoccurrence (pyslurm.ReservationReoccurrence)
REOCCURRENCES = frozenset({"HOURLY", "DAILY", "WEEKLY", "WEEKDAY", "WEEKEND"})

# slurm_errno.h: SLURMCTLD_COMMUNICATIONS_{CONNECTION,SEND,RECEIVE,SHUTDOWN}_ERROR, _BACKOFF
UNREACHABLE_ERRNOS = range(1800, 1805)
PROTOCOL_VERSION_ERRNO = 1005  # SLURM_PROTOCOL_VERSION_ERROR
DATABASE_ERRNOS = range(7000, 7100)  # ESLURM_DB_CONNECTION, ...
_NOW = re.compile(r"^now(?:\+(\d+)(seconds|minutes|hours|days)?)?$")
_UNIT_SECONDS = {"seconds": 1, "minutes": 60, "hours": 3600, "days": 86400}


def release(text: str) -> tuple[int, int] | None:
    """``"25.11.2"`` -> (25, 11); None when there is no version in it."""
    try:
        return parsing.parse_version(text)
    except ValueError:
        return None


def _count(value: Any) -> int:
    """A gres count as pyslurm gives it: 8, "8", {"count": 8, "indexes": "0-7"} (node gres)
    or a pyslurm.db.GPU (db.Job.gpus), whose count is an attribute."""
    if isinstance(value, Mapping):
        value = value.get("count")
    elif not isinstance(value, str | int):
        value = getattr(value, "count", value)
    return parsing.integer(value) or 0


def gres_text(gres: Any) -> str:
    """Node.configured_gres ({"gpu:h100": 8}) as Slurm prints it ("gpu:h100:8")."""
    if not isinstance(gres, Mapping):
        return parsing.text(gres)
    return ",".join(f"{name}:{_count(value)}" for name, value in gres.items())


def allocated_gpus(gres: Any) -> int:
    """GPUs in Node.allocated_gres or db.Job.gpus. Both come from TRES, which names the GPUs
    twice (gres/gpu=2 and gres/gpu:h100=2): the untyped total counts, else the typed ones."""
    if not isinstance(gres, Mapping):
        return 0
    if "gpu" in gres:
        return _count(gres["gpu"])
    return sum(_count(value) for name, value in gres.items() if str(name).startswith("gpu:"))


def node_info(node: Any) -> NodeInfo:
    """A pyslurm.Node (state "IDLE+DRAIN", reason, configured/allocated gres, features)."""
    info = parsing.parse_node({
        "name": node.name,
        "state": parsing.states(node.state or ""),
        "reason": node.reason,
        "reason_set_by_user": node.reason_user,
        "reason_changed_at": node.reason_time,
        "gres": gres_text(node.configured_gres),
        "features": ",".join(node.available_features or []),
        "boot_time": node.boot_time,
    })
    return replace(info, gpus_used=allocated_gpus(node.allocated_gres))


def job_record(job: Any) -> Job:
    """A pyslurm.Job: allocated_nodes (running) or required_nodes (pending) as hostlists."""
    return parsing.parse_job({
        "job_id": job.id,
        "name": job.name,
        "user_name": job.user_name,
        "account": job.account,
        "job_state": job.state,
        "nodes": job.allocated_nodes,
        "required_nodes": job.required_nodes,
    })


def slurm_time(epoch: int | None) -> str:
    """A unix time as scontrol prints it: local time, ISO 8601 without a zone."""
    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%dT%H:%M:%S") if epoch else ""


def reservation_flag_words(reservation: Any) -> list[str]:
    """Reservation.flags (a ReservationFlags) and .reoccurrence in scontrol's words."""
    flags = reservation.flags
    words = [_FLAG_WORDS.get(str(member.name), str(member.name))
             for member in type(flags) if member.value and member in flags]
    reoccurrence = str(getattr(reservation.reoccurrence, "value", reservation.reoccurrence))
    if reoccurrence in REOCCURRENCES:
        words.append(reoccurrence)
    return words


def reservation_record(reservation: Any) -> Reservation:
    return Reservation(
        name=reservation.name,
        nodes=parsing.hostlist_or_empty(reservation.nodes),
        start=slurm_time(reservation.start_time),
        end=slurm_time(reservation.end_time),
        flags=frozenset(reservation_flag_words(reservation)),
        users=list(reservation.users or []),
        state="ACTIVE" if reservation.is_active else "INACTIVE",
    )


def reservation_settings(flags: list[str]) -> tuple[list[str], str | None]:
    """scontrol flag words -> (ReservationFlags member names, reoccurrence or None).

    Unknown words are refused here: ReservationFlags.from_list would drop them silently."""
    members, reoccurrences, unknown = [], [], []
    for word in (flag.upper() for flag in flags):
        if word in REOCCURRENCES:
            reoccurrences.append(word)
        elif word in RESERVATION_FLAGS:
            members.append(RESERVATION_FLAGS[word])
        else:
            unknown.append(word)
    if unknown or len(reoccurrences) > 1:
        known = ", ".join(sorted([*RESERVATION_FLAGS, *REOCCURRENCES]))
        problem = (f"reservation flag {', '.join(unknown)} has no pyslurm equivalent" if unknown
                   else f"a reservation has one reoccurrence, not {', '.join(reoccurrences)}")
        raise SlurmError(f"{problem} (the pyslurm backend knows {known}): "
                         "set slurm.backend: cli for the others")
    return members, reoccurrences[0] if reoccurrences else None


def start_epoch(start: str, now: float) -> int:
    """scontrol's StartTime (``now``, ``now+N[seconds|minutes|hours|days]``, a local date)."""
    found = _NOW.match(start)
    if found:
        return int(now) + int(found.group(1) or 0) * _UNIT_SECONDS[found.group(2) or "seconds"]
    try:
        return int(datetime.fromisoformat(start).timestamp())
    except ValueError as exc:
        raise SlurmError(f"reservation start {start!r} is neither now[+N(seconds|minutes|hours|"
                         "days)] nor a local date like 2026-01-31T08:00") from exc


def accounting_data(jobs: Iterable[Any]) -> dict[str, Any]:
    """db.Jobs in the shape of ``sacct --json``, for parsing.parse_accounting."""
    return {"jobs": [{
        "account": job.account,
        "time": {"start": job.start_time or 0, "end": job.end_time or 0,
                 "eligible": job.eligible_time or 0, "submission": job.submit_time or 0},
        "tres": {"allocated": [{"type": "gres", "name": "gpu",
                                "count": allocated_gpus(job.gpus)}]},
    } for job in jobs]}


def rpc_error(exc: BaseException, call: str) -> SlurmError:
    """pyslurm.RPCError (errno, msg) or a ValueError pyslurm raised, in the adapter's words."""
    errno = getattr(exc, "errno", None)
    words = str(exc) or type(exc).__name__
    detail = f"{words} (errno {errno})" if isinstance(errno, int) else words
    if errno in UNREACHABLE_ERRNOS or "Unable to contact slurm controller" in words:
        return SlurmctldUnreachable(
            f"slurmctld is not answering (pyslurm {call}: {detail}): check that slurmctld "
            "runs and that slurm.slurm_conf (or SLURM_CONF) points at this cluster's slurm.conf")
    if errno == PROTOCOL_VERSION_ERRNO or "Protocol version" in words:
        return SlurmError(
            f"pyslurm {call}: libslurm and slurmctld are different Slurm releases ({detail}): "
            "install the pyslurm built for the cluster's Slurm, or set slurm.backend: cli")
    if errno in DATABASE_ERRNOS or "slurmdbd" in words:
        return SlurmError(f"slurmdbd is not answering (pyslurm {call}: {detail}): check that "
                          "slurmdbd and its database run")
    if isinstance(exc, ValueError):
        return SlurmError(f"pyslurm refused {call}: {words}")
    return SlurmError(f"pyslurm {call} failed: {detail}")
