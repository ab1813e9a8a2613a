"""Maintenance windows: nodes, a start, a duration, the runbooks to run inside, and the
approvals collected ahead for all of it (``Window`` describes its states).

Nothing here acts on a system: opening and closing are executions of ``open-window`` and
``close-window`` requested through ``Service``, with locks, audit, undo and approval.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, select, update

from bot.execution import locking
from bot.execution.approval import approval_problem, may_steer, unapprovable
from bot.execution.executions import TERMINAL
from bot.execution.planning import ApprovalPolicy, approval_policy, runbook_nodes
from bot.runbooks import secrets
from bot.runbooks.params import CONTROL, SHELLISH, params_text
from bot.schedule import ahead
from bot.schedule.scheduling import (
    now_utc,
    parse_at,
    parse_utc,
    record_run,
    run_exists,
    utc_iso,
    zone,
)
from bot.service import Preapproval, Service
from bot.store import audit, words
from bot.store.db import now_iso
from bot.store.schema import executions, maintenance_windows, proposals
from bot.store.words import Kind, State
from kit import hostlist
from kit.canonical import canonical
from kit.durations import format_duration, parse_duration
from kit.errors import Refused

OPEN_RUNBOOK, CLOSE_RUNBOOK = "open-window", "close-window"
SCHEDULED, OPENING, OPEN, CLOSING = "scheduled", "opening", "open", "closing"
CLOSED, CANCELLED, MISSED, FAILED = "closed", "cancelled", "missed", "failed"
CREATING = "creating"  # a row whose plans are being made; never seen by anything else
ENDED = (CLOSED, CANCELLED, MISSED, FAILED)
MIN_SECONDS, MAX_SECONDS = 60.0, 14 * 86400.0
MAX_INSIDE = 20
NOT_STARTED = words.NOT_STARTED  # executions that can still be cancelled cleanly


@dataclass(frozen=True)
class Window:
    """A maintenance window as stored. Its ``state`` moves so (``advance`` drives it along):

    - ``scheduled`` -> ``opening``: at the start (``fire_open``, the leader's scheduler) or
      ahead of it (``open_now``, ``window open ID``) it requests ``open-window``: a Slurm
      MAINT reservation ``window-ID`` for its Slurm nodes, a cordon of its Kubernetes nodes
      (marked as the window's), a silence of its nodes' alerts and a chat message. With the
      approvals collected ahead (``approve``, bound to ``digest``, the digest of every plan
      of the window) and an unchanged plan it runs unattended; otherwise it waits for
      approval like any request. A start later than the misfire grace (the bot was down) is
      ``missed`` (``missed_open``), not opened late; an open-window refused or not
      succeeding makes it ``failed``.
    - ``opening`` -> ``open`` once open-window succeeded; the runbooks inside are then
      requested one after the other (``_run_inside``), each with the same approvals ahead
      (counted only where that runbook's policy accepts the approver, and only when its plan
      is still the one approved); a run that does not succeed stops the rest.
    - -> ``closing`` -> ``closed``: at the end (``fire_close``; an end is always dealt with,
      however late, so nothing stays cordoned) or on ``cancel``, runs not started are
      cancelled, a running one is waited for, and ``close-window`` deletes the reservation,
      uncordons what the window cordoned, expires the silence and reports what ran inside.
      A window cancelled before it opened is ``cancelled`` (``missed`` when its end came).

    From the request of its open-window (which takes ``node:NAME`` for each node, with
    ``window:ID``) until it ends, the window holds its nodes: those locks stay the window's
    when that execution ends, and ``_set`` releases them on the transition to an ended state.
    Its own runs (the runbooks inside, close-window: requested with ``window_id=ID``) borrow
    them in turn (bot.execution.locking). Anybody else's request on those nodes is refused,
    naming the window; a window does not open over a node somebody else holds (its
    open-window is refused, and the window fails saying who holds it). A ``windows:
    required`` runbook needs one more approval outside an open window over its nodes
    (``Service.plan``).
    """

    id: int
    nodes: str
    starts_at: str
    duration_seconds: float
    reason: str
    runbooks: list[dict[str, Any]]
    plans: list[dict[str, Any]]
    digest: str
    created_by: str
    created_at: str
    state: str
    open_execution_id: int | None
    close_execution_id: int | None
    runs: list[dict[str, Any]]
    report: str | None
    updated_at: str

    @property
    def subject(self) -> str:
        return f"window:{self.id}"

    @property
    def start(self) -> datetime:
        return parse_utc(self.starts_at)

    @property
    def end(self) -> datetime:
        return self.start + timedelta(seconds=self.duration_seconds)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(hostlist.expand(self.nodes))


def _from_row(row: Any) -> Window:
    data = dict(row._mapping)
    for key in ("runbooks", "plans", "runs"):
        data[key] = json.loads(data[key])
    return Window(**data)


def get(service: Service, window_id: int) -> Window:
    with service.db.connect() as conn:
        return _get(conn, window_id)


def _get(conn: Connection, window_id: int) -> Window:
    row = conn.execute(select(maintenance_windows).where(
        maintenance_windows.c.id == window_id, maintenance_windows.c.state != CREATING)).first()
    if row is None:
        raise Refused(f"there is no maintenance window {window_id}")
    return _from_row(row)


def listing(service: Service, *, everything: bool = False) -> list[Window]:
    query = select(maintenance_windows).where(maintenance_windows.c.state != CREATING)
    if not everything:
        query = query.where(maintenance_windows.c.state.not_in(ENDED))
    with service.db.connect() as conn:
        return [_from_row(row) for row in conn.execute(query.order_by(maintenance_windows.c.id))]


def _set(conn: Connection, window_id: int, **fields: Any) -> None:
    for key in ("runs", "plans", "runbooks"):
        if key in fields:
            fields[key] = canonical(fields[key])
    conn.execute(update(maintenance_windows).where(maintenance_windows.c.id == window_id)
                 .values(updated_at=now_iso(), **fields))
    if fields.get("state") in ENDED:  # the window is over: so is its hold on its nodes
        locking.release_window(conn, window_id)


# --- parameters of open-window / close-window ---------------------------------------------


def system_nodes(service: Service, names: frozenset[str]) -> dict[str, str]:
    """The window's nodes as each system calls them, for the configured systems only."""
    inv = service.inventory
    known = set(service.catalogue.names())
    ordered = sorted(names)
    slurm = [inv.names.get("slurm", {}).get(n, n) for n in ordered if n in inv.slurm] \
        if "slurm.reservation_create" in known else []
    k8s = [inv.names.get("kubernetes", {}).get(n, n) for n in ordered if n in inv.kubernetes] \
        if "k8s.cordon_nodes" in known else []
    alerts = [inv.names.get("dcgm", {}).get(n, n) for n in ordered] \
        if "alertmanager.silence" in known else []
    return {"slurm_nodes": hostlist.compress(slurm) if slurm else "",
            "k8s_nodes": ",".join(k8s), "alert_nodes": ",".join(alerts)}


def open_params(service: Service, window_id: int, nodes: str, seconds: float,
                reason: str) -> dict[str, str]:
    return {"window": str(window_id), "nodes": nodes, "duration": format_duration(seconds),
            "reason": reason, **system_nodes(service, frozenset(hostlist.expand(nodes)))}


def close_params(service: Service, window: Window, report: str) -> dict[str, str]:
    """close-window's parameters. A node a GPU alert was about while the window was open is
    kept out: drained in Slurm, left cordoned in Kubernetes, named in the report."""
    faulty = faulted(service, window)
    held = system_nodes(service, faulty)
    return {"window": str(window.id), "nodes": window.nodes, "report": report,
            **system_nodes(service, window.names),
            "k8s_nodes": system_nodes(service, window.names - faulty)["k8s_nodes"],
            "faulty": hostlist.compress(sorted(faulty)) if faulty else "",
            "faulty_slurm": held["slurm_nodes"]}


def faulted(service: Service, window: Window) -> frozenset[str]:
    """The window's nodes that a GPU alert (Gpu*, the shipped rules) was proposed about
    since the window opened, whatever became of the proposal."""
    with service.db.connect() as conn:
        opened = conn.execute(select(executions.c.requested_at).where(
            executions.c.id == (window.open_execution_id or 0))).scalar()
        since = opened or window.start.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        rows = conn.execute(select(proposals.c.params).where(
            proposals.c.alertname.like("Gpu%"),
            proposals.c.created_at >= since)).scalars()
        named = {json.loads(params).get("node") for params in rows}
    return frozenset(node for node in named if node in window.names)


def plans_digest(plans: list[dict[str, Any]]) -> str:
    return hashlib.sha256(canonical(plans).encode()).hexdigest()


# --- creating ---------------------------------------------------------------------------


Inside = Sequence[tuple[str, Mapping[str, str]]]  # the runbooks to run inside: (name, params)


def create(service: Service, nodes: str, user: str, *, start: str, duration: str,
           runbooks: Inside = (), reason: str = "maintenance window",
           tz: str | None = None) -> Window:
    """Check, plan and store a window; Refused (nothing stored) when anything is wrong.

        window create NODES start="2026-12-05 02:00" duration=4h [tz=...] [reason=...]
                      [runbooks="drain-node node=gpu04 reason=fw; resume-node node=gpu04"]

    The surfaces read the ``runbooks=`` text (bot.surfaces.chat.words) and hand the list.
    """
    try:
        return _create(service, nodes, user, start, duration, runbooks, reason, tz)
    except Refused as exc:
        refused(service, user, nodes=nodes, start=start, duration=duration,
                runbooks=_shown(service, runbooks), problem=str(exc))
        raise


def refused(service: Service, user: str, *, nodes: str, start: str, duration: str,
            runbooks: str, problem: str) -> None:
    """Record a refused window (its runbooks as text, secret values left out)."""
    with service.db.begin() as conn:
        audit.append(conn, Kind.WINDOW_REFUSED, user, {
            "nodes": nodes[:200], "start": start[:40], "duration": duration[:40],
            "runbooks": runbooks[:2000], "reason": problem[:2000]})


def _create(service: Service, nodes_text: str, user: str, start: str, duration: str,
            runbooks: Inside, reason: str, tz: str | None) -> Window:
    if not service.config.matches(user, service.config.requesters, requesting=True):
        raise Refused(f"{user} may not request runbooks, so may not create windows either "
                      f"(requesters: {', '.join(service.config.requesters)})")
    names = _known_nodes(service, nodes_text)
    nodes = hostlist.compress(names)
    starts, seconds = _when(service, start, duration, tz)
    inside = _plans_inside(service, runbooks, frozenset(names), nodes)
    created = now_iso()
    with service.db.begin() as conn:  # an ID first: the window's plans name it
        result = conn.execute(maintenance_windows.insert().values(
            nodes=nodes, starts_at=utc_iso(starts), duration_seconds=seconds, reason=reason,
            runbooks=canonical([{"runbook": r["runbook"], "params": r["params"]}
                                      for r in inside]),
            plans="[]", digest="", created_by=user, created_at=created, state=CREATING,
            runs="[]", updated_at=created))
        key = result.inserted_primary_key
        assert key is not None
        window_id = int(key[0])
    try:
        params = open_params(service, window_id, nodes, seconds, reason)
        opening = service.plan(OPEN_RUNBOOK, params)
        _approvable(opening.approval, OPEN_RUNBOOK)
    except Refused:
        with service.db.begin() as conn:
            conn.execute(maintenance_windows.delete().where(maintenance_windows.c.id == window_id))
        raise
    plans = [{"runbook": OPEN_RUNBOOK, "params": params, "plan_hash": opening.hash,
              "required": opening.approval.required}, *inside]
    runs = [{"runbook": r["runbook"], "params": r["params"], "plan_hash": r["plan_hash"],
             "execution_id": None, "state": "pending"} for r in inside]
    with service.db.begin() as conn:
        _set(conn, window_id, plans=plans, digest=plans_digest(plans), runs=runs,
             state=SCHEDULED)
        window = _get(conn, window_id)
        audit.append(conn, Kind.WINDOW_CREATED, user, {
            "window": window.id, "nodes": nodes, "starts_at": window.starts_at,
            "duration_seconds": seconds, "reason": reason, "plans": plans,
            "digest": window.digest})
    return window


def _known_nodes(service: Service, nodes_text: str) -> list[str]:
    held = len(service.inventory.nodes)
    try:
        names = hostlist.expand(nodes_text, limit=max(held, 1))
    except hostlist.TooMany as exc:
        limit = (f"the inventory holds {held:,}" if exc.limit >= held
                 else f"at most {exc.limit:,} at once")
        raise Refused(f'nodes "{nodes_text[:80]}" names {exc.count:,} nodes; {limit}') from None
    except ValueError as exc:
        raise Refused(f'nodes "{nodes_text[:80]}": {exc}') from None
    unknown = sorted(set(names) - service.inventory.nodes)
    if not names or unknown:
        raise Refused(f"nodes: {', '.join(unknown[:10]) or 'none given'}: not known node(s)")
    return names


def _when(service: Service, start: str, duration: str, tz: str | None) -> tuple[datetime, float]:
    """The window's start (UTC) and length; Refused for the past or a length out of range."""
    tz_name = tz or service.config.scheduling.timezone
    now = now_utc()
    starts = (now if start.strip().lower() in ("now", "")
              else parse_at(start, zone(tz_name), "start"))
    if starts < now - timedelta(minutes=1):
        raise Refused(f'start="{start}" is in the past (it is now {utc_iso(now)} UTC); '
                      "say start=now to open it at once")
    try:
        seconds = parse_duration(duration)
    except ValueError as exc:
        raise Refused(f"duration: {exc}") from None
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise Refused(f"duration: {duration} is outside 1m..14d")
    return starts, seconds


def _approvable(policy: ApprovalPolicy, runbook: str) -> None:
    problem = unapprovable(policy, runbook)
    if problem is not None:  # the window could never be approved
        raise Refused(f"runbooks: {problem}" if runbook != OPEN_RUNBOOK else problem)


def _shown(service: Service, runbooks: Inside) -> str:
    """A refused window's runbooks as the audit log keeps them: secret values left out."""
    return "; ".join(" ".join([name, *(f"{k}={v}" for k, v in secrets.scrub_raw(
        service.known(name), params).items())]) for name, params in runbooks)


def _plans_inside(service: Service, runbooks: Inside, window_nodes: frozenset[str],
                  nodes: str) -> list[dict[str, Any]]:
    """Plan each runbook to run inside the window; each must stay on the window's nodes."""
    if len(runbooks) > MAX_INSIDE:
        raise Refused(f"runbooks: {len(runbooks)} runbooks; a window runs at most {MAX_INSIDE}")
    inside = []
    for name, params in runbooks:
        if name in (OPEN_RUNBOOK, CLOSE_RUNBOOK):
            raise Refused(f"runbooks: {name} is what the window itself runs")
        plan = service.plan(name, params, window=window_nodes)
        if plan.sealed:  # the window keeps its runbooks' parameters until it opens
            raise Refused(f"runbooks: {name}: a window cannot keep a secret parameter "
                          f"({', '.join(sorted(plan.sealed))}); request it inside the window")
        _approvable(plan.approval, name)
        outside = runbook_nodes(service.runbook(name), plan.params) - window_nodes
        if outside:
            raise Refused(f"runbooks: {name} acts on {hostlist.compress(sorted(outside))}, "
                          f"outside the window's nodes {nodes}")
        inside.append({"runbook": name, "params": dict(params), "plan_hash": plan.hash,
                       "required": plan.approval.required})
    return inside


# --- approving, cancelling, opening now ----------------------------------------------------


def _current_plans(service: Service, window: Window) -> list[dict[str, Any]]:
    opening = service.plan(OPEN_RUNBOOK, open_params(service, window.id, window.nodes,
                                                 window.duration_seconds, window.reason))
    plans = [{"runbook": OPEN_RUNBOOK, "params": window.plans[0]["params"],
              "plan_hash": opening.hash, "required": opening.approval.required}]
    for item in window.runbooks:
        plan = service.plan(item["runbook"], item["params"], window=window.names)
        plans.append({"runbook": item["runbook"], "params": item["params"],
                      "plan_hash": plan.hash, "required": plan.approval.required})
    return plans


def approve(service: Service, window_id: int, user: str) -> tuple[Window, list[str], str]:
    """Approve everything the window will run, ahead: bound to the digest of its plans.
    A window that opened meanwhile (start=now) has its open execution approved too: the
    approval ahead came too late for that request to count it."""
    window, names, note = _approve_ahead(service, window_id, user)
    caught = _catch_up(service, get(service, window.id), user)
    return window, names, "; ".join(part for part in (note, caught) if part)


def _catch_up(service: Service, window: Window, user: str) -> str:
    if window.state == SCHEDULED or window.open_execution_id is None:
        return ""
    opening = service.get(window.open_execution_id)
    if opening.state != State.AWAITING_APPROVAL:
        return ""
    try:
        service.approve(opening.id, user)
    except Refused as exc:
        return (f"window {window.id} opened meanwhile and its {OPEN_RUNBOOK} execution "
                f"{opening.id} could not take this approval: {exc}")
    return (f"window {window.id} opened meanwhile: approved its {OPEN_RUNBOOK} execution "
            f"{opening.id} as well")


def _approve_ahead(service: Service, window_id: int, user: str) -> tuple[Window, list[str], str]:
    window = get(service, window_id)
    if window.state != SCHEDULED:
        raise Refused(f"window {window.id} is {window.state}: approvals ahead are collected "
                      "before it opens")
    plans = _current_plans(service, window)
    problems = []
    for item in plans:
        if item["required"] == 0:
            continue
        policy = approval_policy(service.runbook(item["runbook"]).runbook, service.config)
        problem = approval_problem(service.config, policy, item["runbook"], user, window.created_by,
                                       asked="created the window")
        if problem is not None:
            problems.append(problem)
    if not any(item["required"] for item in plans):
        raise Refused(f"nothing in window {window.id} needs an approval")
    note = ""
    with service.db.begin() as conn:
        if problems:
            audit.append(conn, Kind.APPROVAL_REFUSED, user, {"reason": "; ".join(problems),
                                                             "subject": window.subject})
        else:
            digest = plans_digest(plans)
            if digest != window.digest:
                note = ("the window's plans changed since it was created (the inventory or a "
                        "runbook changed): this approval is for them as they are now; earlier "
                        "ones no longer count")
                runs = [{**run, "plan_hash": item["plan_hash"]}
                        for run, item in zip(window.runs, plans[1:], strict=True)]
                _set(conn, window.id, plans=plans, digest=digest, runs=runs)
            if ahead.record(conn, window.subject, user, digest):
                names = ahead.approvers(conn, window.subject, digest)
                audit.append(conn, Kind.WINDOW_APPROVED, user, {
                    "window": window.id, "digest": digest, "approvals": len(names),
                    "plans": [{"runbook": p["runbook"], "plan_hash": p["plan_hash"],
                               "required": p["required"]} for p in plans]})
                return _get(conn, window.id), names, note
            problems.append(f"{user} has already approved window {window.id}")
    raise Refused("; ".join(problems))


def approvers_ahead(service: Service, window: Window) -> list[str]:
    with service.db.connect() as conn:
        return ahead.approvers(conn, window.subject, window.digest)


def _may_steer(service: Service, window: Window, user: str) -> bool:
    policy = approval_policy(service.runbook(OPEN_RUNBOOK).runbook, service.config)
    return may_steer(service.config, user, window.created_by, policy.approvers)


def open_now(service: Service, window_id: int, user: str) -> Window:
    """Open a scheduled window now, ahead of its start (same path as at its start)."""
    window = get(service, window_id)
    if not _may_steer(service, window, user):
        raise Refused(f"{user} may not open window {window.id}: only who created it "
                      f"({window.created_by}) or an approver of {OPEN_RUNBOOK} may")
    if window.state != SCHEDULED:
        raise Refused(f"window {window.id} is {window.state}: only a scheduled window opens")
    _open(service, window, actor=user)
    return get(service, window.id)


def cancel(service: Service, window_id: int, user: str) -> Window:
    """A scheduled window is dropped; an open (or opening) one closes now."""
    window = get(service, window_id)
    if not _may_steer(service, window, user):
        raise Refused(f"{user} may not cancel window {window.id}: only who created it "
                      f"({window.created_by}) or an approver of {OPEN_RUNBOOK} may")
    if window.state in ENDED or window.state == CLOSING:
        raise Refused(f"window {window.id} is already {window.state}")
    if window.state == SCHEDULED:
        with service.db.begin() as conn:
            _set(conn, window.id, state=CANCELLED, report=f"cancelled by {user} before it opened")
            audit.append(conn, Kind.WINDOW_CANCELLED, user, {"window": window.id,
                                                             "state": window.state})
        return get(service, window.id)
    with service.db.begin() as conn:
        audit.append(conn, Kind.WINDOW_CANCELLED, user, {"window": window.id,
                                                         "state": window.state})
    _begin_close(service, window, actor=user, why=f"cancelled by {user}")
    return get(service, window.id)


# --- the scheduler's side ----------------------------------------------------------------


def fire_open(service: Service, window_id: int) -> str:
    """The window's start has come (the leader's scheduler)."""
    try:
        window = get(service, window_id)
    except Refused:
        return "skipped"
    if window.state != SCHEDULED:
        return f"skipped: window {window.id} is {window.state}"
    return _open(service, window, actor="scheduler")


def _open(service: Service, window: Window, actor: str) -> str:
    subject, key = f"{window.subject}:open", window.starts_at
    with service.db.connect() as conn:
        if run_exists(conn, subject, key):
            return "duplicate"
        names = ahead.approvers(conn, window.subject, window.digest)
    params = open_params(service, window.id, window.nodes, window.duration_seconds, window.reason)
    preapproved = Preapproval(window.plans[0]["plan_hash"], tuple(names), f"window {window.id}")

    def also(conn: Connection, execution_id: int) -> None:
        record_run(conn, subject, key, "requested", execution_id)
        _set(conn, window.id, state=OPENING, open_execution_id=execution_id)
        audit.append(conn, Kind.WINDOW_OPENING, actor, {
            "window": window.id, "nodes": window.nodes, "approvers_ahead": names,
            "late_by_seconds": round((now_utc() - window.start).total_seconds(), 3)},
            execution_id)

    try:
        service.request(OPEN_RUNBOOK, params, window.created_by, source="window",
                    preapproved=preapproved, also=also)
    except Refused as exc:
        with service.db.begin() as conn:
            if run_exists(conn, subject, key):
                return "duplicate"
            record_run(conn, subject, key, "refused", None, str(exc)[:2000])
            _set(conn, window.id, state=FAILED,
                 report=_clean(f"the window did not open: {exc}"))
            audit.append(conn, Kind.WINDOW_FAILED, actor, {"window": window.id,
                                                           "reason": str(exc)[:2000]})
        return f"refused: {exc}"
    return "opening"


def missed_open(service: Service, window_id: int, scheduled_for: datetime,
                now: datetime | None = None) -> str:
    """The start passed while no leader ran, beyond the misfire grace: not opened late."""
    moment = now or now_utc()
    subject, key = f"window:{window_id}:open", utc_iso(scheduled_for)
    with service.db.begin() as conn:
        try:
            window = _get(conn, window_id)
        except Refused:
            return "skipped"
        if window.state != SCHEDULED or run_exists(conn, subject, key):
            return "skipped"
        late = round((moment - scheduled_for).total_seconds())
        why = (f"the bot was not running (or not the leader) at the window's start "
               f"{key} and came back {late}s later, past the misfire grace: not opened late")
        record_run(conn, subject, key, "missed", None, why)
        _set(conn, window.id, state=MISSED, report=_clean(why))
        audit.append(conn, Kind.WINDOW_MISSED, "scheduler", {"window": window.id,
                                                             "scheduled_for": key, "why": why})
    return "missed"


def fire_close(service: Service, window_id: int) -> str:
    """The window's end has come: close it (however late)."""
    try:
        window = get(service, window_id)
    except Refused:
        return "skipped"
    subject, key = f"{window.subject}:close", utc_iso(window.end)
    with service.db.begin() as conn:
        if run_exists(conn, subject, key):
            return "duplicate"
        record_run(conn, subject, key, "requested", None)
    window = _advance_one(service, window)[0]
    if window.state in ENDED or window.state == CLOSING:
        return f"window {window.id} is {window.state}"
    if window.state == SCHEDULED:
        with service.db.begin() as conn:
            why = "its end came and it had not opened (its start was missed)"
            _set(conn, window.id, state=MISSED, report=why)
            audit.append(conn, Kind.WINDOW_MISSED, "scheduler", {"window": window.id, "why": why})
        return "missed"
    _begin_close(service, window, actor="scheduler", why="its end has come")
    return "closing"


def _begin_close(service: Service, window: Window, actor: str, why: str) -> None:
    if window.state == OPENING and window.open_execution_id is not None:
        ex = service.get(window.open_execution_id)
        if ex.state in NOT_STARTED:
            service.cancel(ex.id, window.created_by)
            with service.db.begin() as conn:
                _set(conn, window.id, state=MISSED if actor == "scheduler" else CANCELLED,
                     report=_clean(f"never opened ({why} while {OPEN_RUNBOOK} execution "
                                   f"{ex.id} was {ex.state}; it was cancelled)"))
                audit.append(conn, Kind.WINDOW_CLOSING, actor, {"window": window.id, "why": why,
                                                                "opened": False})
            return
    with service.db.begin() as conn:
        _set(conn, window.id, state=CLOSING)
        audit.append(conn, Kind.WINDOW_CLOSING, actor, {"window": window.id, "why": why})
    advance(service, window.id)


def advance(service: Service, window_id: int | None = None) -> list[str]:
    """Move windows that are opening, open or closing along; returns what happened."""
    if window_id is not None:
        found = [get(service, window_id)]
    else:
        with service.db.connect() as conn:
            found = [_from_row(row) for row in conn.execute(
                select(maintenance_windows).where(
                    maintenance_windows.c.state.in_([OPENING, OPEN, CLOSING]))
                .order_by(maintenance_windows.c.id))]
    notes: list[str] = []
    for window in found:
        notes += _advance_one(service, window)[1]
    return notes


def _advance_one(service: Service, window: Window) -> tuple[Window, list[str]]:
    notes: list[str] = []
    if window.state == OPENING and window.open_execution_id is not None:
        ex = service.get(window.open_execution_id)
        if ex.terminal:
            with service.db.begin() as conn:
                if ex.state == State.SUCCEEDED:
                    _set(conn, window.id, state=OPEN)
                    audit.append(conn, Kind.WINDOW_OPENED, "bot", {
                        "window": window.id, "nodes": window.nodes,
                        "until": utc_iso(window.end)}, ex.id)
                    notes.append(f"window {window.id} is open on {window.nodes}")
                else:
                    report = _clean(f"the window did not open: {OPEN_RUNBOOK} execution "
                                    f"{ex.id} {ex.state}: {ex.error or ''}")
                    _set(conn, window.id, state=FAILED, report=report)
                    audit.append(conn, Kind.WINDOW_FAILED, "bot", {"window": window.id,
                                                                   "report": report}, ex.id)
                    notes.append(f"window {window.id}: {report}")
            window = get(service, window.id)
    if window.state == OPEN:
        notes += _run_inside(service, window)
        window = get(service, window.id)
    if window.state == CLOSING:
        notes += _close_step(service, window)
        window = get(service, window.id)
    return window, notes


def _run_inside(service: Service, window: Window) -> list[str]:
    """Request the next runbook inside once the one before it ended well."""
    runs = [dict(run) for run in window.runs]
    notes: list[str] = []
    changed = False
    for index, run in enumerate(runs):
        if run["execution_id"] is not None:
            ex = service.get(run["execution_id"])
            if run["state"] != ex.state:
                run["state"], changed = ex.state, True
            if not ex.terminal:
                break
            if ex.state != State.SUCCEEDED:
                for later in runs[index + 1:]:
                    if later["execution_id"] is None and later["state"] == "pending":
                        later["state"] = f"not run: {run['runbook']} {ex.state} before it"
                        changed = True
                break
            continue
        if run["state"] != "pending":
            continue
        with service.db.connect() as conn:
            names = ahead.approvers(conn, window.subject, window.digest)
        try:
            execution_id = service.request(
                run["runbook"], run["params"], window.created_by, source="window",
                preapproved=Preapproval(run["plan_hash"], tuple(names), f"window {window.id}"),
                window_id=window.id)
        except Refused as exc:
            run["state"] = _clean(f"refused: {exc}")[:300]
            changed = True
            notes.append(f"window {window.id}: {run['runbook']} refused: {exc}")
            continue
        run["execution_id"], run["state"] = execution_id, service.get(execution_id).state
        changed = True
        notes.append(f"window {window.id}: requested {run['runbook']} (execution "
                     f"{execution_id}, {run['state']})")
        with service.db.begin() as conn:
            audit.append(conn, Kind.WINDOW_RUN_REQUESTED, "bot", {
                "window": window.id, "runbook": run["runbook"], "approvers_ahead": names},
                execution_id)
        break
    if changed:
        with service.db.begin() as conn:
            _set(conn, window.id, runs=runs)
    return notes


def _close_step(service: Service, window: Window) -> list[str]:
    if window.close_execution_id is not None:
        ex = service.get(window.close_execution_id)
        if not ex.terminal:
            return []
        with service.db.begin() as conn:
            note = "" if ex.state == State.SUCCEEDED else (
                f" CLOSING FAILED ({CLOSE_RUNBOOK} execution {ex.id} {ex.state}: "
                f"{ex.error}): check the reservation, cordons and silence by hand")
            _set(conn, window.id, state=CLOSED, report=_clean((window.report or "") + note))
            audit.append(conn, Kind.WINDOW_CLOSED, "bot", {
                "window": window.id, "report": window.report, "close_state": ex.state}, ex.id)
        return [f"window {window.id} is closed" + note]
    runs = [dict(run) for run in window.runs]
    waiting = []
    if window.open_execution_id is not None:
        opening = service.get(window.open_execution_id)
        if not opening.terminal:
            return [f"window {window.id}: closing waits for {OPEN_RUNBOOK} execution "
                    f"{opening.id} to end"]
    for run in runs:
        if run["execution_id"] is None:
            if run["state"] == "pending":
                run["state"] = "not run: the window closed first"
            continue
        ex = service.get(run["execution_id"])
        if ex.state in NOT_STARTED:
            ex = service.cancel(ex.id, window.created_by)
        run["state"] = ex.state
        if not ex.terminal:
            waiting.append(ex.id)
    with service.db.begin() as conn:
        _set(conn, window.id, runs=runs)
    if waiting:
        return [f"window {window.id}: closing waits for execution(s) "
                f"{', '.join(map(str, waiting))} to end"]
    report = run_report(runs)
    try:
        execution_id = service.request(CLOSE_RUNBOOK, close_params(service, window, report),
                                   window.created_by, source="window", configured=True,
                                   window_id=window.id)
    except Refused as exc:
        with service.db.begin() as conn:
            _set(conn, window.id, report=_clean(f"{report} CLOSING REFUSED: {exc}"))
            audit.append(conn, Kind.WINDOW_FAILED, "bot", {"window": window.id,
                                                           "reason": str(exc)[:2000]})
        return [f"window {window.id}: {CLOSE_RUNBOOK} refused: {exc} (retrying)"]
    with service.db.begin() as conn:
        _set(conn, window.id, close_execution_id=execution_id, report=report)
        audit.append(conn, Kind.WINDOW_CLOSE_REQUESTED, "bot", {"window": window.id,
                                                                "report": report}, execution_id)
    return [f"window {window.id}: closing (execution {execution_id})"]


def overdue(service: Service) -> list[tuple[Window, list[int]]]:
    """Windows past their end that still wait for runs inside them to end (closing waits for
    a run rather than cut it off): each with those executions, for people to hear once."""
    found = []
    for window in listing(service):
        if window.state != CLOSING or window.close_execution_id is not None:
            continue
        waiting = [int(run["execution_id"]) for run in window.runs
                   if run.get("execution_id") is not None
                   and not service.get(int(run["execution_id"])).terminal]
        if waiting and window.end <= now_utc():
            found.append((window, waiting))
    return found


def overdue_text(window: Window, waiting: list[int]) -> str:
    ids = ", ".join(map(str, waiting))
    return (f"Maintenance window {window.id} passed its end ({utc_iso(window.end)}) and is "
            f"still closing: it waits for execution(s) {ids} inside it to end before it "
            "lifts its reservation, cordons and silence. Cancel them to close it now "
            f"(`/runbook cancel ID`); its nodes stay out of service until then.")


def inside_done(window: Window) -> bool:
    """Every runbook inside has ended (or will not run)."""
    return all(run["state"] in TERMINAL or (run["execution_id"] is None
                                            and run["state"] != "pending")
               for run in window.runs)


def run_report(runs: Sequence[Mapping[str, Any]]) -> str:
    """What ran inside, as one line a text parameter accepts."""
    if not runs:
        return "Nothing was to run inside it."
    parts = []
    for run in runs:
        what = f"{run['runbook']} {params_text(run['params'])}".strip()
        if run["execution_id"] is not None:
            parts.append(f"{what} (execution {run['execution_id']}, {run['state']})")
        else:
            parts.append(f"{what} ({run['state']})")
    return _clean("Ran inside: " + ", ".join(parts) + ".")


def _clean(text: str, limit: int = 1900) -> str:
    """Text a runbook's text parameter accepts: one line, no shell-looking characters."""
    text = CONTROL.sub(" ", SHELLISH.sub(" ", text))
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
