"""The console in a real browser: Debian's Chromium, headless, driven by Playwright, against
a real `runbook serve` on a site whose executions the engine ran (tests.bot...console.site):
refused without identity, signed in by basic or the proxy's header, filtered with the
keyboard, an execution, a node, the chain, a runbook diff, exports compared with the
database and `runbook audit export`, an edited event flagged, and the filter's labels."""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bot.config import ConsoleConfig, ProxyIdentity, load_config
from bot.runtime.httpserver import HttpServer
from bot.runtime.serving import application, http_settings
from bot.service import Service
from bot.surfaces.console.pages import console
from tests.bot.surfaces.console import site as demo

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page, ViewportSize

CHROMIUM = Path("/usr/bin/chromium")
# headless, and quiet: without the background-networking flags Chromium keeps calling out
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LAPTOP: ViewportSize = {"width": 1366, "height": 768}
FILTER_CONTROLS = ["f-runbook", "f-version", "f-node", "f-requester", "f-approver", "f-source",
                   "f-state", "f-since", "f-until", "f-break-glass", "f-failed-checks"]


def unavailable() -> str | None:
    """Why no browser test can run here, or None."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing: apt-get install chromium"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is missing: pip install -e '.[dev]'"
    return None


@dataclass
class Served:
    site: demo.Site
    base: str  # http://127.0.0.1:PORT

    def url(self, path: str) -> str:
        return f"{self.base}/ui{path}"

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.site.db_file)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    if (reason := unavailable()) is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (`make test` installs it)")
        pytest.skip(reason)
    site = demo.seed(demo.make(tmp_path_factory.mktemp("console-site")))
    with demo.serve(site) as base:
        yield Served(site, base)


@pytest.fixture(scope="module")
def proxied(served: Served) -> Iterator[str]:
    """The same site behind a proxy at 127.0.0.2 (so not the browser, which connects from
    127.0.0.1), no basic: the console in-thread, as `runbook serve` mounts it."""
    config = load_config(served.site.config_file)
    config.console = ConsoleConfig(proxy=ProxyIdentity(trusted=["127.0.0.2"]),
                                   auditors=["user:carol"])
    bot = Service.from_config(config)
    server = HttpServer(application(bot, alerts_token="t" * 32, mounts={"/ui": console(bot)}),
                        "127.0.0.1", 0, http_settings(config.server))
    server.start()
    yield f"http://127.0.0.1:{server.port}"
    server.stop()
    bot.db.dispose()


@pytest.fixture(scope="module")
def browser(served: Served) -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS,
                                              timeout=30_000)
        yield launched
        launched.close()


def new_context(browser: Browser, **options: Any) -> BrowserContext:
    """A context of its own (cookies, credentials); a page that does not come within 5 s
    fails the test then, not after Playwright's 30 s."""
    context = browser.new_context(**options)
    context.set_default_timeout(5_000)
    return context


def as_carol(browser: Browser) -> Page:
    """carol, an auditor, signed in with HTTP basic."""
    context = new_context(browser, viewport=LAPTOP, http_credentials={
        "username": "carol", "password": demo.PASSWORD})
    return context.new_page()


def through_proxy(visitor: Page, name: str | None) -> Page:
    """The visitor's page as ``name``, as the site's proxy (trusted: 127.0.0.1) names people
    (None: nobody named)."""
    visitor.set_extra_http_headers({"X-Forwarded-User": name} if name else {})
    return visitor


@pytest.fixture(scope="module")
def carol(browser: Browser) -> Iterator[Page]:
    """One page for the module's tests as carol (each starts with a goto)."""
    page = as_carol(browser)
    yield page
    page.context.close()


@pytest.fixture(scope="module")
def visitor(browser: Browser) -> Iterator[Page]:
    """One page without credentials for the module's tests (through_proxy names it)."""
    page = new_context(browser, viewport=LAPTOP).new_page()
    yield page
    page.context.close()


def shown_ids(page: Page) -> list[int]:
    cells = page.locator("table.executions tbody tr td:first-child a").all_inner_texts()
    return [int(text) for text in cells]


def db_ids(served: Served, where: str = "1 = 1", *args: Any) -> list[int]:
    with served.db() as conn:
        return [row[0] for row in conn.execute(
            f"SELECT id FROM executions WHERE {where} ORDER BY requested_at DESC", args)]


