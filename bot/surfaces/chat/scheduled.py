"""The ``schedule`` and ``window`` verbs of the chat grammar (bot.surfaces.chat.commands), also
behind ``runbook schedule ...`` and ``runbook window ...``.

Only words are read here (a window's ``runbooks=`` list too); the command paths (bot.commands)
decide and record everything.
"""

from __future__ import annotations

from bot import commands
from bot.schedule import scheduling, windows
from bot.service import Service
from bot.surfaces import schedule_text
from bot.surfaces.chat.ids import is_id
from bot.surfaces.chat.reply import Reply
from bot.surfaces.chat.words import parse_assignments, runbook_list
from kit.errors import Refused

SCHEDULE_USAGE = ('schedule add NAME key=value... cron="0 2 * * SAT"|at="2026-12-05 02:00" '
                  "[tz=ZONE] [approve=ahead] | schedule list [all] | schedule show|approve|"
                  "pause|resume|remove ID")
WINDOW_USAGE = ('window create NODES start=now|"YYYY-MM-DD HH:MM" duration=4h [tz=ZONE] '
                '[reason=TEXT] [runbooks="NAME k=v; NAME k=v"] | window list [all] | '
                "window show|approve|open|cancel ID")


def _usage(text: str) -> Reply:
    return Reply(f"usage: {text}", ok=False)


def _id(args: list[str]) -> int | None:
    return int(args[1]) if len(args) == 2 and is_id(args[1]) else None


def schedule(service: Service, args: list[str], user: str, source: str = "chat") -> Reply:
    """The ``schedule`` verb::

        schedule add NAME key=value... cron="0 2 * * SAT" [tz=Europe/Istanbul] [approve=ahead]
        schedule add NAME key=value... at="2026-12-05 02:00" [tz=...] [approve=ahead]
        schedule [list [all]] | show ID | approve ID | pause ID | resume ID | remove ID
    """
    verb = args[0].lower() if args else "list"
    if verb == "list":
        listed = commands.list_schedules(service, everything=args[1:2] == ["all"])
        lines = [schedule_text.schedule_line(service, s) for s in listed]
        return Reply("\n".join(lines) or "no schedules")
    if verb == "add":
        return _add(service, args[1:], user, source)
    schedule_id = _id(args)
    if verb not in ("show", "approve", "pause", "resume", "remove") or schedule_id is None:
        return _usage(SCHEDULE_USAGE)
    if verb == "show":
        found = commands.get_schedule(service, schedule_id)
        return Reply(schedule_text.schedule_text(service, found))
    if verb == "approve":
        found, names, note = commands.approve_schedule(service, schedule_id, user)
        required = service.plan(found.runbook, found.params).approval.required
        return Reply(f"schedule {found.id}: approved ahead by {user} "
                     f"({len(names)}/{required}: {', '.join(names)})"
                     + (f"; {note}" if note else ""))
    found = commands.steer_schedule(service, schedule_id, user, verb)
    return Reply(f"schedule {found.id}: {found.state} ({verb} by {user})")


def _add(service: Service, words: list[str], user: str, source: str) -> Reply:
    if not words or "=" in words[0]:
        return _usage(SCHEDULE_USAGE)
    name, values = words[0], parse_assignments(words[1:])
    own = {key: values.pop(key) for key in scheduling.OWN_KEYS if key in values}
    found = commands.add_schedule(service, name, values, user, cron=own.get("cron"),
                                  at=own.get("at"), tz=own.get("tz"),
                                  approve=own.get("approve", "when_due"), source=source)
    upcoming = scheduling.next_fire(found)
    required = service.plan(found.runbook, found.params).approval.required
    if required == 0:
        approval = "it needs no approval"
    elif found.approve == "ahead":
        approval = (f"approvers approve it ahead: `schedule approve {found.id}` "
                    f"({required} needed); without them each run waits for approval")
    else:
        approval = "approvers are asked when it fires"
    return Reply(f"schedule {found.id}: {found.runbook} {found.when}, next "
                 f"{scheduling.utc_iso(upcoming) if upcoming else 'never'} UTC; runs as "
                 f"{found.created_by}; {approval}")


def window(service: Service, args: list[str], user: str) -> Reply:
    """The ``window`` verb::

        window create NODES start=now|"2026-12-05 02:00" duration=4h [tz=...] [reason=...]
                      [runbooks="NAME key=value...; NAME key=value..."]
        window [list [all]] | show ID | approve ID | open ID | cancel ID
    """
    verb = args[0].lower() if args else "list"
    if verb == "list":
        listed = commands.list_windows(service, everything=args[1:2] == ["all"])
        lines = [schedule_text.window_line(w) for w in listed]
        return Reply("\n".join(lines) or "no maintenance windows")
    if verb == "create":
        return _create(service, args[1:], user)
    window_id = _id(args)
    if verb not in ("show", "approve", "open", "cancel") or window_id is None:
        return _usage(WINDOW_USAGE)
    if verb == "show":
        return Reply(schedule_text.window_text(service, commands.get_window(service, window_id)))
    if verb == "approve":
        found, names, note = commands.approve_window(service, window_id, user)
        return Reply(f"window {found.id}: approved ahead by {user} (approvers so far: "
                     f"{', '.join(names)})" + (f"; {note}" if note else ""))
    if verb == "open":
        found = commands.open_window(service, window_id, user)
        return Reply(f"window {found.id}: {found.state} (open-window execution "
                     f"{found.open_execution_id}, opened early by {user})"
                     if found.open_execution_id else f"window {found.id}: {found.state}: "
                     f"{found.report or ''}", ok=found.state != windows.FAILED,
                     execution_id=found.open_execution_id)
    found = commands.cancel_window(service, window_id, user)
    what = {windows.CANCELLED: "cancelled", windows.CLOSING: "closing now",
            windows.CLOSED: "closed"}.get(found.state, found.state)
    return Reply(f"window {found.id}: {what} ({user})", execution_id=found.close_execution_id)


def _create(service: Service, words: list[str], user: str) -> Reply:
    if not words or "=" in words[0]:
        return _usage(WINDOW_USAGE)
    nodes, values = words[0], parse_assignments(words[1:])
    unknown = sorted(set(values) - {"start", "duration", "runbooks", "reason", "tz"})
    if unknown or "start" not in values or "duration" not in values:
        return _usage(WINDOW_USAGE)
    found = commands.create_window(service, nodes, user, start=values["start"],
                                   duration=values["duration"],
                                   runbooks=_inside(service, nodes, user, values),
                                   reason=values.get("reason", "maintenance window"),
                                   tz=values.get("tz"))
    names = commands.window_approvers(service, found)
    needed = [f"{p['runbook']} {p['required']}" for p in found.plans if p["required"]]
    ask = (f"approvals ahead needed ({', '.join(needed)}): `window approve {found.id}`; "
           "without them it waits for approval when it opens") if needed and not names else ""
    return Reply(f"window {found.id}: {found.nodes} from {found.start:%Y-%m-%d %H:%M} UTC for "
                 f"{values['duration']}, {len(found.runs)} runbook(s) inside; {ask}".rstrip("; "))


def _inside(service: Service, nodes: str, user: str,
            values: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
    """The ``runbooks=`` list; text that does not read is a refused window, recorded too."""
    text = values.get("runbooks", "")
    try:
        return runbook_list(text)
    except Refused as exc:
        commands.refuse_window(service, user, nodes=nodes, start=values["start"],
                               duration=values["duration"], runbooks=text, problem=str(exc))
        raise
