"""The console's downloads (bot.surfaces.console.exports): exactly the filtered set of
executions as CSV and JSON lines, their audit events in the format of ``runbook audit
export`` (secrets hidden), the whole log in a time range byte-identical to ``runbook audit
export --since --until`` (in process, and through a real ``runbook serve`` against the real
command), the viewer's scope, names that say the filter, refusals, and streaming."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from bot.service import Service
from bot.store import audit
from bot.surfaces.console import exports, filters, scope
from bot.surfaces.console.scope import MASK
from tests.bot import fakes
from tests.bot.execution.test_engine import record, runbook
from tests.bot.runtime.test_access import free_port
from tests.bot.surfaces.console.seeded import (
    CONSOLE,
    Client,
    Row,
    expected,
    seed,
)
from tests.conftest import LAB_USERS, NODES, BotFactory
from tests.processes import FAULTHANDLER, stopped

RUNBOOK = [sys.executable, "-m", "bot"]
SINCE, UNTIL = "2026-11-30T08:04:00Z", "2026-11-30T08:11"


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


def model(rows: list[Row], query: list[tuple[str, str]]) -> list[int]:
    flt, sort, _ = filters.parse(query)
    return expected(rows, flt, sort)


QUERY = "node=gpu[02-06]&state=failed&state=succeeded&sort=runbook&order=desc"
PAIRS = [("node", "gpu[02-06]"), ("state", "failed"), ("state", "succeeded"),
         ("sort", "runbook"), ("order", "desc")]


def test_executions_exports_hold_exactly_the_filtered_set_in_its_order(
        seeded: tuple[Service, list[Row]]) -> None:
    bot, rows = seeded
    client = Client(bot)
    wanted = model(rows, PAIRS)
    assert len(wanted) > 5
    as_csv = client.get(f"/ui/executions.csv?{QUERY}")
    assert as_csv.status_code == 200
    assert as_csv.headers["content-type"] == "text/csv; charset=utf-8"
    assert as_csv.headers["content-disposition"] == (
        'attachment; filename="executions_node-gpu-02-06-_state-failed_state-succeeded.csv"')
    read = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert [int(r["id"]) for r in read] == wanted
    by_id = {r.id: r for r in rows}
    for line in read:
        row = by_id[int(line["id"])]
        assert line["source"] == row.source and line["requested_by"] == row.requested_by
        assert set(line["approvers"].split()) == set(row.approvers)
        assert json.loads(line["params"]) == {"reason": "seeded", "token": MASK}
    as_jsonl = client.get(f"/ui/executions.jsonl?{QUERY}")
    lines = [json.loads(line) for line in as_jsonl.text.splitlines()]
    assert [line["id"] for line in lines] == wanted
    assert lines[0]["params"]["token"] == MASK and "s3cret" not in as_jsonl.text
    assert isinstance(lines[0]["break_glass"], bool) and isinstance(lines[0]["approvers"], list)
    assert "content-length" not in as_jsonl.headers  # streamed, in pieces


def test_the_exports_filter_by_change_reference(seeded: tuple[Service, list[Row]]) -> None:
    bot, rows = seeded
    wanted = model(rows, [("change", "CHG1001")])
    assert wanted and len(wanted) < len(rows)
    client = Client(bot)
    read = list(csv.DictReader(io.StringIO(client.get("/ui/executions.csv?change=CHG1001").text)))
    assert [int(r["id"]) for r in read] == wanted
    assert {r["change"] for r in read} == {"CHG1001"}
    lines = client.get("/ui/events.jsonl?change=CHG1001").text.splitlines()
    assert {json.loads(line)["execution_id"] for line in lines} == set(wanted)
    page = client.get("/ui/executions?change=CHG1001").text
    assert 'value="CHG1001"' in page and "<code>CHG1001</code>" in page


def test_the_events_export_holds_the_events_of_exactly_those_executions(
        seeded: tuple[Service, list[Row]]) -> None:
    bot, rows = seeded
    wanted = set(model(rows, PAIRS))
    with bot.db.connect() as conn:
        events = [{**e, "data": scope.masked(e["data"])} for e in audit.events(conn)
                  if e["execution_id"] in wanted]
    for fmt in ("jsonl", "csv"):
        out = io.StringIO(newline="")
        audit.export(iter(events), out, fmt)
        answer = Client(bot).get(f"/ui/events.{fmt}?{QUERY.split('&sort=')[0]}")
        assert answer.status_code == 200
        assert answer.content == out.getvalue().encode()
        assert answer.headers["content-disposition"].startswith('attachment; filename="events_')


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_the_whole_log_in_a_time_range_is_what_audit_export_writes(
        make_bot: BotFactory, db_url: str, fmt: str) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")])}, url=db_url, console=CONSOLE)
    for node in NODES:
        bot.request("demo", {"node": node}, "alice")
    with bot.db.connect() as conn:
        stamps = [e["ts"] for e in audit.events(conn)]
    since, until = stamps[2], stamps[-2]
    with bot.db.connect() as conn:
        out = io.StringIO(newline="")
        count = audit.export(audit.events(conn, since=audit.moment(since),
                                          until=audit.moment(until)), out, fmt)
    assert count == len(stamps) - 4  # from the third, before the last but one
    answer = Client(bot).get(f"/ui/events.{fmt}?since={since}&until={until}&scope=all")
    assert answer.status_code == 200 and answer.content == out.getvalue().encode()
    assert answer.headers["content-disposition"].startswith(
        'attachment; filename="audit-events_since-')
    page = Client(bot).get(f"/ui/executions?since={since}&until={until}").text
    assert f"events.{fmt}?since=" in page and "&amp;scope=all" in page


def test_event_data_is_masked_except_in_the_whole_log(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")], risk="medium", params={
        "node": {"type": "node", "required": True}, "api_token": {"type": "text"}})},
        console=CONSOLE)
    bot.request("demo", {"node": "gpu01", "api_token": "hunter2-secret"}, "alice")
    client = Client(bot)
    for url in ("/ui/events.jsonl", "/ui/events.csv", "/ui/executions.jsonl",
                "/ui/executions.csv"):
        answer = client.get(url, user="alice")
        assert answer.status_code == 200 and "hunter2" not in answer.text, url
        assert MASK in answer.text or MASK in answer.text.replace('""', '"'), url
    assert "hunter2-secret" in client.get("/ui/events.jsonl?scope=all").text  # as stored


def test_a_secret_value_echoed_without_its_key_is_masked_as_pages_mask_it(
        make_bot: BotFactory) -> None:
    """The value of a secret-looking parameter, echoed where no key names it (a step's
    argument, its operation line, an error), is hidden in every export but the whole log."""
    from bot.execution.engine import Engine

    bot = make_bot({"demo": runbook([record("a", "{{ api_token }}", undo=False),
                                     {"id": "b", "action": "test.flaky",
                                      "with": {"key": "{{ api_token }}"}}],
                                    risk="low", params={
        "node": {"type": "node", "required": True}, "api_token": {"type": "text"}})},
        console=CONSOLE)
    execution_id = bot.request("demo", {"node": "gpu01", "api_token": "hunter2-secret"},
                               "alice")
    fakes.FAILURES["hunter2-secret"] = 9
    Engine(bot, sleep=lambda s: None).drive(execution_id)
    assert "hunter2-secret" in (bot.get(execution_id).error or "")  # the failure echoes it
    client = Client(bot)
    for url in ("/ui/events.jsonl", "/ui/events.csv", "/ui/executions.jsonl",
                "/ui/executions.csv"):
        answer = client.get(url, user="alice")
        assert answer.status_code == 200 and "hunter2" not in answer.text, url
    assert "hunter2-secret" in client.get("/ui/events.jsonl?scope=all").text  # as stored


def test_a_cell_a_spreadsheet_would_run_is_defused_in_the_csv_exports(
        make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")], risk="medium")}, console=CONSOLE,
                   requesters=["*"])
    bot.request("demo", {"node": "gpu01"}, '=HYPERLINK("http://x","y")')
    answer = Client(bot).get("/ui/executions.csv")
    (line,) = list(csv.DictReader(io.StringIO(answer.text)))
    assert line["requested_by"] == '\'=HYPERLINK("http://x","y")' and line["runbook"] == "demo"
    events = list(csv.DictReader(io.StringIO(Client(bot).get("/ui/events.csv").text)))
    assert '\'=HYPERLINK("http://x","y")' in {e["actor"] for e in events}
    assert not [e for e in events if e["actor"].startswith("=")]
    whole = Client(bot).get("/ui/events.csv?scope=all").text  # as stored, for auditors
    assert '=HYPERLINK("http://x","y")' in {e["actor"] for e in csv.DictReader(io.StringIO(whole))}


def test_the_whole_log_is_for_auditors_and_only_in_a_time_range(
        seeded: tuple[Service, list[Row]]) -> None:
    bot, _ = seeded
    client = Client(bot)
    refused = {
        ("/ui/events.jsonl?scope=all", "alice"): "scope=all (every event of the log) is for "
                                                  "auditors",
        ("/ui/events.jsonl?scope=all&runbook=drain", "carol"): "scope=all takes only since "
                                                               "and until",
        ("/ui/events.csv?scope=everything", "carol"): "scope 'everything' is not executions",
        ("/ui/executions.csv?scope=all", "carol"): "unknown parameter 'scope'",
        ("/ui/events.csv?sort=runbook", "carol"): "unknown parameter 'sort'",
        ("/ui/executions.jsonl?state=faild", "carol"): "did you mean 'failed'",
        ("/ui/events.jsonl?since=yesterday", "carol"): "'yesterday' is not a UTC date",
    }
    for (url, user), message in refused.items():
        answer = client.get(url, user=user)
        assert answer.status_code == 400, url
        assert message in answer.text.replace("&#39;", "'"), url
    assert client.get("/ui/events.jsonl?scope=all", user=None).status_code == 401
    assert client.get("/ui/events.jsonl?scope=all", user="carol").status_code == 200


def test_requesters_export_only_what_they_may_see(seeded: tuple[Service, list[Row]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    bot, rows = seeded
    monkeypatch.setattr(scope, "visible", lambda viewer, runbook, config:
                        viewer.auditor or runbook == "drain")
    client = Client(bot)
    drains = {r.id for r in rows if r.runbook == "drain"}
    events = [json.loads(line) for line in
              client.get("/ui/events.jsonl", user="alice").text.splitlines()]
    assert {e["execution_id"] for e in events} == drains
    exported = client.get("/ui/executions.jsonl", user="alice").text.splitlines()
    assert {json.loads(line)["id"] for line in exported} == drains
    assert len(client.get("/ui/executions.jsonl").text.splitlines()) == len(rows)


def test_a_streamed_export_holds_no_writer_back(make_bot: BotFactory) -> None:
    """On SQLite a read-only connection takes no writer lock: a request (a write with its
    audit events) goes through while a download is half sent."""
    bot = make_bot({"demo": runbook([record("a", "a")], risk="medium")}, console=CONSOLE)
    bot.request("demo", {"node": "gpu01"}, "alice")
    body = exports.stream(bot.db, lambda conn: (piece for piece, _ in audit.lines(
        audit.events(conn), "jsonl")))
    first = next(body)  # the download's read is open from here
    started = time.monotonic()
    bot.request("demo", {"node": "gpu02"}, "bob")
    assert time.monotonic() - started < 5  # not the 30 s busy timeout of a held lock
    rest = b"".join(body)
    assert (first + rest).count(b"\n") == 3  # the snapshot the download began with


@pytest.mark.postgres
def test_audit_events_are_read_with_a_server_side_cursor(make_bot: BotFactory,
                                                         postgres_server: object) -> None:
    from tests import postgres

    assert isinstance(postgres_server, postgres.PostgresServer)
    url = postgres.fresh_database(postgres_server.url, "t_stream_cursor")
    bot = make_bot({}, url=url)
    seed(bot.db, count=30)
    with bot.db.connect() as conn:
        events = audit.events(conn)
        next(events)
        cursors = conn.execute(text("SELECT count(*) FROM pg_cursors")).scalar()
        assert cursors == 1  # the events come from a named cursor, a batch at a time
        assert len(list(events)) == 29


# --- through a real `runbook serve`, against the real `runbook audit export` ----------------

def test_a_download_from_runbook_serve_is_byte_identical_to_runbook_audit_export(
        make_bot: BotFactory, tmp_path: Path) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")], risk="medium")}, console=CONSOLE)
    for node in NODES:
        bot.request("demo", {"node": node}, "alice", source="chat")
    with bot.db.connect() as conn:
        stamps = [e["ts"] for e in audit.events(conn)]
    config, empty = tmp_path / "bot.yaml", tmp_path / "no-runbooks"
    empty.mkdir()
    config.write_text(yaml.safe_dump({
        "lab": True, "database_url": str(bot.db.url), "users": LAB_USERS,
        "requesters": ["group:oncall", "group:gpu-leads"],
        "runbook_paths": [str(empty)],  # none: the test's actions exist only in here
        "inventory": {"nodes": NODES}, "console": CONSOLE}))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")},
           "RUNBOOK_CONFIG": str(config), **FAULTHANDLER}
    port = free_port()
    server = subprocess.Popen([*RUNBOOK, "serve", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              stdin=subprocess.DEVNULL)
    try:
        _wait_for(port, server)
        for fmt in ("jsonl", "csv"):
            since, until = stamps[1][:19], stamps[-3]  # a time typed to the second, and one
            command = subprocess.run([*RUNBOOK, "audit", "export", "--since", since, "--until",
                                      until, "--format", fmt], env=env, capture_output=True,
                                     check=True, timeout=60)
            served, headers = _download(port, f"/ui/events.{fmt}?since={since}&until={until}"
                                              "&scope=all")
            assert served == command.stdout and command.stdout.count(b"\n") >= 5
            assert headers["transfer-encoding"] == "chunked"  # streamed
            assert "since-" in headers["content-disposition"]
    finally:
        stopped(server)


def _wait_for(port: int, server: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5):
                return
        except OSError:
            assert server.poll() is None, server.communicate()
            assert time.monotonic() < deadline, "runbook serve did not answer"
            time.sleep(0.1)


def _download(port: int, path: str) -> tuple[bytes, dict[str, str]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     headers={"X-Forwarded-User": "carol"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.read(), {name.lower(): value for name, value in answer.headers.items()}