# --- who ---------------------------------------------------------------------------------


def test_refused_without_identity(served: Served, browser: Browser, visitor: Page) -> None:
    """With basic set up the browser is challenged, and without a name and password it gets
    no page (headless Chromium cannot be asked: it gives up); the answer is a 401."""
    from playwright.sync_api import Error

    page = through_proxy(visitor, None)
    with pytest.raises(Error, match="ERR_INVALID_AUTH_CREDENTIALS"):
        page.goto(served.url("/executions"))
    fetched = page.request.get(served.url("/executions"))
    assert fetched.status == 401 and fetched.headers["www-authenticate"].startswith("Basic ")
    assert "sign in with your console name and password" in fetched.text()
    assert "burn-in" not in fetched.text()
    wrong = new_context(browser, http_credentials={"username": "carol", "password": "guess"})
    page = wrong.new_page()
    answer = page.goto(served.url("/executions/3"))
    assert answer is not None and answer.status == 401
    assert page.get_by_role("alert").inner_text() == "wrong name or password"
    assert "burn-in" not in page.content()
    wrong.close()


def test_the_401_page_behind_a_proxy_and_a_forged_header(proxied: str, visitor: Page) -> None:
    """A console behind a proxy that trusts only the proxy's address: a browser that comes
    straight to it sees the 401 page, with or without an X-Forwarded-User of its own."""
    for name in (None, "carol"):
        page = through_proxy(visitor, name)
        answer = page.goto(f"{proxied}/ui/executions")
        assert answer is not None and answer.status == 401
        assert "www-authenticate" not in answer.headers
        assert "sign in through the site's proxy" in page.get_by_role("alert").inner_text()
        assert page.locator("table").count() == 0 and "carol" not in page.content()


def test_signed_in_by_basic_or_by_the_proxy(served: Served, carol: Page,
                                            visitor: Page) -> None:
    carol.goto(served.url("/executions"))
    assert carol.locator(".who").inner_text() == "carol · auditor"
    assert carol.get_by_role("link", name="Audit chain").is_visible()
    alice = through_proxy(visitor, "alice")
    answer = alice.goto(served.url("/executions"))
    assert answer is not None and answer.status == 200
    assert alice.locator(".who").inner_text() == "alice"
    assert alice.get_by_role("link", name="Audit chain").count() == 0
    eve = through_proxy(visitor, "eve")
    answer = eve.goto(served.url("/executions"))
    assert answer is not None and answer.status == 403
    assert "eve is neither an auditor nor a requester" in eve.get_by_role("alert").inner_text()


# --- executions ----------------------------------------------------------------------------


def test_filter_with_the_keyboard_and_the_url_keeps_it(served: Served, carol: Page) -> None:
    carol.goto(served.url("/executions"))
    assert shown_ids(carol) == db_ids(served)
    carol.get_by_label("Runbook", exact=True).fill("burn-in")
    carol.get_by_label("Runbook", exact=True).press("Enter")
    carol.wait_for_url("**/executions?*runbook=burn-in*")
    assert shown_ids(carol) == db_ids(served, "runbook = ?", "burn-in")
    carol.get_by_label("Node or hostlist", exact=True).fill("gpu04")  # inside gpu[03-04]
    carol.get_by_label("Node or hostlist", exact=True).press("Enter")
    carol.wait_for_url("**node=gpu04*")
    assert shown_ids(carol) == [served.site.ids["burn-failed"]]
    shared = carol.url
    carol.goto(served.url("/executions"))
    carol.goto(shared)  # a link holds the filter
    assert carol.get_by_label("Runbook", exact=True).input_value() == "burn-in"
    assert shown_ids(carol) == [served.site.ids["burn-failed"]]
    carol.get_by_label("Requested by", exact=True).fill("nobody")
    carol.get_by_label("Requested by", exact=True).press("Enter")
    carol.wait_for_url("**requester=nobody*")
    assert carol.get_by_text("No execution matches.").is_visible()


