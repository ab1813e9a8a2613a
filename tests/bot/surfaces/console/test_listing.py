"""The console's executions table (bot.surfaces.console.filters, executions_page; the SQL in
bot.store.listing): every filter against an independent model of the rows, every sort,
keyset paging that visits the filtered set exactly once in order (forwards and back), a
tired user's typos answered 400 with nothing changed, the viewer's scope, the columns new
executions fill, and revision 0010's backfill of executions made before it."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.execution.engine import Engine
from bot.service import Service
from bot.store import listing
from bot.store.schema import execution_nodes, executions
from bot.surfaces.console import filters, scope
from bot.surfaces.console.app import BadRequest
from bot.surfaces.console.identity import Viewer
from tests.bot import fakes
from tests.bot.execution.test_engine import record, runbook
from tests.bot.surfaces.console.seeded import (
    CONSOLE,
    NODES,
    RUNBOOKS,
    SOURCES,
    STATES,
    USERS,
    Client,
    Row,
    expected,
    seed,
    snapshot,
)
from tests.conftest import BotFactory

AUDITOR = Viewer("carol", auditor=True)
SORT_KEYS = tuple(filters.SORTS)


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


def ids_of(bot: Service, query: list[tuple[str, str]], size: int = 500,
           viewer: Viewer = AUDITOR) -> list[int]:
    flt, sort, _ = filters.parse(query)
    with bot.db.connect() as conn:
        allowed = scope.runbooks_in_scope(conn, viewer, bot.config)
        found = listing.page(conn, flt, sort, allowed, size)
    return [row["id"] for row in found.rows]


def model(rows: list[Row], query: list[tuple[str, str]]) -> list[int]:
    flt, sort, _ = filters.parse(query)
    return expected(rows, flt, sort)


FILTERS = [
    [("runbook", "drain")], [("version", "1.1.0")], [("node", "gpu03")],
    [("node", "gpu[01-02]")], [("node", "gpu[05-08]"), ("runbook", "swap")],
    [("requester", "bob")], [("approver", "dave")], [("source", "alert")],
    [("source", "window")], [("state", "failed")], [("state", "failed"), ("state", "running")],
    [("state", "succeeded,cancelled")], [("since", "2026-11-30T08:05:00Z")],
    [("until", "2026-11-30T08:07")],
    [("since", "2026-11-30 08:03"), ("until", "2026-11-30T08:09:00+00:00")],
    [("break_glass", "yes")], [("break_glass", "no")], [("failed_checks", "yes")],
    [("failed_checks", "no")], [("runbook", "drain"), ("state", "failed"), ("approver", "bob")],
    [("break_glass", "any"), ("failed_checks", "any"), ("runbook", "")],
    [("change", "CHG1002")], [("change", "CHG1000"), ("state", "failed")],
]


@pytest.mark.parametrize("query", FILTERS, ids=lambda q: "&".join(f"{k}={v}" for k, v in q))
def test_each_filter_selects_what_the_model_selects(seeded: tuple[Service, list[Row]],
                                                     query: list[tuple[str, str]]) -> None:
    bot, rows = seeded
    wanted = model(rows, query)
    assert ids_of(bot, query) == wanted
    assert wanted or query == FILTERS[-1]  # the seeded rows make every filter match some


def test_a_denial_is_not_an_approval(seeded: tuple[Service, list[Row]]) -> None:
    bot, rows = seeded
    for user in USERS:
        assert set(ids_of(bot, [("approver", user)])) == {r.id for r in rows
                                                          if user in r.approvers}


@pytest.mark.parametrize("key", SORT_KEYS)
@pytest.mark.parametrize("order", ["asc", "desc"])
def test_each_sort_orders_rows_with_ties_broken_by_id(seeded: tuple[Service, list[Row]],
                                                       key: str, order: str,
                                                       seeded_db: tuple[str, list[Row]]) -> None:
    bot, rows = seeded
    query = [("sort", key), ("order", order)]
    found = ids_of(bot, query)
    assert sorted(found) == sorted(r.id for r in rows)
    if seeded_db[0].startswith("sqlite"):  # the model orders text as SQLite does
        assert found == model(rows, query)


def pages(bot: Service, query: list[tuple[str, str]], size: int) -> list[list[int]]:
    """Every page, following the "after" cursors from the first."""
    flt, sort, _ = filters.parse(query)
    found: list[list[int]] = []
    after = ""
    with bot.db.connect() as conn:
        while True:
            page = listing.page(conn, flt, sort, None, size, after=after)
            found.append([row["id"] for row in page.rows])
            assert (page.before is None) == (len(found) == 1)
            if page.after is None:
                return found
            after = page.after


QUERIES = st.lists(st.one_of(
    st.tuples(st.just("runbook"), st.sampled_from(RUNBOOKS)),
    st.tuples(st.just("node"), st.sampled_from([*NODES[:4], "gpu[02-05]"])),
    st.tuples(st.just("requester"), st.sampled_from(USERS)),
    st.tuples(st.just("approver"), st.sampled_from(USERS)),
    st.tuples(st.just("source"), st.sampled_from(SOURCES)),
    st.tuples(st.just("state"), st.sampled_from(STATES)),
    st.tuples(st.just("since"), st.sampled_from(["2026-11-30T08:04", "2026-11-30T08:10"])),
    st.tuples(st.just("break_glass"), st.sampled_from(["yes", "no"])),
    st.tuples(st.just("failed_checks"), st.sampled_from(["yes", "no"])),
), max_size=2, unique_by=lambda item: item[0] if item[0] != "state" else item[1])


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=QUERIES, key=st.sampled_from(SORT_KEYS), order=st.sampled_from(["asc", "desc"]),
       size=st.integers(1, 9))
def test_paging_visits_the_filtered_set_once_in_order_both_ways(
        seeded: tuple[Service, list[Row]], query: list[tuple[str, str]], key: str, order: str,
        size: int) -> None:
    bot, rows = seeded
    full = [*query, ("sort", key), ("order", order)]
    forward = pages(bot, full, size)
    visited = [i for page in forward for i in page]
    assert visited == ids_of(bot, full)  # once each, in the order of the whole sorted set
    assert sorted(visited) == sorted(model(rows, full))
    assert all(len(page) == size for page in forward[:-1])
    flt, sort, _ = filters.parse(full)
    with bot.db.connect() as conn:  # back from the last page: the same pages, in reverse
        before = listing.page(conn, flt, sort, None, size, after="").before
        page = listing.page(conn, flt, sort, None, size, after=_cursor_of_last(conn, forward,
                                                                              flt, sort, size))
        for wanted in reversed(forward[:-1]):
            assert page.before is not None
            page = listing.page(conn, flt, sort, None, size, before=page.before)
            assert [row["id"] for row in page.rows] == wanted
        assert page.before is None and before is None


def _cursor_of_last(conn: Any, forward: list[list[int]], flt: filters.Filter,
                    sort: filters.Sort, size: int) -> str:
    """The "after" cursor that leads to the last page (empty for a single page)."""
    after = ""
    for _ in forward[:-1]:
        after = listing.page(conn, flt, sort, None, size, after=after).after or ""
    return after


def test_the_page_follows_its_own_links_through_the_real_app(
        seeded: tuple[Service, list[Row]]) -> None:
    bot, rows = seeded
    bot.config.console.page_size = 7
    client = Client(bot)
    url = "/ui/executions?runbook=drain&sort=finished&order=asc"
    seen: list[int] = []
    while url:
        answer = client.get(url)
        assert answer.status_code == 200, answer.text
        assert float(answer.headers["server-timing"].split("dur=")[1]) >= 0
        seen += [int(i) for i in re.findall(r'<a href="/ui/executions/(\d+)">', answer.text)]
        older = re.search(r'<a href="([^"]+)" rel="next">', answer.text)
        url = unescape(older.group(1)) if older else ""
    assert seen == model(rows, [("runbook", "drain"), ("sort", "finished"), ("order", "asc")])


def test_the_page_shows_the_filter_the_marks_and_links_that_keep_it(
        seeded: tuple[Service, list[Row]]) -> None:
    bot, rows = seeded
    page = Client(bot).get("/ui/executions?node=gpu[01-02]&state=failed&state=running"
                           "&break_glass=any&sort=requester&order=desc").text
    assert 'value="gpu[01-02]"' in page
    assert '<option value="failed" selected>' in page and '<option value="running" selected>' \
        in page
    assert 'aria-sort="descending"' in page and page.count("aria-sort=") == 1
    assert 'href="/ui/executions.csv?node=gpu%5B01-02%5D&amp;state=failed&amp;state=running' \
           '&amp;sort=requester&amp;order=desc"' in page
    assert 'href="/ui/events.jsonl?node=gpu%5B01-02%5D&amp;state=failed&amp;state=running"' \
        in page
    assert "scope=all" not in page  # the whole log only for a time range
    marked = [r for r in rows if r.break_glass and r.checks_failed and r.state in (
        "failed", "running") and r.nodes & {"gpu01", "gpu02"}]
    if marked:
        assert "break-glass</span>" in page and "failed check" in page
    for label in ("Runbook", "Node or hostlist", "Approved by", "Source", "State",
                  "Break-glass", "Failed checks", "Requested from (UTC)"):
        assert f">{label}" in page


BAD = {
    "state=faild": "state 'faild' is not one of",
    "since=yesterday": "since: 'yesterday' is not a UTC date or time",
    "until=2026-13-01": "until: '2026-13-01' is not a UTC date or time",
    "since=2026-12-02&until=2026-12-01": "must be before until",
    "sort=runbok": "did you mean 'runbook'",
    "order=up": "order 'up' is not asc or desc",
    "source=slack": "source 'slack' is not one of: cli, chat",
    "break_glass=maybe": "break_glass 'maybe' is not one of",
    "staet=failed": "unknown parameter 'staet' (did you mean 'state'?)",
    "node=gpu[01-": "node:",
    "node=gpu[0-99999]": "node:",
    "runbook=a&runbook=b": "runbook is given 2 times",
    "runbook=" + "x" * 10_000: "runbook: at most 200 characters (this one has 10,000)",
    "x" * 10_000 + "=1": "unknown parameter",
    "requester=al%00ice": "requester: only printable characters",
    "after=bm90IGEgY3Vyc29y": "the page cursor is not one this console made",
    "after=!!": "the page cursor is not one this console made",
    "after=a&before=b": "give after or before, not both",
}


@pytest.mark.parametrize("query", list(BAD), ids=lambda q: q[:40])
def test_a_tired_users_typos_get_400_naming_the_problem_and_change_nothing(
        seeded: tuple[Service, list[Row]], query: str) -> None:
    bot, _ = seeded
    before = snapshot(bot.db)
    answer = Client(bot).get(f"/ui/executions?{query}")
    assert answer.status_code == 400, answer.text[:300]
    assert unescape(BAD[query]) in unescape(answer.text)
    assert len(answer.text) < 20_000  # the 10,000 characters are not echoed back
    assert snapshot(bot.db) == before


def test_a_cursor_of_another_sort_is_refused(seeded: tuple[Service, list[Row]]) -> None:
    bot, _ = seeded
    flt, by_runbook, _ = filters.parse([("sort", "runbook")])
    with bot.db.connect() as conn:
        cursor = listing.page(conn, flt, by_runbook, None, 5).after
    assert cursor is not None
    client = Client(bot)
    assert client.get(f"/ui/executions?sort=runbook&after={cursor}").status_code == 200
    for other in ("sort=state", "sort=runbook&order=desc", ""):
        answer = client.get(f"/ui/executions?{other}&after={cursor}")
        assert answer.status_code == 400
        assert "belongs to another sort (runbook asc" in answer.text


def test_filters_parse_to_what_links_give_back() -> None:
    flt, sort, rest = filters.parse([("state", "failed, running"), ("node", " gpu[01-03] "),
                                     ("since", "2026-11-30"), ("break_glass", "any"),
                                     ("sort", "state"), ("after", "abc")])
    assert flt.states == ("failed", "running") and flt.nodes == ("gpu01", "gpu02", "gpu03")
    assert flt.since_at == "2026-11-30T00:00:00.000000Z" and rest == {"after": "abc"}
    assert flt.params() == [("node", "gpu[01-03]"), ("state", "failed"), ("state", "running"),
                            ("since", "2026-11-30")]
    assert (sort.key, sort.order) == ("state", "asc")
    assert filters.parse(flt.params() + sort.params())[:2] == (flt, sort)
    with pytest.raises(BadRequest, match="scope"):
        filters.parse([("scope", "all")])


def test_requesters_see_the_runbooks_they_may_request_auditors_everything(
        seeded: tuple[Service, list[Row]], monkeypatch: pytest.MonkeyPatch) -> None:
    bot, rows = seeded
    client = Client(bot)
    everything = [r.id for r in sorted(rows, key=lambda r: (r.requested_at, r.id),
                                       reverse=True)]
    alice = Viewer("alice", auditor=False)
    assert ids_of(bot, [], viewer=alice) == everything  # today: every runbook
    assert client.get("/ui/executions", user="nobody").status_code == 403
    # a per-runbook policy plugs in at scope.visible: the table and its exports follow it
    monkeypatch.setattr(scope, "visible", lambda viewer, runbook, config:
                        viewer.auditor or runbook != "swap")
    assert ids_of(bot, [], viewer=alice) == [i for i in everything
                                             if rows[i - 1].runbook != "swap"]
    assert ids_of(bot, [("runbook", "swap")], viewer=alice) == []
    assert ids_of(bot, [], viewer=AUDITOR) == everything
    page = client.get("/ui/executions?runbook=swap&sort=state", user="alice")
    assert page.status_code == 200 and "No execution matches." in page.text
    assert client.get("/ui/executions.csv?runbook=swap", user="alice").text.count("\n") == 1
    assert ',swap,' in client.get("/ui/executions.csv?runbook=swap").text


def test_an_execution_of_a_runbook_never_recorded_is_for_auditors_only(
        make_bot: BotFactory, db_url: str) -> None:
    bot = make_bot({}, url=db_url, console=CONSOLE)
    seed(bot.db, count=3)
    with bot.db.begin() as conn:
        conn.execute(executions.update().where(executions.c.id == 1).values(runbook="ghost"))
    assert 1 not in ids_of(bot, [], viewer=Viewer("alice", auditor=False))
    assert 1 in ids_of(bot, [], viewer=AUDITOR)


# --- the write side: what new executions fill in -----------------------------------------

FLEET = runbook([record("a", "{{ nodes }}")], name="fleet", risk="medium",
                params={"nodes": {"type": "nodes", "required": True},
                        "requeue": {"type": "bool", "default": False,
                                    "weakens_guard": "changed"}},
                locks=[])
FAILING = runbook([record("a", "a")], pre_checks=[
    {"name": "gpu idle", "promql": "max(DCGM_FI_DEV_GPU_UTIL)", "expect": "< 5"}])


def test_new_executions_fill_source_nodes_break_glass_and_failed_checks(
        make_bot: BotFactory, db_url: str) -> None:
    bot = make_bot({"demo": FAILING, "fleet": FLEET}, url=db_url, console=CONSOLE)
    failing = bot.request("demo", {"node": "gpu02"}, "alice", source="alert")
    engine = Engine(bot, sleep=lambda s: None)
    try:
        assert engine.drive(failing).state == "failed"
    finally:
        engine.close()
    fleet = bot.request("fleet", {"nodes": "gpu[01-03]", "requeue": "yes"}, "bob",
                        source="chat", break_glass=True)
    bot.approve(fleet, "carol")
    with bot.db.connect() as conn:
        found = {row.id: row for row in conn.execute(executions.select())}
        nodes = sorted(tuple(r) for r in conn.execute(execution_nodes.select()))
    assert (found[failing].source, found[failing].break_glass,
            found[failing].checks_failed) == ("alert", False, 1)
    assert (found[fleet].source, found[fleet].break_glass,
            found[fleet].checks_failed) == ("chat", True, 0)
    assert nodes == [("gpu01", fleet), ("gpu02", failing), ("gpu02", fleet), ("gpu03", fleet)]
    assert ids_of(bot, [("node", "gpu03")]) == [fleet]
    assert ids_of(bot, [("node", "gpu02")]) == [fleet, failing]
    assert ids_of(bot, [("approver", "carol"), ("break_glass", "yes")]) == [fleet]
    assert ids_of(bot, [("failed_checks", "yes"), ("source", "alert")]) == [failing]
    page = Client(bot).get("/ui/executions").text
    assert "gpu[01-03]" in page and ">carol<" in page and "1 failed check<" in page
