"""Alerts become runbook proposals (Alertmanager's webhook, version 4, on ``POST /alerts``).

A proposal runs nothing by itself: it waits for a person (Run or Dismiss) unless its rule
says ``auto_run`` and the runbook is risk low; running it is an ordinary request. One
proposal per firing of an alert: re-sent and flapping alerts update theirs (``receive``).
"""

from __future__ import annotations

import json
import logging
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy import Connection, select, text, update
from sqlalchemy.exc import SQLAlchemyError

from adapters.alertmanager.backend import parse_time
from bot.alerts import breaker
from bot.alerts.choosing import Choice, NothingToDo, choose
from bot.config import AlertRule
from bot.execution.executions import TERMINAL
from bot.runbooks import templating
from bot.service import Service
from bot.store import audit
from bot.store.db import now_iso
from bot.store.schema import executions, maintenance_windows, proposals
from bot.store.words import Kind
from kit import hostlist
from kit.canonical import canonical
from kit.errors import Refused

ALERT_USER = "alertmanager"  # who requests the runbooks alerts run on their own

_PROPOSAL_LOCK = 0x6772_7061  # advisory lock class: one proposal recorded per fingerprint
_log = logging.getLogger(__name__)


class WebhookAlert(BaseModel):
    model_config = ConfigDict(extra="ignore")
    status: str = Field(pattern="^(firing|resolved)$")
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    fingerprint: str = Field(min_length=1, max_length=64)
    # when this firing began (RFC 3339): the same for every re-send of one firing
    starts_at: str | None = Field(default=None, alias="startsAt")

    @field_validator("starts_at", mode="before")
    @classmethod
    def _starts_at(cls, value: object) -> str | None:
        """Only a hint: anything but a short string is as good as none (never a 400)."""
        return value if isinstance(value, str) and 0 < len(value) <= 40 else None


class Webhook(BaseModel):
    """Alertmanager's webhook payload; fields the bot does not use are ignored."""

    model_config = ConfigDict(extra="ignore")
    version: str = Field(pattern="^4$")
    status: str
    alerts: list[WebhookAlert]  # how many are taken: server.max_alerts_per_request


class BadPayload(ValueError):
    """The webhook body is not Alertmanager's version 4 payload; nothing was changed."""


class TooManyAlerts(ValueError):
    """The webhook carries more alerts than ``server.max_alerts_per_request``; nothing was
    changed."""


@dataclass(frozen=True)
class Proposal:
    id: int
    fingerprint: str
    alertname: str
    labels: dict[str, str]
    runbook: str
    params: dict[str, str]
    state: str
    alert_status: str
    created_at: str
    updated_at: str
    execution_id: int | None
    note: str | None
    alert_started_at: str | None  # the firing it is about (startsAt), when Alertmanager said
    resolved_at: str | None  # when the bot last heard its alert resolve


def parse(body: bytes) -> Webhook:
    try:
        return Webhook.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise BadPayload(f"not an Alertmanager webhook (version 4): {where}: {first['msg']}")\
            from None


def receive(service: Service, webhook: Webhook) -> list[Proposal]:
    """Record what the alerts propose; returns the proposals created or updated.

    Each firing alert that matches an ``alert_rules`` entry proposes that runbook with
    parameters taken from the alert's labels, once per firing of the alert (fingerprint).
    A firing alert updates its fingerprint's latest proposal instead of making a new one
    (``_same_firing``) while that proposal is open or its execution runs, when it is the
    same firing re-sent (same startsAt; whether the proposal was dismissed, run or refused),
    or when the alert fires again less than ``server.alert_refire_seconds`` after the bot
    heard it resolve or after the firing the proposal was about began (flapping). A
    resolved alert updates its proposal. A bad payload is refused whole, with the reason,
    before this (``parse``, BadPayload), and so is one of more than
    ``server.max_alerts_per_request`` alerts (TooManyAlerts).

    Each alert is taken on its own: one that cannot be proposed (its rule's parameters use
    a label it lacks, or anything else about it goes wrong) is recorded as a refused
    proposal with the reason (``proposal_refused`` in the audit log), once per firing
    while the reason stays the same, and the rest of the batch is still taken. Only the
    database failing fails the batch, so that Alertmanager sends it again (proposals
    already made are not made twice).
    """
    limit = service.config.server.max_alerts_per_request
    if len(webhook.alerts) > limit:
        raise TooManyAlerts(
            f"{len(webhook.alerts)} alerts in one request; at most {limit} are taken "
            "(server.max_alerts_per_request): set max_alerts in Alertmanager's webhook_config "
            "to at most that")
    touched = []
    for alert in webhook.alerts:
        rule = _rule_for(service, alert.labels)
        if rule is None:
            continue
        try:
            proposal = _resolve(service, alert) if alert.status == "resolved" else _fire(
                service, alert, rule)
        except SQLAlchemyError:
            raise
        except Exception as exc:  # one bad alert must not lose the rest of its batch
            _log.exception("alert %s (%s) could not be taken", alert.fingerprint,
                           alert.labels.get("alertname"))
            with service.db.connect() as conn:
                previous = _belongs_to(conn, alert, service.config.server.alert_refire_seconds)
            proposal = _refuse(service, alert, _asked(rule, {}), previous,
                               f"could not be proposed: {type(exc).__name__}: {exc}")
        if proposal is not None:
            touched.append(proposal)
    return touched


