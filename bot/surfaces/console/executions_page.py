"""GET /ui/executions: the filtered, sorted, paged table of executions, with links that carry
the filter (sort headers, Newer/Older, the exports of exactly this set)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from starlette.responses import Response

from bot.store import listing
from bot.store.db import READ_ONLY
from bot.surfaces.console import exports, filters, scope
from bot.surfaces.console.app import PREFIX, Ask, BadRequest, PageRoute
from bot.surfaces.console.filters import TIME_SORTS, Filter, Sort

# (heading, sort key or "" for a column that does not sort)
COLUMNS = (("ID", ""), ("Runbook", "runbook"), ("Version", ""), ("State", "state"),
           ("Nodes", ""), ("Source", ""), ("Requested by", "requester"), ("Approvers", ""),
           ("Requested (UTC)", "requested"), ("Finished (UTC)", "finished"), ("Marks", ""))


def executions(ask: Ask) -> Response:
    flt, sort, rest = filters.parse(ask.query.multi_items())
    size = ask.service.config.console.page_size
    with ask.service.db.connect() as conn:
        conn.execution_options(**READ_ONLY)
        allowed = scope.runbooks_in_scope(conn, ask.viewer, ask.service.config)
        try:
            found = listing.page(conn, flt, sort, allowed, size, after=rest.get("after", ""),
                                 before=rest.get("before", ""))
        except listing.BadCursor as exc:
            raise BadRequest(str(exc)) from None
        rows = listing.decorate(conn, found.rows)
        runbooks = allowed if allowed is not None else listing.runbook_names(conn)
    return ask.page("executions.html", flt=flt, sort=sort, rows=rows, runbooks=runbooks,
                    headers=headers(flt, sort), pager=pager(flt, sort, found),
                    sorted_by=f"{sort.key}, {order_words(sort)}",
                    downloads=downloads(flt, sort, ask.viewer.auditor),
                    sources=filters.SOURCES, states=filters.STATES)


def href(path: str, flt: Filter, *more: tuple[str, str]) -> str:
    query = urlencode([*flt.params(), *more])
    return f"{PREFIX}{path}" + (f"?{query}" if query else "")


@dataclass(frozen=True)
class Header:
    label: str
    href: str  # "" for a column that does not sort
    aria_sort: str  # ascending, descending, or "" when the table is not sorted by it
    hint: str  # what following the link does


def headers(flt: Filter, sort: Sort) -> list[Header]:
    """Column headings; a sortable one links to the table sorted by it (the other way
    round when it already is; newest first for times, A to Z for words)."""
    found = []
    for label, key in COLUMNS:
        if not key:
            found.append(Header(label, "", "", ""))
            continue
        current = sort.key == key
        descending = not sort.descending if current else key in TIME_SORTS
        target = Sort(key, descending)
        found.append(Header(label, href("/executions", flt, *target.params()),
                            ("descending" if sort.descending else "ascending") if current
                            else "", f"sort by {label.lower()}, {order_words(target)}"))
    return found


def order_words(sort: Sort) -> str:
    if sort.key in TIME_SORTS:
        return "newest first" if sort.descending else "oldest first"
    return "Z to A" if sort.descending else "A to Z"


@dataclass(frozen=True)
class Pager:
    before_href: str
    before_label: str
    after_href: str
    after_label: str


def pager(flt: Filter, sort: Sort, found: listing.Page) -> Pager:
    """The links to the pages before and after this one: Newer and Older when the table is
    sorted by a time, Previous and Next otherwise."""
    labels = ("Previous", "Next")
    if sort.key in TIME_SORTS:
        labels = ("Newer", "Older") if sort.descending else ("Older", "Newer")
    before = href("/executions", flt, *sort.params(), ("before", found.before)) \
        if found.before else ""
    after = href("/executions", flt, *sort.params(), ("after", found.after)) \
        if found.after else ""
    return Pager(before, labels[0], after, labels[1])


@dataclass(frozen=True)
class Download:
    label: str
    href: str


def downloads(flt: Filter, sort: Sort, auditor: bool) -> list[Download]:
    """Exports of exactly the filtered set; for an auditor with at most a time range, also
    the whole log in that range (what ``runbook audit export`` writes)."""
    found = [Download("Executions (CSV)", href("/executions.csv", flt, *sort.params())),
             Download("Executions (JSON lines)", href("/executions.jsonl", flt, *sort.params())),
             Download("Their audit events (JSON lines)", href("/events.jsonl", flt)),
             Download("Their audit events (CSV)", href("/events.csv", flt))]
    if auditor and flt.only_time():
        found += [Download("The whole audit log in this time range (JSON lines)",
                           href("/events.jsonl", flt, ("scope", "all"))),
                  Download("The whole audit log in this time range (CSV)",
                           href("/events.csv", flt, ("scope", "all")))]
    return found


ROUTES: list[PageRoute] = [("/executions", executions, ("GET",)), *exports.ROUTES]
