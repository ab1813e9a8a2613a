"""Tables. Timestamps are UTC ISO-8601 text (readable by auditors, identical on every backend).

Changing a table means a new Alembic revision in ``migrations/versions``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    Unicode,
    false,
    func,
    literal_column,
)
from sqlalchemy.sql.elements import ColumnElement

metadata = MetaData()
UNFINISHED = "9999-12-31T23:59:59.999999Z"  # an unfinished execution's finished-time sort key
# The console's finished-time sort, with a literal (not a bound parameter) so that queries
# match ix_executions_finished. SQLite cannot reflect that expression index: a migration that
# recreates executions there (batch mode) must create the index again.
FINISHED_SORT: ColumnElement[Any] = func.coalesce(literal_column("finished_at"),
                                                  literal_column(f"'{UNFINISHED}'"))

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
    # bumped by every transition: decisions are compare-and-set on it (revision 0006)
    Column("row_version", Integer, nullable=False, default=0),
    # bumped by every claim: an engine writes only while the epoch is still its own
    Column("epoch", Integer, nullable=False, default=0),
    # revision 0010, for the console's filters (also in the audit log: these make them fast)
    Column("source", String(16), nullable=True),  # cli, chat, alert, schedule, window
    Column("break_glass", Boolean, nullable=False, default=False, server_default=false()),
    Column("checks_failed", Integer, nullable=False, default=0, server_default="0"),
    # revision 0012: the request's change reference (change=REF), for the console's filter
    Column("change", String(64), nullable=True),
    # keyset paging of the console: (sort value, id) for each sort, which also serve the
    # filters on these columns (revision 0010); unfinished executions sort as the latest
    Index("ix_executions_state", "state", "id"),
    Index("ix_executions_requested", "requested_at", "id"),
    Index("ix_executions_finished", FINISHED_SORT, "id"),
    Index("ix_executions_runbook", "runbook", "id"),
    Index("ix_executions_requested_by", "requested_by", "id"),
    Index("ix_executions_change", "change", "id"),
)

# The nodes each execution's plan locks (its node:NAME locks, hostlists expanded): which
# executions touched a node (revision 0010).
execution_nodes = Table(
    "execution_nodes",
    metadata,
    Column("node", String(200), primary_key=True),
    Column("execution_id", Integer, ForeignKey("executions.id"), primary_key=True),
    Index("ix_execution_nodes_execution", "execution_id"),
)

# The secret parameters of an execution that has not ended (bot/runbooks/secrets.py):
# encrypted with the site key; deleted when the execution ends (revision 0013).
execution_secrets = Table(
    "execution_secrets",
    metadata,
    Column("execution_id", Integer, ForeignKey("executions.id"), primary_key=True),
    Column("name", String(64), primary_key=True),
    Column("sealed", Text, nullable=False),
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
    # one decision per approver and plan: a double click or a race cannot count twice
    Index("ux_approvals_decision", "execution_id", "user", "plan_hash", unique=True),
    Index("ix_approvals_user", "user", "execution_id"),  # the console's approver filter
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
    Index("ix_audit_kind_seq", "kind", "seq"),  # revision 0010: the newest of one kind
)

# Events moved out of audit_events into a verified file (bot.store.archive): the log then
# starts at up_to_seq + 1, chained to head_hash.
audit_archives = Table(
    "audit_archives",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("from_seq", Integer, nullable=False),
    Column("up_to_seq", Integer, nullable=False),
    Column("head_hash", String(64), nullable=False),
    Column("file", Text, nullable=False),
    Column("sha256", String(64), nullable=False),  # of the archive file
    Column("created_at", String(32), nullable=False),
    Column("created_by", String(128), nullable=False),
)

# How far each destination of the audit log (a syslog receiver, an OTLP collector) has
# accepted it (bot.store.shipping): the shipper sends what follows ``seq`` (revision 0009).
audit_cursors = Table(
    "audit_cursors",
    metadata,
    Column("destination", String(255), primary_key=True),  # its address (syslog://h:p, URL)
    Column("seq", Integer, nullable=False),  # the last event it accepted (0: none yet)
    Column("hash", String(64), nullable=False),  # that event's hash ("" for none)
    Column("updated_at", String(32), nullable=False),
    Column("skipped", Integer, nullable=False),  # events gone before they were shipped
    Column("rejected", Integer, nullable=False),  # records it took but said it dropped
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

# The bus bandwidth each shape of node set reached in its first nccl-test run (or the run a
# person made it with rebaseline=true): slurm.nccl_test fails a later run below a share of it
# (revision 0011). Keyed by the shape, not the nodes: see adapters.slurm.nccltest.
nccl_baselines = Table(
    "nccl_baselines",
    metadata,
    Column("key", String(255), primary_key=True),  # all_reduce_perf 2x8 MODEL up to N B
    Column("busbw", Float, nullable=False),  # GB/s at the largest size
    Column("avg_busbw", Float, nullable=False),  # nccl-tests' "Avg bus bandwidth"
    Column("nodes", Text, nullable=False),  # hostlist of the run that measured it
    Column("execution_id", Integer, nullable=False),
    Column("recorded_at", String(32), nullable=False),
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
    # the firing this proposal is about (Alertmanager's startsAt, as sent) and when the bot
    # last heard its alert resolve: a re-sent or flapping alert updates it (bot.alerts)
    Column("alert_started_at", String(40), nullable=True),
    Column("resolved_at", String(32), nullable=True),
    Index("ix_proposals_fingerprint", "fingerprint"),
)

# Chat surfaces (Slack): one row per message the bot keeps up to date, keyed by what
# it shows ("execution:12", "proposal:3", "confirm:12:swap"), so a restart or a second
# replica never posts it twice.
chat_messages = Table(
    "chat_messages",
    metadata,
    Column("subject", String(128), primary_key=True),
    Column("channel", String(64), nullable=False),
    Column("ts", String(32), nullable=True),  # None while the post is in flight
    Column("rendered", String(64), nullable=True),  # sha256 of what the message shows now
    Column("final", Integer, nullable=False, default=0),  # 1: nothing more will change
    Column("updated_at", String(32), nullable=False),
)

# Requests already acted on (Slack retries, Socket Mode redelivery): key -> first seen.
chat_deliveries = Table(
    "chat_deliveries",
    metadata,
    Column("key", String(200), primary_key=True),
    Column("received_at", String(32), nullable=False),
)

# --- schedules and maintenance windows (revision 0005) -----------------------------------

schedules = Table(
    "schedules",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("runbook", String(64), nullable=False),
    Column("params", Text, nullable=False),  # canonical JSON of the parameters as given
    Column("cron", String(200), nullable=True),  # crontab expression (5 fields), or
    Column("at", String(32), nullable=True),  # one time, UTC ISO-8601
    Column("timezone", String(64), nullable=False),  # the cron's (and the given at's) zone
    Column("approve", String(16), nullable=False),  # ahead | when_due
    Column("plan_hash", String(64), nullable=False),  # the plan approvals ahead bind to
    Column("created_by", String(128), nullable=False),  # the requester of every run
    Column("created_at", String(32), nullable=False),
    Column("source", String(16), nullable=False),  # cli | chat | config
    Column("config_name", String(64), nullable=True, unique=True),  # schedules: in the config
    Column("state", String(16), nullable=False),  # active, paused, removed, done, missed
    Column("revision", Integer, nullable=False, default=1),  # bumped when the trigger changes
    Column("last_handled", String(32), nullable=True),  # the last fire time dealt with
    Column("last_outcome", Text, nullable=True),
    Column("last_execution_id", Integer, nullable=True),
    Column("missed", Integer, nullable=False, default=0),  # fire times reported missed
    Column("updated_at", String(32), nullable=False),
)

approvals_ahead = Table(  # approvals collected before a run exists (schedules, windows)
    "approvals_ahead",
    metadata,
    Column("subject", String(64), primary_key=True),  # schedule:ID | window:ID
    Column("user", String(128), primary_key=True),
    Column("plan_hash", String(64), primary_key=True),  # a schedule's plan, a window's digest
    Column("at", String(32), nullable=False),
)

scheduled_runs = Table(  # one row per fire time dealt with: a fire time never runs twice
    "scheduled_runs",
    metadata,
    Column("subject", String(64), primary_key=True),  # schedule:ID, window:ID:open|close
    Column("scheduled_for", String(32), primary_key=True),  # UTC ISO-8601
    Column("outcome", String(16), nullable=False),  # requested, refused, missed, skipped
    Column("execution_id", Integer, nullable=True),
    Column("detail", Text, nullable=True),
    Column("at", String(32), nullable=False),
)

maintenance_windows = Table(
    "maintenance_windows",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("nodes", Text, nullable=False),  # hostlist of the bot's node names
    Column("starts_at", String(32), nullable=False),  # UTC ISO-8601
    Column("duration_seconds", Float, nullable=False),
    Column("reason", Text, nullable=False),
    Column("runbooks", Text, nullable=False),  # JSON [{runbook, params}] to run inside
    Column("plans", Text, nullable=False),  # JSON [{runbook, params, plan_hash}], open first
    Column("digest", String(64), nullable=False),  # sha256 of the plans: approvals bind to it
    Column("created_by", String(128), nullable=False),
    Column("created_at", String(32), nullable=False),
    Column("state", String(16), nullable=False),  # scheduled, opening, open, closing, closed,
    # cancelled, missed, failed
    Column("open_execution_id", Integer, nullable=True),
    Column("close_execution_id", Integer, nullable=True),
    Column("runs", Text, nullable=False),  # JSON [{runbook, params, execution_id, state}]
    Column("report", Text, nullable=True),
    Column("updated_at", String(32), nullable=False),
    Index("ix_maintenance_windows_state", "state"),
)

# APScheduler's SQLAlchemyJobStore owns this table (same columns as it declares); the
# migration creates it so that the schema has one owner.
apscheduler_jobs = Table(
    "apscheduler_jobs",
    metadata,
    Column("id", Unicode(191), primary_key=True),
    Column("next_run_time", Float(25), index=True),
    Column("job_state", LargeBinary, nullable=False),
)