def _rule_for(service: Service, labels: dict[str, str]) -> AlertRule | None:
    for rule in service.config.alert_rules:
        if all(labels.get(k) in v.split("|") for k, v in rule.match.items()):
            return rule
    return None


def _open(conn: Connection, fingerprint: str) -> Any:
    """The alert's proposal while it is open or its execution still runs; else None."""
    row = conn.execute(select(proposals).where(
        proposals.c.fingerprint == fingerprint, proposals.c.state.in_(["open", "started"])
    ).order_by(proposals.c.id.desc())).first()
    if row is not None and row.state == "started" and row.execution_id is not None:
        state = conn.execute(select(executions.c.state)
                             .where(executions.c.id == row.execution_id)).scalar()
        if state in TERMINAL:
            return None
    return row


def _newest(conn: Connection, fingerprint: str) -> Any:
    return conn.execute(select(proposals).where(proposals.c.fingerprint == fingerprint)
                        .order_by(proposals.c.id.desc())).first()


def _belongs_to(conn: Connection, alert: WebhookAlert, refire_seconds: float) -> Any:
    """The proposal a firing ``alert`` still belongs to, or None: a new one is due."""
    live = _open(conn, alert.fingerprint)
    if live is not None:
        return live
    row = _newest(conn, alert.fingerprint)
    return row if row is not None and _same_firing(row, alert, refire_seconds) else None


def _same_firing(row: Any, alert: WebhookAlert, refire_seconds: float) -> bool:
    """Whether ``alert``, firing, is what the finished proposal ``row`` was made for: the same
    firing re-sent, or a new one within ``refire_seconds`` of the last (flapping)."""
    if alert.starts_at is not None and alert.starts_at == row.alert_started_at:
        return True  # Alertmanager sending a firing alert again (repeat_interval, the group)
    if row.resolved_at is not None and _seconds_between(row.resolved_at, None) < refire_seconds:
        return True  # it resolved a moment ago and fires again
    if alert.starts_at is None:
        return False
    # a firing that began soon after the last one did (its resolution never reached the bot)
    return _seconds_between(row.alert_started_at, alert.starts_at) < refire_seconds


def _seconds_between(earlier: str | None, later: str | None) -> float:
    """Seconds from ``earlier`` to ``later`` (RFC 3339; None: now); infinite when a time is
    missing or unreadable."""
    try:
        start = parse_time(earlier) if earlier else None
        end = parse_time(later) if later else datetime.now(UTC)
    except ValueError:
        return float("inf")
    return float("inf") if start is None else (end - start).total_seconds()


def _fire(service: Service, alert: WebhookAlert, rule: AlertRule) -> Proposal | None:
    """A firing alert: a new proposal, or the one it belongs to brought up to date."""
    with service.db.begin() as conn:
        row = _belongs_to(conn, alert, service.config.server.alert_refire_seconds)
        changed = row is not None and row.state != "refused" and _refired(conn, row, alert)
    if row is None or row.state == "refused":  # refused: asked again, the reason may be gone
        return _propose(service, alert, rule, row)
    return get(service, row.id) if changed else None


