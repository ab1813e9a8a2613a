"""Parsers for what Slurm's clients print (22.05 to 26.05): JSON from sinfo, squeue, sacct
and scontrol, and the one-line ``Key=Value`` text of ``scontrol show ... -o`` (22.05).

Pure functions of the text: nothing here runs a program.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from adapters.slurm.backend import BASE_STATES, AccountUsage, Job, NodeInfo, Reservation
from kit.hostlist import expand

_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:(),]+)?:(\d+)")
_TRES_GPU = re.compile(r"(?:^|,)gres/gpu=(\d+)")
_KEY_VALUE = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_]*)=")


def number(value: Any) -> int | float | None:
    """A plain number, or the number inside a 24.11 ``{"set", "infinite", "number"}`` object."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        return number(value.get("number"))
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def integer(value: Any) -> int | None:
    found = number(value)
    return None if found is None else int(found)


def text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    return str(value)


def states(value: Any) -> list[str]:
    """A state as a list of upper-case words: ``"idle"`` and ``["IDLE", "DRAIN"]`` alike."""
    if value is None:
        return []
    if isinstance(value, str):
        return [word.upper() for word in re.split(r"[+,\s]+", value) if word]
    return [str(word).upper() for word in value]


def gpu_count(gres: str, tres: str = "") -> int:
    """GPUs in a gres string (``gpu:h100:8``, ``gpu:h100:2(IDX:0-1)``, ``gpu:4,gpu:a100:4``)."""
    counts = [int(found) for found in _GPU_GRES.findall(gres or "")]
    if counts:
        return sum(counts)
    return sum(int(found) for found in _TRES_GPU.findall(tres or ""))


def hostlist_or_empty(value: Any) -> list[str]:
    raw = text(value).strip()
    if not raw or raw in {"(null)", "None", "N/A", "None assigned"}:
        return []
    return expand(raw)


def parse_node(data: Mapping[str, Any]) -> NodeInfo:
    words = states(data.get("state"))
    base = next((w.lower() for w in words if w.lower() in BASE_STATES), None)
    flags = {w for w in words if w.lower() != base}
    flags |= set(states(data.get("state_flags")))
    reason_time = integer(data.get("reason_changed_at"))
    boot_time = integer(data.get("boot_time"))
    tres_used = text(data.get("tres_used"))
    return NodeInfo(
        name=str(data["name"]),
        state=base or (words[0].lower() if words else "unknown"),
        flags=frozenset(flags),
        reason=text(data.get("reason")),
        reason_user=text(data.get("reason_set_by_user")) or None,
        reason_time=reason_time or None,
        gpus_total=gpu_count(text(data.get("gres")), text(data.get("tres"))),
        gpus_used=gpu_count(text(data.get("gres_used")), tres_used),  # text: AllocTRES
        boot_time=boot_time or None,
        features=frozenset(f for f in text(data.get("features")).split(",")
                           if f and f != "(null)"),
        gres=text(data.get("gres")) if text(data.get("gres")) != "(null)" else "",
    )


def parse_sinfo_record(data: Mapping[str, Any]) -> list[NodeInfo]:
    """One record of 23.02+ ``sinfo --json`` (``{"sinfo": [...]}``): a group of nodes."""
    node = data.get("node") or {}
    reason = data.get("reason") or {}
    gres = data.get("gres") or {}
    names = (data.get("nodes") or {}).get("nodes") or []
    out = []
    for name in names:
        out.append(
            parse_node(
                {
                    "name": name,
                    "state": node.get("state"),
                    "reason": reason.get("description"),
                    "reason_set_by_user": reason.get("user"),
                    "reason_changed_at": reason.get("time"),
                    "gres": gres.get("total"),
                    "gres_used": gres.get("used"),
                }
            )
        )
    return out


def json_errors(data: Mapping[str, Any]) -> list[str]:
    """The ``errors`` list of a Slurm JSON answer as readable strings."""
    found = []
    for error in data.get("errors") or []:
        if isinstance(error, Mapping):
            words = [text(error.get(key)) for key in ("description", "error", "source")]
            message = "; ".join(word for word in words if word)
            errno = error.get("error_number", error.get("errno"))
            found.append(f"{message} (errno {errno})" if errno is not None else message)
        else:
            found.append(str(error))
    return found


def parse_nodes(data: Mapping[str, Any]) -> list[NodeInfo]:
    """Nodes from ``sinfo --json`` (22.05) or ``scontrol show nodes --json`` (23.02+).

    22.05 (openapi/v0.0.38) writes ``state`` as a lower-case string with flags in
    ``state_flags``, and plain numbers. 23.02+ (data_parser v0.0.40+) writes ``state`` as a
    list (``["IDLE", "DRAIN"]``) and many numbers as ``{"set", "infinite", "number"}``
    objects; its ``sinfo --json`` groups nodes (``parse_sinfo_record``). Checked against
    what the lab's 24.11.5 and 26.05.5 clients print (tests/adapters/test_slurm_releases.py).
    """
    nodes: dict[str, NodeInfo] = {}
    for record in data.get("nodes") or []:
        node = parse_node(record)
        nodes[node.name] = node
    for record in data.get("sinfo") or []:
        for node in parse_sinfo_record(record):
            nodes.setdefault(node.name, node)
    return list(nodes.values())


def parse_job(data: Mapping[str, Any]) -> Job:
    state = states(data.get("job_state"))
    nodes = hostlist_or_empty(data.get("nodes"))
    if not nodes:
        nodes = hostlist_or_empty(data.get("required_nodes"))
    return Job(
        id=int(integer(data.get("job_id")) or 0),
        name=text(data.get("name")),
        user=text(data.get("user_name")) or text(data.get("user")),
        account=text(data.get("account")),
        state=state[0] if state else "UNKNOWN",
        nodes=nodes,
    )


