"""Tables. Timestamps are UTC ISO-8601 text (readable by auditors, identical on every backend).

Changing a table means a new Alembic revision in ``migrations/versions``.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

runbook_versions = Table(
    "runbook_versions",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("version", String(64), primary_key=True),
    Column("content_hash", String(64), nullable=False),
    Column("source", Text, nullable=False),
    Column("first_seen", String(32), nullable=False),
)

executions = Table(
    "executions",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("runbook", String(64), nullable=False),
    Column("version", String(64), nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("params", Text, nullable=False),  # canonical JSON
    Column("requested_by", String(128), nullable=False),
    Column("requested_at", String(32), nullable=False),
    Column("state", String(32), nullable=False),
    Column("stage", String(32), nullable=False),  # approval, pre_checks, steps, post_checks, undo
    Column("plan", Text, nullable=False),  # canonical JSON of the current plan
    Column("plan_hash", String(64), nullable=False),
    Column("approvals_required", Integer, nullable=False),
    Column("approval_deadline", Float, nullable=True),  # epoch seconds
    Column("resume", String(16), nullable=False),
    Column("owner", String(128), nullable=True),  # engine process driving it
    Column("lease_until", Float, nullable=True),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("resume_requested", Boolean, nullable=False, default=False),
    Column("fencing_token", Integer, nullable=False, default=0),
    Column("error", Text, nullable=True),
    Column("finished_at", String(32), nullable=True),
    Index("ix_executions_state", "state"),
)

step_states = Table(
    "step_states",
    metadata,
    Column("execution_id", Integer, ForeignKey("executions.id"), primary_key=True),
    Column("phase", String(8), primary_key=True),  # do | undo
    Column("step_id", String(64), primary_key=True),
    Column("position", Integer, nullable=False),
    Column("state", String(16), nullable=False),  # running, succeeded, failed, skipped
    Column("attempt", Integer, nullable=False, default=0),
    Column("started_at", String(32), nullable=True),
    Column("finished_at", String(32), nullable=True),
    Column("result", Text, nullable=True),
    Column("error", Text, nullable=True),
)

approvals = Table(
    "approvals",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("execution_id", Integer, ForeignKey("executions.id"), nullable=False),
    Column("user", String(128), nullable=False),
    Column("decision", String(8), nullable=False),  # approve | deny
    Column("plan_hash", String(64), nullable=False),
    Column("at", String(32), nullable=False),
    Column("reason", Text, nullable=True),
    Index("ix_approvals_execution", "execution_id"),
)

locks = Table(
    "locks",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("execution_id", Integer, nullable=False),
    Column("owner", String(128), nullable=False),  # who requested the execution
    Column("acquired_at", String(32), nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("token", Integer, nullable=False),
)

counters = Table(
    "counters",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", Integer, nullable=False),
)

audit_events = Table(
    "audit_events",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("ts", String(32), nullable=False),
    Column("execution_id", Integer, nullable=True),
    Column("kind", String(32), nullable=False),
    Column("actor", String(128), nullable=False),
    Column("data", Text, nullable=False),  # canonical JSON
    Column("prev_hash", String(64), nullable=False),
    Column("hash", String(64), nullable=False),
    Index("ix_audit_execution", "execution_id"),
    Index("ix_audit_ts", "ts"),
)

confirmations = Table(
    "confirmations",
    metadata,
    Column("execution_id", Integer, ForeignKey("executions.id"), primary_key=True),
    Column("step_id", String(64), primary_key=True),
    Column("question", Text, nullable=False),
    Column("asked_at", String(32), nullable=False),
    Column("answer", String(8), nullable=True),  # yes | no
    Column("answered_by", String(128), nullable=True),
    Column("answered_at", String(32), nullable=True),
    Column("note", Text, nullable=True),
)

proposals = Table(
    "proposals",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("fingerprint", String(64), nullable=False),
    Column("alertname", String(200), nullable=False),
    Column("labels", Text, nullable=False),  # canonical JSON of the alert's labels
    Column("runbook", String(64), nullable=False),
    Column("params", Text, nullable=False),  # canonical JSON
    Column("state", String(16), nullable=False),  # open, dismissed, started, refused
    Column("alert_status", String(16), nullable=False),  # firing | resolved
    Column("created_at", String(32), nullable=False),
    Column("updated_at", String(32), nullable=False),
    Column("execution_id", Integer, nullable=True),
    Column("note", Text, nullable=True),
    Index("ix_proposals_fingerprint", "fingerprint"),
)
