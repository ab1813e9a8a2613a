"""The executions filter and sort, read from a page's URL (so that a link shares them) and
checked value by value: a value the console cannot use is a BadRequest that names it and
says what would do, before any query runs."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bot.store.audit import moment
from bot.store.words import State
from bot.surfaces.console.app import BadRequest
from kit import hostlist

TEXT = ("runbook", "version", "node", "requester", "approver", "change")
FILTERS = (*TEXT, "source", "state", "since", "until", "break_glass", "failed_checks")
PAGING = ("sort", "order", "after", "before")
# the words bot.request's callers give (the command line, the chat grammar behind Slack and
# `runbook chat`, alert proposals, schedules, maintenance windows)
SOURCES = {"cli": "command line", "chat": "chat (Slack, runbook chat)", "alert": "alert",
           "schedule": "schedule", "window": "maintenance window"}
STATES = tuple(state.value for state in State)
CHOICES = {"break_glass": ("any", "yes", "no"), "failed_checks": ("any", "yes", "no")}
# sort key in the URL -> column (finished: the unfinished sort as the latest)
SORTS = {"requested": "requested_at", "runbook": "runbook", "state": "state",
         "requester": "requested_by", "finished": "finished_at"}
TIME_SORTS = ("requested", "finished")
MAX_VALUE = 200
MAX_NODES = 4096  # a hostlist in the node filter names at most this many nodes


@dataclass(frozen=True)
class Filter:
    """Which executions; the defaults mean any. ``since``/``until`` are as typed (the URL
    keeps them so), ``since_at``/``until_at`` as the log stores times."""

    runbook: str = ""
    version: str = ""
    node: str = ""  # a node or a hostlist, as typed
    requester: str = ""
    approver: str = ""
    change: str = ""  # the request's change reference (change=REF)
    source: str = ""
    states: tuple[str, ...] = ()
    since: str = ""
    until: str = ""
    break_glass: str = "any"
    failed_checks: str = "any"
    nodes: tuple[str, ...] = ()  # ``node`` expanded
    since_at: str = ""
    until_at: str = ""

    def params(self) -> list[tuple[str, str]]:
        """The filter as URL parameters: only what narrows it, in a fixed order."""
        found = [(name, str(getattr(self, name))) for name in TEXT if getattr(self, name)]
        found += [("source", self.source)] if self.source else []
        found += [("state", state) for state in self.states]
        found += [(name, getattr(self, name)) for name in ("since", "until")
                  if getattr(self, name)]
        found += [(name, getattr(self, name)) for name in CHOICES if getattr(self, name) != "any"]
        return found

    def only_time(self) -> bool:
        """Nothing but a time range (or nothing): what ``runbook audit export`` can do."""
        return all(name in ("since", "until") for name, _ in self.params())


@dataclass(frozen=True)
class Sort:
    key: str = "requested"
    descending: bool = True

    @property
    def column(self) -> str:
        return SORTS[self.key]

    @property
    def order(self) -> str:
        return "desc" if self.descending else "asc"

    def params(self) -> list[tuple[str, str]]:
        return [] if self == Sort() else [("sort", self.key), ("order", self.order)]


def parse(items: Iterable[tuple[str, str]], extra: Sequence[str] = PAGING
          ) -> tuple[Filter, Sort, dict[str, str]]:
    """The filter, the sort and the other parameters ``extra`` allows, from a URL's query
    items; BadRequest for an unknown parameter or a value the console cannot use."""
    given: dict[str, list[str]] = {}
    for name, value in items:
        if name not in FILTERS and name not in extra:
            known = ", ".join((*FILTERS, *extra))
            raise BadRequest(f"unknown parameter {_shown(name)}{_hint(name, known.split(', '))}"
                             f" (the page takes: {known})")
        _check_text(name, value)
        if value.strip():
            given.setdefault(name, []).append(value.strip())
    for name, values in given.items():
        if len(values) > 1 and name != "state":
            raise BadRequest(f"{name} is given {len(values)} times; give it once")
    single = {name: values[0] for name, values in given.items()}
    sort = _sort(single.pop("sort", "requested"), single.pop("order", ""))
    rest = {name: single.pop(name) for name in extra if name in single}
    return _filter(single, given.get("state", [])), sort, rest


def _filter(single: dict[str, str], states: list[str]) -> Filter:
    text = {name: single[name] for name in TEXT if name in single}
    source = single.get("source", "")
    if source and source not in SOURCES:
        raise BadRequest(f"source {_shown(source)} is not one of: {', '.join(SOURCES)}"
                         + _hint(source, SOURCES))
    choices = {name: _choice(name, single.get(name, "any")) for name in CHOICES}
    since, until = single.get("since", ""), single.get("until", "")
    since_at, until_at = _time("since", since), _time("until", until)
    if since_at and until_at and since_at >= until_at:
        raise BadRequest(f"since ({since}) must be before until ({until}): nothing is both")
    return Filter(**text, source=source, states=_states(states), since=since, until=until,
                  **choices, nodes=_nodes(text.get("node", "")), since_at=since_at,
                  until_at=until_at)


def _states(values: list[str]) -> tuple[str, ...]:
    wanted = [word.strip() for value in values for word in value.split(",") if word.strip()]
    for word in wanted:
        if word not in STATES:
            raise BadRequest(f"state {_shown(word)} is not one of: {', '.join(STATES)}"
                             + _hint(word, STATES))
    return tuple(dict.fromkeys(wanted))


def _nodes(value: str) -> tuple[str, ...]:
    if not value:
        return ()
    try:
        return tuple(hostlist.expand(value, limit=MAX_NODES))
    except ValueError as exc:  # TooMany is one
        raise BadRequest(f"node: {exc} (give a node like gpu03 or a hostlist like "
                         "gpu[01-04])") from None


def _time(name: str, value: str) -> str:
    if not value:
        return ""
    try:
        return moment(value)
    except ValueError:
        raise BadRequest(f"{name}: {_shown(value)} is not a UTC date or time (like "
                         "2026-11-30 or 2026-11-30T10:00:00Z)") from None


def _choice(name: str, value: str) -> str:
    if value not in CHOICES[name]:
        raise BadRequest(f"{name} {_shown(value)} is not one of: {', '.join(CHOICES[name])}")
    return value


def _sort(key: str, order: str) -> Sort:
    if key not in SORTS:
        raise BadRequest(f"sort {_shown(key)} is not one of: {', '.join(SORTS)}"
                         + _hint(key, SORTS))
    if order not in ("", "asc", "desc"):
        raise BadRequest(f"order {_shown(order)} is not asc or desc")
    # without an order: newest first for a time, A to Z for a word
    return Sort(key, order == "desc" if order else key in TIME_SORTS)


def _check_text(name: str, value: str) -> None:
    if len(value) > MAX_VALUE:
        raise BadRequest(f"{name}: at most {MAX_VALUE} characters (this one has "
                         f"{len(value):,})")
    if not value.isprintable():
        raise BadRequest(f"{name}: only printable characters")


def _shown(value: str) -> str:
    return repr(value if len(value) <= 60 else value[:60] + "…")


def _hint(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