def parse_jobs(data: Mapping[str, Any]) -> list[Job]:
    return [parse_job(record) for record in data.get("jobs") or []]


def parse_reservations(output: str) -> list[Reservation]:
    """``scontrol show reservation -o`` (one line each; 'No reservations in the system')."""
    found = []
    for line in output.splitlines():
        fields = key_values(line)
        if "ReservationName" not in fields:
            continue
        users = fields.get("Users", "")
        found.append(
            Reservation(
                name=fields["ReservationName"],
                nodes=hostlist_or_empty(fields.get("Nodes")),
                start=fields.get("StartTime", ""),
                end=fields.get("EndTime", ""),
                flags=frozenset(f for f in fields.get("Flags", "").split(",") if f),
                users=[] if users in {"", "(null)"} else users.split(","),
                state=fields.get("State", ""),
            )
        )
    return found


def key_values(line: str) -> dict[str, str]:
    """``A=1 B=two words C=3`` -> {"A": "1", "B": "two words", "C": "3"}."""
    matches = list(_KEY_VALUE.finditer(line))
    fields = {}
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(line)
        fields[match.group(1)] = line[match.end():end].strip()
    return fields


def _gpus_of(job: Mapping[str, Any]) -> int:
    tres = job.get("tres") or {}
    for entry in tres.get("allocated") or []:
        if entry.get("type") == "gres" and entry.get("name") == "gpu":
            return int(integer(entry.get("count")) or 0)
    return 0


def parse_accounting(
    data: Mapping[str, Any], start: datetime, end: datetime, now: float | None = None
) -> list[AccountUsage]:
    """GPU-hours (clipped to [start, end)), job count and mean queue wait per account."""
    window_start, window_end = start.timestamp(), end.timestamp()
    current = now if now is not None else datetime.now().timestamp()
    totals: dict[str, list[float]] = {}  # account -> [gpu seconds, jobs, wait sum, started]
    for job in data.get("jobs") or []:
        account = text(job.get("account")) or text((job.get("association") or {}).get("account"))
        times = job.get("time") or {}
        row = totals.setdefault(account, [0.0, 0, 0.0, 0])
        row[1] += 1
        began = integer(times.get("start")) or 0
        if not began:
            continue
        finished = integer(times.get("end")) or 0
        stop = finished if finished else current
        overlap = max(0.0, min(stop, window_end) - max(began, window_start))
        row[0] += overlap * _gpus_of(job)
        queued_from = integer(times.get("eligible")) or integer(times.get("submission")) or began
        row[2] += max(0, began - queued_from)
        row[3] += 1
    return [
        AccountUsage(
            account=account,
            gpu_hours=round(row[0] / 3600, 6),
            jobs=int(row[1]),
            mean_queue_wait_seconds=(row[2] / row[3]) if row[3] else 0.0,
        )
        for account, row in sorted(totals.items())
    ]


def parse_version(output: str) -> tuple[int, int]:
    """``slurm 22.05.8`` -> (22, 5); ``slurm-wlm 24.11.5`` -> (24, 11)."""
    match = re.search(r"(\d+)\.(\d+)", output)
    if not match:
        raise ValueError(f"cannot read a Slurm version from {output.strip()!r}")
    return int(match.group(1)), int(match.group(2))


_REASON_TAG = re.compile(r"^(.*?)\s*\[([^@\]]+)@([0-9T:-]+)\]$")


def _epoch(value: str) -> int | None:
    try:
        return int(datetime.fromisoformat(value).timestamp())
    except ValueError:
        return None


def parse_node_text(output: str) -> list[NodeInfo]:
    """``scontrol show node -o`` (all versions): ``State=IDLE+DRAIN``, ``Reason=x [root@T]``."""
    nodes = []
    for line in output.splitlines():
        fields = key_values(line)
        if "NodeName" not in fields:
            continue
        words = states(fields.get("State", "").replace("*", "+NOT_RESPONDING"))
        reason, user, when = fields.get("Reason", ""), None, None
        tagged = _REASON_TAG.match(reason)
        if tagged:
            reason, user, when = tagged.group(1), tagged.group(2), _epoch(tagged.group(3))
        node = parse_node({
            "name": fields["NodeName"],
            "state": words,
            "reason": reason,
            "reason_set_by_user": user,
            "reason_changed_at": when,
            "gres": fields.get("Gres", ""),
            "features": fields.get("AvailableFeatures", ""),
            "tres": fields.get("CfgTRES", ""),
            "tres_used": fields.get("AllocTRES", ""),
            "boot_time": _epoch(fields.get("BootTime", "")),
        })
        nodes.append(node)
    return nodes


def with_jobs(found: list[NodeInfo], names: list[str] | None, jobs: list[Job]) -> list[NodeInfo]:
    """``found`` cut to ``names`` (all when None) in their order, each with the IDs of the
    active jobs in ``jobs`` that run on it (what every backend's ``nodes`` returns)."""
    if names is not None:
        wanted = set(names)
        found = [node for node in found if node.name in wanted]
    jobs_by_node: dict[str, list[int]] = {}
    for job in jobs:
        if job.active:
            for node in job.nodes:
                jobs_by_node.setdefault(node, []).append(job.id)
    # a node without jobs is kept as parsed (its own empty list), not copied: a fleet drain's
    # capacity guard reads every node of the pool before each batch
    result = [replace(node, jobs=sorted(jobs_by_node.get(node.name, [])))
              if node.name in jobs_by_node or node.jobs else node for node in found]
    if names is not None:
        order = {name: index for index, name in enumerate(names)}
        result.sort(key=lambda node: order[node.name])
    return result