def test_filters_by_state_source_approver_and_time(served: Served, carol: Page) -> None:
    ids = served.site.ids
    carol.goto(served.url("/executions"))
    carol.get_by_label("Approved by", exact=True).fill("dave")
    carol.get_by_label("Approved by", exact=True).press("Enter")
    carol.wait_for_url("**approver=dave*")
    assert shown_ids(carol) == [ids["burn-glass"]]
    carol.goto(served.url("/executions"))
    carol.get_by_label("Source").select_option("alert")  # its name holds the choice
    carol.get_by_label("Requested from (UTC)", exact=True).fill("2026-11-30T10:00")
    carol.get_by_label("Requested from (UTC)", exact=True).press("Enter")
    carol.wait_for_url("**source=alert*")
    assert shown_ids(carol) == [ids["burn-failed"]]
    carol.goto(served.url("/executions?state=succeeded&until=2026-11-30T12:00"))
    assert shown_ids(carol) == [ids["probe-gpu02"], ids["probe-gpu01"]]
    answer = carol.goto(served.url("/executions?state=finished-ish"))
    assert answer is not None and answer.status == 400
    assert "finished-ish" in carol.get_by_role("alert").inner_text()


def test_the_filter_works_without_javascript(served: Served, browser: Browser) -> None:
    page = new_context(browser, viewport=LAPTOP, java_script_enabled=False,
                       extra_http_headers={"X-Forwarded-User": "carol"}).new_page()
    page.goto(served.url("/executions"))
    page.get_by_label("Requested by", exact=True).fill("bob")
    page.get_by_label("Requested by", exact=True).press("Enter")
    page.wait_for_url("**requester=bob*")
    assert shown_ids(page) == db_ids(served, "requested_by = ?", "bob")
    page.context.close()


def test_the_filter_is_reachable_and_labelled_with_tab(served: Served, carol: Page) -> None:
    """From the top of the page, Tab alone reaches every filter control, in order, each with
    a label and a visible focus outline; the skip link comes first."""
    carol.goto(served.url("/executions"))
    reached: list[dict[str, Any]] = []
    for _ in range(60):
        carol.keyboard.press("Tab")
        reached.append(carol.evaluate("""() => {
            const el = document.activeElement;
            const style = getComputedStyle(el);
            const labels = el.labels ? [...el.labels].map(l => l.innerText.trim()) : [];
            return {id: el.id, tag: el.tagName, text: el.innerText || '', labels,
                    outline: style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) > 0};
        }"""))
        if reached[-1]["tag"] == "BUTTON" and reached[-1]["text"] == "Filter":
            break
    assert reached[0]["text"] == "Skip to content"
    order = [item["id"] for item in reached if item["id"] in FILTER_CONTROLS]
    assert order == FILTER_CONTROLS, order
    for item in reached:
        assert item["outline"], f"no visible focus on {item}"
        if item["id"] in FILTER_CONTROLS:
            assert item["labels"] and item["labels"][0], f"{item['id']} has no label"
    assert reached[-1]["text"] == "Filter", "the Filter button was not reached by Tab"


# --- an execution, a node, a runbook, the chain ------------------------------------------


def test_open_an_execution_from_the_table(served: Served, carol: Page) -> None:
    failed = served.site.ids["burn-failed"]
    carol.goto(served.url("/executions?runbook=burn-in"))
    carol.get_by_role("link", name=str(failed), exact=True).click()
    carol.wait_for_url(f"**/ui/executions/{failed}")
    heading = carol.get_by_role("heading", level=1).inner_text()
    assert f"Execution {failed}" in heading and "failed" in heading
    with served.db() as conn:
        plan_hash = conn.execute("SELECT plan_hash FROM executions WHERE id = ?",
                                 (failed,)).fetchone()[0]
    text = carol.locator("main").inner_text()
    for shown in ("GPUs pass the burn-in", "ECC double-bit error", "carol", "approved",
                  "burn-in stopped on gpu[03-04]", plan_hash[:12]):
        assert shown in text, shown


def test_follow_a_node_from_an_execution(served: Served, carol: Page) -> None:
    failed = served.site.ids["burn-failed"]
    carol.goto(served.url(f"/executions/{failed}"))
    links = carol.get_by_role("link", name="gpu03", exact=True)
    assert links.count() >= 1, "no link to gpu03, a node the execution locked"
    links.first.click()
    carol.wait_for_url("**/ui/nodes/gpu03")
    assert "gpu03" in carol.get_by_role("heading", level=1).inner_text()
    touched = carol.locator("main table a").all_inner_texts()
    assert str(failed) in touched