def _refired(conn: Connection, row: Any, alert: WebhookAlert) -> bool:
    """Bring ``row`` up to date with its alert firing (audited when it fires anew); whether
    anything changed."""
    fields: dict[str, Any] = {}
    if row.alert_status != "firing":
        fields["alert_status"] = "firing"
    if alert.starts_at is not None and alert.starts_at != row.alert_started_at:
        fields["alert_started_at"] = alert.starts_at
    if not fields:
        return False
    _set(conn, row.id, **fields)
    if row.alert_status != "firing" or row.alert_started_at is not None:
        audit.append(conn, Kind.ALERT_REFIRED, ALERT_USER, {
            "proposal": row.id, "fingerprint": alert.fingerprint, "state": row.state,
            "starts_at": alert.starts_at})
    return True


def _asked(rule: AlertRule, params: dict[str, str]) -> Choice:
    """What a rule asks before the XID table and repeat offenders had their say."""
    return Choice(rule.runbook or "(by XID)", params)


def _propose(service: Service, alert: WebhookAlert, rule: AlertRule,
             refused: Any = None) -> Proposal | None:
    """A new proposal (or refusal) for ``alert``; ``refused``: this firing's refused
    proposal, whose reason is not recorded a second time."""
    params: dict[str, str] = {}
    for name, template in rule.params.items():
        try:
            params[name] = str(templating.render(template, {"labels": alert.labels}))
        except templating.TemplateProblem as exc:
            return _refuse(service, alert, _asked(rule, params), refused, (
                f"parameter {name}: {exc} (the alert's labels: "
                f"{', '.join(sorted(alert.labels)) or 'none'})"))
    try:
        choice = choose(service, rule, alert.labels, params)
        stop = breaker.stopped(service)
        if stop is not None:
            return _refuse(service, alert, choice, refused, stop)
        plan = service.plan(choice.runbook, choice.params)
    except NothingToDo as exc:
        _log.info("alert %s: %s", alert.fingerprint, exc)
        return None
    except Refused as exc:
        return _refuse(service, alert, _asked(rule, params), refused, str(exc))
    proposal = _record(service, alert, choice, "open", _with_window(service, choice, choice.note),
                       refused)
    if proposal is None:  # proposed a moment ago by another request: it auto-ran there
        return None
    if choice.xid is not None and choice.xid in service.config.remediation.quarantine.xids:
        _quarantine(service, alert, choice, proposal.id)
        proposal = get(service, proposal.id)
    if rule.auto_run:
        _auto_run(service, proposal.id, plan.risk)
        return get(service, proposal.id)
    return proposal


def _refuse(service: Service, alert: WebhookAlert, choice: Choice,
            previous: Any, note: str) -> Proposal | None:
    """A refused proposal with why, unless ``previous`` (the proposal this firing belongs
    to) is that same refusal: then it is only brought up to date (no second row, no second
    ``proposal_refused``)."""
    note = _with_window(service, choice, note) or note
    if (previous is not None and previous.state == "refused" and previous.note == note
            and json.loads(previous.params) == choice.params):
        with service.db.begin() as conn:
            changed = _refired(conn, previous, alert)
        return get(service, previous.id) if changed else None
    return _record(service, alert, choice, "refused", note, previous)


def _record(service: Service, alert: WebhookAlert, choice: Choice,
            state: str, note: str | None, previous: Any = None) -> Proposal | None:
    """A proposal, open or refused (with why), and its audit event; None when, since
    ``previous`` was read, another request (Alertmanager's retry, another replica) recorded
    one for this firing: the alert has its proposal, and only one."""
    with service.db.begin() as conn:
        _one_at_a_time(conn, alert.fingerprint)
        current = _belongs_to(conn, alert, service.config.server.alert_refire_seconds)
        if current is not None and (previous is None or current.id != previous.id):
            return None
        proposal_id = _insert(conn, alert, choice, state, note)
        kind = Kind.PROPOSED if state == "open" else Kind.PROPOSAL_REFUSED
        audit.append(conn, kind, ALERT_USER, {
            "proposal": proposal_id, "alert": alert.labels.get("alertname"),
            "fingerprint": alert.fingerprint, "runbook": choice.runbook,
            "params": choice.params, "reason": note})
    return get(service, proposal_id)


