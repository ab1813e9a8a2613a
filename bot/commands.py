"""The command paths of proposals, maintenance windows, schedules and the breaker: what every
surface (chat, Slack, the command line, the console) calls for them, as it calls ``Service``
for executions. Each path checks, records in the audit log and refuses in the module that
owns its rows (bot.alerts, bot.schedule); this module is the one door to them. The surfaces
may still read those modules' types, constants and pure text (``Window``, ``windows.ENDED``,
``breaker.status_text``); the leader's loops (the scheduler, the intake) call them directly.
"""

from __future__ import annotations

from collections.abc import Mapping

from bot.alerts import breaker, proposing
from bot.alerts.breaker import Status
from bot.alerts.proposing import Proposal
from bot.schedule import scheduling, windows
from bot.schedule.scheduling import Schedule
from bot.schedule.windows import Inside, Window
from bot.service import Service

# --- proposals ------------------------------------------------------------------------------


def list_proposals(service: Service, *, open_only: bool = True) -> list[Proposal]:
    return proposing.listing(service, open_only=open_only)


def get_proposal(service: Service, proposal_id: int) -> Proposal:
    return proposing.get(service, proposal_id)


def run_proposal(service: Service, proposal_id: int, user: str) -> int:
    """Request the proposal's runbook as ``user``; the execution's ID."""
    return proposing.run(service, proposal_id, user)


def dismiss_proposal(service: Service, proposal_id: int, user: str,
                     reason: str | None) -> Proposal:
    return proposing.dismiss(service, proposal_id, user, reason)


# --- the breaker -------------------------------------------------------------------------


def breaker_status(service: Service) -> Status:
    return breaker.status(service)


def breaker_tripped(service: Service) -> tuple[int, str] | None:
    """The audit sequence and reason of the trip in force, None while it is closed."""
    return breaker.tripped(service)


def reset_breaker(service: Service, user: str, reason: str) -> Status:
    return breaker.reset(service, user, reason)


# --- schedules -----------------------------------------------------------------------------


def list_schedules(service: Service, *, everything: bool = False) -> list[Schedule]:
    return scheduling.listing(service, everything=everything)


def get_schedule(service: Service, schedule_id: int) -> Schedule:
    return scheduling.get(service, schedule_id)


def add_schedule(service: Service, runbook: str, raw: Mapping[str, str], user: str, *,
                 cron: str | None = None, at: str | None = None, tz: str | None = None,
                 approve: str = "when_due", source: str = "cli") -> Schedule:
    return scheduling.add(service, runbook, raw, user, cron=cron, at=at, tz=tz,
                          approve=approve, source=source)


def approve_schedule(service: Service, schedule_id: int,
                     user: str) -> tuple[Schedule, list[str], str]:
    """(the schedule, its approvers ahead so far, a note)."""
    return scheduling.approve(service, schedule_id, user)


def steer_schedule(service: Service, schedule_id: int, user: str, verb: str) -> Schedule:
    """``pause``, ``resume`` or ``remove``."""
    return scheduling.steer(service, schedule_id, user, verb)


def schedule_approvers(service: Service, schedule: Schedule) -> list[str]:
    return scheduling.approvers_ahead(service, schedule)


# --- maintenance windows -------------------------------------------------------------------


def list_windows(service: Service, *, everything: bool = False) -> list[Window]:
    return windows.listing(service, everything=everything)


def get_window(service: Service, window_id: int) -> Window:
    return windows.get(service, window_id)


def create_window(service: Service, nodes: str, user: str, *, start: str, duration: str,
                  runbooks: Inside = (), reason: str = "maintenance window",
                  tz: str | None = None) -> Window:
    """Check, plan and store a window; ``runbooks`` is the list the surface read."""
    return windows.create(service, nodes, user, start=start, duration=duration,
                          runbooks=runbooks, reason=reason, tz=tz)


def refuse_window(service: Service, user: str, *, nodes: str, start: str, duration: str,
                  runbooks: str, problem: str) -> None:
    """Record a window refused before it could be read (its ``runbooks=`` text)."""
    windows.refused(service, user, nodes=nodes, start=start, duration=duration,
                    runbooks=runbooks, problem=problem)


def approve_window(service: Service, window_id: int,
                   user: str) -> tuple[Window, list[str], str]:
    """(the window, its approvers ahead so far, a note)."""
    return windows.approve(service, window_id, user)


def open_window(service: Service, window_id: int, user: str) -> Window:
    """Open a scheduled window now."""
    return windows.open_now(service, window_id, user)


def cancel_window(service: Service, window_id: int, user: str) -> Window:
    return windows.cancel(service, window_id, user)


def advance_windows(service: Service, window_id: int | None = None) -> list[str]:
    """Move windows on (the runbooks inside, closing); what happened, a line each."""
    return windows.advance(service, window_id)


def window_approvers(service: Service, window: Window) -> list[str]:
    return windows.approvers_ahead(service, window)


def window_systems(service: Service, window: Window) -> dict[str, str]:
    """The window's nodes as each system names them."""
    return windows.system_nodes(service, window.names)


def overdue_windows(service: Service) -> list[tuple[Window, list[int]]]:
    """Windows past their end still waiting for runs inside them, each with those executions."""
    return windows.overdue(service)