def test_a_node_lists_every_execution_that_touched_it(served: Served, carol: Page) -> None:
    ids = served.site.ids
    carol.goto(served.url("/executions"))
    carol.get_by_label("Node", exact=True).fill("gpu01")
    carol.get_by_label("Node", exact=True).press("Enter")
    carol.wait_for_url("**/ui/nodes/gpu01")
    links = carol.locator("main table a").all_inner_texts()
    for key in ("probe-gpu01", "probe-v11"):
        assert str(ids[key]) in links
    assert str(ids["probe-gpu02"]) not in links


def test_runbook_versions_and_their_diff(served: Served, carol: Page) -> None:
    carol.goto(served.url("/executions"))
    carol.get_by_role("link", name="Runbooks").click()
    carol.get_by_role("link", name="probe-node", exact=True).click()
    carol.wait_for_url("**/ui/runbooks/probe-node")
    versions = carol.locator("main").inner_text()
    assert "1.0.0" in versions and "1.1.0" in versions
    carol.get_by_role("link", name="diff with 1.0.0").click()
    carol.wait_for_url("**/ui/runbooks/probe-node/diff*")
    assert "1.0.0 → 1.1.0" in carol.get_by_role("heading", level=1).inner_text()
    assert "{{ node }} probed" in carol.locator("main").inner_text()  # the step 1.1.0 added


def test_the_chain_page_shows_the_head_and_verifies_from_the_page(served: Served,
                                                                   carol: Page) -> None:
    carol.goto(served.url("/executions"))
    carol.get_by_role("link", name="Audit chain").click()
    carol.wait_for_url("**/ui/chain")
    with served.db() as conn:
        seq, digest = conn.execute(
            "SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1").fetchone()
    assert digest in carol.locator("main").inner_text()
    carol.get_by_role("button", name="Verify now").click()  # a POST with the page's Origin
    carol.wait_for_url("**/ui/chain")
    assert "Intact when last verified" in carol.locator("main [role=status]").first.inner_text()
    with served.db() as conn:
        kind, actor = conn.execute("SELECT kind, actor FROM audit_events WHERE seq > ? "
                                   "ORDER BY seq DESC LIMIT 1", (seq,)).fetchone()
    assert (kind, actor) == ("chain_verified", "carol")


def test_a_requester_gets_no_chain_and_no_whole_log(served: Served, visitor: Page) -> None:
    alice = through_proxy(visitor, "alice")
    answer = alice.goto(served.url("/chain"))
    assert answer is not None and answer.status in (403, 404)
    alice.goto(served.url("/executions?since=2026-11-30&until=2026-12-01"))
    assert alice.get_by_role("link", name="The whole audit log in this time range (JSON "
                                        "lines)").count() == 0


# --- exports -----------------------------------------------------------------------------


def download(page: Page, link: str) -> bytes:
    with page.expect_download() as started:
        page.get_by_role("link", name=link, exact=True).click()
    return Path(started.value.path()).read_bytes()


def test_the_executions_export_is_exactly_the_filtered_set(served: Served, carol: Page) -> None:
    carol.goto(served.url("/executions"))
    carol.get_by_label("Runbook", exact=True).fill("probe-node")
    carol.get_by_label("Runbook", exact=True).press("Enter")
    carol.wait_for_url("**runbook=probe-node*")
    rows = list(csv.DictReader(io.StringIO(download(carol, "Executions (CSV)").decode())))
    with served.db() as conn:
        stored = {row[0]: row[1:] for row in conn.execute(
            "SELECT id, state, requested_by, version FROM executions WHERE runbook = ?",
            ("probe-node",))}
    assert [int(row["id"]) for row in rows] == shown_ids(carol)
    assert {int(row["id"]): (row["state"], row["requested_by"], row["version"])
            for row in rows} == stored
    lines = download(carol, "Executions (JSON lines)").decode().splitlines()
    assert [json.loads(line)["id"] for line in lines] == [int(row["id"]) for row in rows]
    events = [json.loads(line) for line in
              download(carol, "Their audit events (JSON lines)").decode().splitlines()]
    with served.db() as conn:
        seqs = [row[0] for row in conn.execute(
            "SELECT seq FROM audit_events WHERE execution_id IN (SELECT id FROM executions "
            "WHERE runbook = ?) ORDER BY seq", ("probe-node",))]
    assert [event["seq"] for event in events] == seqs