def _with_window(service: Service, choice: Choice, note: str | None) -> str | None:
    """An alert about a node inside an open maintenance window still reaches people, marked
    so; the window's close keeps the node out (bot.schedule.windows)."""
    node = choice.params.get("node", "")
    if not node:
        return note
    with service.db.connect() as conn:
        rows = conn.execute(select(maintenance_windows.c.id, maintenance_windows.c.nodes)
                            .where(maintenance_windows.c.state == "open")).all()
    inside = next((f"{node} is inside maintenance window {window_id}: the window keeps it "
                   "out of service when it closes" for window_id, nodes in rows
                   if node in hostlist.expand(nodes)), None)
    return "; ".join(part for part in (inside, note) if part) or None


def _one_at_a_time(conn: Connection, fingerprint: str) -> None:
    """Serialise recording a fingerprint's proposal until the transaction ends. SQLite's
    BEGIN IMMEDIATE already does (bot.store.db); PostgreSQL's READ COMMITTED would let two
    transactions both find no proposal and both insert one."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:a, :b)"),
                     {"a": _PROPOSAL_LOCK, "b": zlib.crc32(fingerprint.encode()) & 0x7FFF_FFFF})


def _insert(conn: Connection, alert: WebhookAlert, choice: Choice, state: str,
            note: str | None) -> int:
    now = now_iso()
    result = conn.execute(proposals.insert().values(
        fingerprint=alert.fingerprint, alertname=alert.labels.get("alertname", "?"),
        labels=canonical(alert.labels), runbook=choice.runbook,
        params=canonical(choice.params), state=state, alert_status="firing",
        created_at=now, updated_at=now, note=note, alert_started_at=alert.starts_at))
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def _quarantine(service: Service, alert: WebhookAlert, choice: Choice, proposal_id: int) -> None:
    """Run the quarantine runbook for the alert's node now (its XID is listed), once per
    proposal (the caller recorded it); the proposal of the repair stays open for a person
    and says what the quarantine did. The audit log names the alert behind it."""
    runbook = service.config.remediation.quarantine.runbook
    where = f" on GPU {choice.params['gpu']}" if choice.params.get("gpu") else ""
    name = " ".join(alert.labels.get("alertname", "alert").split())[:80]  # one line, short
    reason = f"{name} XID {choice.xid}{where} (alert {alert.fingerprint[:16]})"
    params = {"node": choice.params.get("node", ""), "reason": reason}
    try:
        execution_id = service.request(runbook, params, ALERT_USER, source="alert",
                                   configured=True)
    except Refused as exc:
        said = f"quarantine refused: {exc}"
        execution_id = None
    else:
        said = f"quarantined by execution {execution_id} ({runbook}); the repair waits for you"
    note = get(service, proposal_id).note
    with service.db.begin() as conn:
        _set(conn, proposal_id, note=f"{note}; {said}" if note else said)
        audit.append(conn, Kind.QUARANTINE_REQUESTED, ALERT_USER, {
            "proposal": proposal_id, "execution": execution_id, "runbook": runbook,
            "fingerprint": alert.fingerprint, "alertname": alert.labels.get("alertname"),
            "xid": choice.xid, "node": params["node"], "outcome": said}, execution_id)


def _auto_run(service: Service, proposal_id: int, risk: str) -> None:
    if risk != "low":  # never without a person for medium or high risk
        with service.db.begin() as conn:
            _set(conn, proposal_id, note=f"auto_run ignored: the runbook is risk {risk}")
        return
    stop = breaker.stopped(service)
    if stop is not None:  # the proposal stays open for a person
        with service.db.begin() as conn:
            _set(conn, proposal_id, note=f"auto_run stopped: {stop}")
        return
    try:
        run(service, proposal_id, ALERT_USER, configured=True)
    except Refused as exc:  # e.g. a lock held by a running execution: the person decides
        with service.db.begin() as conn:
            _set(conn, proposal_id, note=f"auto_run refused: {exc}")


def _resolve(service: Service, alert: WebhookAlert) -> Proposal | None:
    """The alert's proposal (open or running, else its newest, whatever its state) hears it
    resolve, once: a resolution sent again, or of an older firing, changes nothing."""
    with service.db.begin() as conn:
        row = _open(conn, alert.fingerprint)
        row = row if row is not None else _newest(conn, alert.fingerprint)
        if row is None or row.alert_status == "resolved" or (
                alert.starts_at is not None and row.alert_started_at is not None
                and alert.starts_at != row.alert_started_at):
            return None
        _set(conn, row.id, alert_status="resolved", resolved_at=now_iso())
        audit.append(conn, Kind.ALERT_RESOLVED, ALERT_USER,
                     {"proposal": row.id, "fingerprint": alert.fingerprint})
    return get(service, row.id)


def _set(conn: Connection, proposal_id: int, **fields: Any) -> None:
    conn.execute(update(proposals).where(proposals.c.id == proposal_id)
                 .values(updated_at=now_iso(), **fields))


def get(service: Service, proposal_id: int) -> Proposal:
    with service.db.connect() as conn:
        row = conn.execute(select(proposals).where(proposals.c.id == proposal_id)).first()
    if row is None:
        raise Refused(f"there is no proposal {proposal_id}")
    return _from_row(row)


def listing(service: Service, *, open_only: bool = True) -> list[Proposal]:
    query = select(proposals).order_by(proposals.c.id.desc())
    if open_only:
        query = query.where(proposals.c.state == "open")
    with service.db.connect() as conn:
        return [_from_row(row) for row in conn.execute(query)]


def run(service: Service, proposal_id: int, user: str, *, configured: bool = False) -> int:
    """The Run button: request the proposed runbook as ``user``; returns the execution.
    The proposal is claimed first (open to started, in one statement), so two people who
    press Run at once make one execution; the other is told it was taken."""
    proposal = get(service, proposal_id)
    if proposal.state != "open":
        raise Refused(f"proposal {proposal_id} is {proposal.state}, not open")
    _claim(service, proposal_id, "started")
    try:
        resolved = (f"the alert that proposed this ({proposal.alertname}) resolved at "
                    f"{proposal.resolved_at}: check that the run is still needed"
                    if proposal.alert_status == "resolved" else None)
        execution_id = service.request(proposal.runbook, proposal.params, user, source="alert",
                                   configured=configured, warning=resolved)
    except BaseException:  # refused (or failed): the proposal is open again, as it was
        with service.db.begin() as conn:
            conn.execute(update(proposals).where(
                proposals.c.id == proposal_id, proposals.c.state == "started",
                proposals.c.execution_id.is_(None)).values(state="open", updated_at=now_iso()))
        raise
    with service.db.begin() as conn:
        _set(conn, proposal_id, execution_id=execution_id)
        audit.append(conn, Kind.PROPOSAL_STARTED, user,
                     {"proposal": proposal_id, "execution": execution_id}, execution_id)
    return execution_id


def _claim(service: Service, proposal_id: int, state: str) -> None:
    """Move an open proposal to ``state``; Refused when it is no longer open (someone else
    ran or dismissed it a moment ago)."""
    with service.db.begin() as conn:
        claimed = conn.execute(update(proposals).where(
            proposals.c.id == proposal_id, proposals.c.state == "open").values(
            state=state, updated_at=now_iso())).rowcount
    if claimed != 1:
        now = get(service, proposal_id).state
        raise Refused(f"proposal {proposal_id} is {now}, not open (someone acted on it a "
                      "moment ago)")


def dismiss(service: Service, proposal_id: int, user: str, reason: str | None) -> Proposal:
    """The Dismiss button: only someone who may request runs may dismiss one proposed."""
    if not service.config.matches(user, service.config.requesters):
        raise Refused(f"{user} may not dismiss proposals: only those who may request runs "
                      f"may (requesters: {', '.join(service.config.requesters)})")
    with service.db.begin() as conn:
        claimed = conn.execute(update(proposals).where(
            proposals.c.id == proposal_id, proposals.c.state == "open").values(
            state="dismissed", note=reason, updated_at=now_iso())).rowcount
        if claimed == 1:
            audit.append(conn, Kind.PROPOSAL_DISMISSED, user, {"proposal": proposal_id,
                                                                "reason": reason})
    proposal = get(service, proposal_id)
    if claimed != 1:
        raise Refused(f"proposal {proposal_id} is {proposal.state}, not open")
    return proposal


def _from_row(row: Any) -> Proposal:
    data = dict(row._mapping)
    data["labels"] = json.loads(data["labels"])
    data["params"] = json.loads(data["params"])
    return Proposal(**data)
