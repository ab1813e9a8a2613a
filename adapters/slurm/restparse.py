"""slurmrestd's JSON (v0.0.38 to v0.0.45) as the adapter's records; pure functions.

Nodes, jobs and accounting are the shapes ``adapters.slurm.parsing`` already reads (sinfo,
squeue and sacct --json print the same data_parser JSON); reservations, accounts, the diag
statistics and requeue results are read here (also from 23.02+ scontrol, sacctmgr and
sdiag --json, which print the same).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from adapters.slurm import parsing
from adapters.slurm.backend import Reservation


def local_time(value: Any) -> str:
    """Epoch seconds (plain or a {"set", "infinite", "number"} object) as Slurm prints
    reservation times: local, ISO 8601 without a zone; "Unlimited" when infinite."""
    if isinstance(value, Mapping) and value.get("infinite"):
        return "Unlimited"
    seconds = parsing.integer(value)
    if not seconds:
        return ""
    return datetime.fromtimestamp(seconds).strftime("%Y-%m-%dT%H:%M:%S")


def _words(value: Any) -> list[str]:
    """A list of strings from a list or a comma-separated string ("" and "(null)": none)."""
    if isinstance(value, list):
        return [str(item) for item in value if str(item)]
    raw = parsing.text(value).strip()
    return [] if raw in {"", "(null)"} else [word for word in raw.split(",") if word]


def parse_reservation(data: Mapping[str, Any]) -> Reservation:
    return Reservation(
        name=str(data.get("name") or ""),
        nodes=parsing.hostlist_or_empty(data.get("node_list")),
        start=local_time(data.get("start_time")),
        end=local_time(data.get("end_time")),
        flags=frozenset(word.upper() for word in _words(data.get("flags"))),
        users=_words(data.get("users")),
        state="ACTIVE" if _active(data) else "INACTIVE",
    )


def _active(data: Mapping[str, Any]) -> bool:
    start = parsing.integer(data.get("start_time")) or 0
    end_value = data.get("end_time")
    infinite = isinstance(end_value, Mapping) and bool(end_value.get("infinite"))
    end = parsing.integer(end_value) or 0
    now = datetime.now().timestamp()
    return start <= now and (infinite or now < end)


def parse_reservations(data: Mapping[str, Any]) -> list[Reservation]:
    return [parse_reservation(r) for r in data.get("reservations") or []
            if isinstance(r, Mapping) and r.get("name")]


def parse_accounts(data: Mapping[str, Any]) -> list[str]:
    return [str(a["name"]) for a in data.get("accounts") or []
            if isinstance(a, Mapping) and a.get("name")]


def requeue_failures(data: Mapping[str, Any]) -> list[str]:
    """The jobs a v0.0.45 requeue answer (``status``: one entry per job) says failed."""
    status = data.get("status")
    entries = status if isinstance(status, list) else []
    return [f"{entry.get('job_id')}: {entry.get('error') or entry.get('why') or 'failed'}"
            for entry in entries
            if isinstance(entry, Mapping) and parsing.integer(entry.get("error_code"))]


def dbd_agent_queue(data: Mapping[str, Any]) -> int | None:
    """``statistics.dbd_agent_queue_size`` of /slurm/vX/diag; None when it is absent."""
    statistics = data.get("statistics")
    if not isinstance(statistics, Mapping):
        return None
    return parsing.integer(statistics.get("dbd_agent_queue_size"))