def audit_export(served: Served, *args: str) -> subprocess.Popen[bytes]:
    """`runbook audit export ARGS`, started (``communicate`` gives what it wrote)."""
    return subprocess.Popen([sys.executable, "-m", "bot", "audit", "export", *args],
                            env=served.site.env(), stdout=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)


def test_the_whole_log_export_is_what_runbook_audit_export_writes(served: Served,
                                                                   carol: Page) -> None:
    since, until = "2026-11-30T09:00", "2026-12-01T00:00"
    exporting = {fmt: audit_export(served, "--since", since, "--until", until, "--format", fmt)
                 for fmt in ("jsonl", "csv")}
    carol.goto(served.url("/executions"))
    carol.get_by_label("Requested from (UTC)", exact=True).fill(since)
    carol.get_by_label("Requested before (UTC)", exact=True).fill(until)
    carol.get_by_label("Requested before (UTC)", exact=True).press("Enter")
    carol.wait_for_url("**until=*")
    for fmt, label in (("jsonl", "JSON lines"), ("csv", "CSV")):
        got = download(carol, f"The whole audit log in this time range ({label})")
        expected, _ = exporting[fmt].communicate(timeout=60)
        assert exporting[fmt].returncode == 0 and expected.count(b"\n") > 10
        assert got == expected, fmt


# --- tampering -----------------------------------------------------------------------------


def test_an_edited_event_is_flagged_on_exactly_that_event(served: Served, carol: Page) -> None:
    failed = served.site.ids["burn-failed"]
    carol.goto(served.url(f"/executions/{failed}"))
    marks = carol.locator(".chain-mark")
    assert marks.count() > 5 and carol.locator(".chain-mark.bad").count() == 0
    with served.db() as conn:
        seq, data = conn.execute(
            "SELECT seq, data FROM audit_events WHERE execution_id = ? AND kind = "
            "'step_finished' ORDER BY seq LIMIT 1", (failed,)).fetchone()
    edited = data.replace("burn-in started", "nothing happened")
    assert edited != data
    try:
        with served.db() as conn:
            conn.execute("UPDATE audit_events SET data = ? WHERE seq = ?", (edited, seq))
        carol.reload()
        flagged = carol.locator(".chain-mark.bad")
        assert flagged.count() == 1
        assert "edited" in flagged.inner_text()
        assert carol.locator(f"tr#event-{seq} .chain-mark.bad").count() == 1
        assert carol.locator(".chain-mark.ok").count() == marks.count() - 1
        carol.get_by_role("link", name="Audit chain").click()
        carol.get_by_role("button", name="Verify now").click()
        carol.wait_for_url("**/ui/chain")
        verdict = carol.locator("main [role=alert]", has_text="BROKEN").inner_text()
        assert f"event {seq}" in verdict, verdict
    finally:
        with served.db() as conn:
            conn.execute("UPDATE audit_events SET data = ? WHERE seq = ?", (data, seq))


# --- secrets ---------------------------------------------------------------------------------


def test_no_page_shows_a_secret(served: Served, carol: Page) -> None:
    """burn-in takes bmc_password (with a default), one request gave it a value and its step
    passed it to a command: every page and the executions exports hide both."""
    paths = ["/executions", "/executions?runbook=burn-in", "/nodes/gpu03", "/chain",
             "/runbooks", "/runbooks/burn-in", "/executions.csv", "/executions.jsonl",
             *(f"/executions/{id_}" for id_ in served.site.ids.values())]
    shown = []
    for path in paths:
        answer = carol.context.request.get(served.url(path))
        assert answer.status == 200, path
        text = answer.text()
        shown += [f"{path} shows {secret}" for secret in (demo.SECRET, demo.SECRET_DEFAULT)
                  if secret in text]
    assert shown == []
    carol.goto(served.url(f"/executions/{served.site.ids['burn-failed']}"))
    assert "[hidden]" in carol.locator("main").inner_text()
