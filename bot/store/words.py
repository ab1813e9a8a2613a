"""The bot's words for what it stores: execution states and audit event kinds.

One word per concept, spelled once: code names ``State.AWAITING_APPROVAL`` and
``Kind.STEP_STARTED`` instead of repeating bare strings. Both are ``StrEnum``s, so a
member *is* its string: equal to it and hashed like it, json-encoded and bound to the
database as it. Rows, audit events and audit hashes are the same as before these
enums existed, and a string read back from the database compares equal to a member.
"""

from __future__ import annotations

import enum


class State(enum.StrEnum):
    """An execution's state (``executions.state``); see bot.execution.executions."""

    # not started: waiting for approvals, or approved and waiting for an engine
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    # under way: an engine drives it
    RUNNING = "running"
    UNDOING = "undoing"
    # waiting for a person: `runbook resume` or `runbook cancel`
    HELD = "held"
    # ended
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    DENIED = "denied"
    EXPIRED = "expired"


NOT_STARTED = frozenset({State.AWAITING_APPROVAL, State.APPROVED})
UNDER_WAY = frozenset({State.RUNNING, State.UNDOING})
ACTIVE = NOT_STARTED | UNDER_WAY  # what engines pick up (held waits for a person)
TERMINAL = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.DENIED,
                      State.EXPIRED})
NOT_ENDED = frozenset(State) - TERMINAL  # ACTIVE and held


class Kind(enum.StrEnum):
    """An audit event's kind (``audit_events.kind``): every kind the bot writes."""

    # requests and decisions (bot.service, bot.execution.executions)
    REQUESTED = "requested"
    PLANNED = "planned"
    REFUSED = "refused"
    PREAPPROVAL_VOIDED = "preapproval_voided"
    APPROVED = "approved"
    APPROVAL_REFUSED = "approval_refused"
    DENIED = "denied"
    EXPIRED = "expired"
    CANCEL_REQUESTED = "cancel_requested"
    RESUME_REQUESTED = "resume_requested"
    FINISHED = "finished"
    # locks (bot.execution.locking)
    LOCK_TAKEN_OVER = "lock_taken_over"
    LOCKS_LENT = "locks_lent"
    LOCKS_RETURNED = "locks_returned"
    LOCKS_RELEASED = "locks_released"
    # the engine driving an execution (bot.execution.engine)
    STARTED = "started"
    RESUMED = "resumed"
    HELD = "held"
    REPLANNED = "replanned"
    APPROVAL_MISSING = "approval_missing"
    APPROVAL_VOIDED = "approval_voided"
    CHECK_SKIPPED = "check_skipped"
    CHECK_EVALUATED = "check_evaluated"
    STEP_SKIPPED = "step_skipped"
    STEP_STARTED = "step_started"
    STEP_FINISHED = "step_finished"
    STEP_FAILED = "step_failed"
    UNDO_STARTED = "undo_started"
    UNDO_FINISHED = "undo_finished"
    UNDO_FAILED = "undo_failed"
    UNDO_SKIPPED = "undo_skipped"
    # questions to people during a run (bot.execution.confirming)
    CONFIRMATION_REQUESTED = "confirmation_requested"
    CONFIRMED = "confirmed"
    CONFIRMATION_DECLINED = "confirmation_declined"
    # the bus bandwidth a shape of node set is judged against (bot.execution.baselines)
    NCCL_BASELINE_RECORDED = "nccl_baseline_recorded"
    # runbook versions (bot.runbooks.versions)
    RUNBOOK_VERSION_RECORDED = "runbook_version_recorded"
    # alert proposals (bot.alerts.proposing)
    PROPOSED = "proposed"
    PROPOSAL_REFUSED = "proposal_refused"
    PROPOSAL_STARTED = "proposal_started"
    QUARANTINE_REQUESTED = "quarantine_requested"  # an alert ran quarantine-node
    PROPOSAL_DISMISSED = "proposal_dismissed"
    ALERT_RESOLVED = "alert_resolved"
    ALERT_REFIRED = "alert_refired"
    # the breaker on automation (bot.alerts.breaker)
    BREAKER_TRIPPED = "breaker_tripped"
    BREAKER_RESET = "breaker_reset"
    # the audit log itself (bot.store.archive; the console's "Verify now")
    AUDIT_ARCHIVED = "audit_archived"
    CHAIN_VERIFIED = "chain_verified"
    # schedules (bot.schedule.scheduling, bot.schedule.scheduler)
    SCHEDULE_ADDED = "schedule_added"
    SCHEDULE_CHANGED = "schedule_changed"
    SCHEDULE_REFUSED = "schedule_refused"
    SCHEDULE_APPROVED = "schedule_approved"
    SCHEDULE_PAUSED = "schedule_paused"
    SCHEDULE_RESUMED = "schedule_resumed"
    SCHEDULE_REMOVED = "schedule_removed"
    SCHEDULE_FIRED = "schedule_fired"
    SCHEDULE_MISSED = "schedule_missed"
    SCHEDULER_JOB_FAILED = "scheduler_job_failed"
    # maintenance windows (bot.schedule.windows)
    WINDOW_CREATED = "window_created"
    WINDOW_REFUSED = "window_refused"
    WINDOW_APPROVED = "window_approved"
    WINDOW_CANCELLED = "window_cancelled"
    WINDOW_OPENING = "window_opening"
    WINDOW_OPENED = "window_opened"
    WINDOW_FAILED = "window_failed"
    WINDOW_MISSED = "window_missed"
    WINDOW_CLOSING = "window_closing"
    WINDOW_RUN_REQUESTED = "window_run_requested"
    WINDOW_CLOSE_REQUESTED = "window_close_requested"
    WINDOW_CLOSED = "window_closed"
