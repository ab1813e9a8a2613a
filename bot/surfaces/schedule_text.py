"""Schedules and maintenance windows as text for people: one line in a list, the whole
story in ``show``. Reads only, through bot.commands; the rules live in bot.schedule."""

from __future__ import annotations

from bot import commands
from bot.runbooks.params import params_text
from bot.schedule import scheduling
from bot.schedule.scheduling import Schedule
from bot.schedule.windows import Window
from bot.service import Service
from kit.durations import format_duration


def schedule_line(service: Service, schedule: Schedule) -> str:
    upcoming = scheduling.next_fire(schedule)
    nxt = f"next {scheduling.utc_iso(upcoming)}" if upcoming else "no next run"
    approve = ""
    if schedule.approve == "ahead":
        names = commands.schedule_approvers(service, schedule)
        approve = f", approved ahead by {', '.join(names) or 'nobody yet'}"
    missed_text = f", MISSED {schedule.missed}" if schedule.missed else ""
    last = f"; last: {schedule.last_outcome}" if schedule.last_outcome else ""
    return (f"{schedule.id}: {schedule.runbook} {params_text(schedule.params)} "
            f"{schedule.when} [{schedule.state}] by {schedule.created_by}; {nxt}"
            f"{approve}{missed_text}{last}")


def schedule_text(service: Service, schedule: Schedule) -> str:
    names = commands.schedule_approvers(service, schedule)
    upcoming = scheduling.next_fire(schedule)
    lines = [
        f"schedule {schedule.id}: {schedule.runbook} — {schedule.state.upper()}",
        "parameters: " + params_text(schedule.params),
        f"when: {schedule.when}"
        + (f"; next {scheduling.utc_iso(upcoming)}" if upcoming else "; no next run"),
        f"requested by {schedule.created_by} (added {schedule.created_at[:19]}, source "
        f"{schedule.source}{', ' + schedule.config_name if schedule.config_name else ''})",
        ("approval: ahead, bound to plan " + schedule.plan_hash[:12] + "; approved by "
         + (", ".join(names) or "nobody yet") + f" (schedule approve {schedule.id})")
        if schedule.approve == "ahead" else "approval: approvers are asked when it fires",
        f"missed fire times: {schedule.missed}",
    ]
    if schedule.last_outcome:
        lines.append(f"last: {schedule.last_outcome} (fire time {schedule.last_handled})")
    return "\n".join(lines)


def window_line(window: Window) -> str:
    inside = ", ".join(run["runbook"] for run in window.runs) or "no runbooks"
    return (f"{window.id}: {window.nodes} from {window.start:%Y-%m-%d %H:%M} UTC for "
            f"{format_duration(window.duration_seconds)} [{window.state}] by "
            f"{window.created_by}; {inside}; {window.reason}")


def window_text(service: Service, window: Window) -> str:
    systems = commands.window_systems(service, window)
    names = commands.window_approvers(service, window)
    counts = ", ".join(
        f"{p['runbook']} {min(len(names), p['required'])}/{p['required']}"
        for p in window.plans if p["required"])
    lines = [
        f"window {window.id}: {window.nodes} — {window.state.upper()}",
        f"from {window.start:%Y-%m-%d %H:%M} UTC for {format_duration(window.duration_seconds)}"
        f" (until {window.end:%Y-%m-%d %H:%M} UTC); reason: {window.reason}",
        f"created by {window.created_by} at {window.created_at[:19]}",
        "opening: Slurm reservation window-{} on {}; cordon {}; silence alerts of {}".format(
            window.id, systems["slurm_nodes"] or "(no Slurm nodes)",
            systems["k8s_nodes"] or "(no Kubernetes nodes)",
            systems["alert_nodes"] or "(no Alertmanager configured)"),
        "approvals ahead: " + (", ".join(names) or "none yet")
        + (f" ({counts}; window approve {window.id})" if counts else ""),
        "runbooks inside:" if window.runs else "runbooks inside: none",
    ]
    for number, run in enumerate(window.runs, 1):
        ex = f" execution {run['execution_id']}," if run["execution_id"] else ""
        lines.append(f"  {number}. {run['runbook']} {params_text(run['params'])} —{ex} "
                     f"{run['state']}")
    if window.open_execution_id:
        lines.append(f"open: execution {window.open_execution_id}")
    if window.close_execution_id:
        lines.append(f"close: execution {window.close_execution_id}")
    if window.report:
        lines.append(f"report: {window.report}")
    lines.append(f"plans digest {window.digest[:16]}")
    return "\n".join(lines)
