"""The console's executions table and exports at scale, on PostgreSQL: 100,000 executions and
2,000,000 audit events (seeded with COPY; the events' hashes are filler, NOT a valid chain:
`runbook audit verify` would fail on them, and the timings here do not need it).

1. A filtered executions page (node; runbook + state; approver; a time range; a hostlist
   sorted by finished time; a second page; sorts of the whole table; a requester's view),
   through a real `runbook serve` (the console at /ui, identity from the proxy header):
   the time in the handler (its Server-Timing header) and the time to first byte.
   Goals: at most 100 ms in the server, 300 ms to first byte.
   Baseline (the floor), in the same run: the same SQL (the page's query, its nodes and its
   approvers) sent straight through psycopg.
2. An export of 1,000,000 events (`/ui/events.jsonl?scope=all` over a time range) streamed
   from the same server: time, rate and the server process's peak resident memory (VmHWM
   before and after). Goal: at most 100 MB resident. For comparison: `runbook audit export`
   of the same range (its peak RSS), and the floor: the rows fetched with a server-side
   cursor and nothing done with them.

PostgreSQL: RUNBOOK_BENCH_PG_URL, else a throw-away server from Debian's packages (as the
tests). Run: .venv/bin/python bench/console.py [--executions 100000] [--events 2000000]
[--runs 20] [--export-events 1000000]. Prints readable lines, then one JSON line; it never
asserts a time.
"""

from __future__ import annotations

import argparse
import http.client
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import yaml  # noqa: E402
from benchkit import cleanup_on_signals, finish  # noqa: E402  # bench/, next to this file
from console_seed import Seeded, seed  # noqa: E402  (bench/, next to this file)

from bot.config import Config  # noqa: E402
from bot.store import db, listing  # noqa: E402
from bot.surfaces.console import filters, scope  # noqa: E402
from bot.surfaces.console.identity import Viewer  # noqa: E402
from tests import postgres  # noqa: E402

PAGE_GOAL_MS, TTFB_GOAL_MS, RSS_GOAL_MB = 100.0, 300.0, 100.0
AUDITOR, REQUESTER = "auditor", "user007"


def pages(seeded: Seeded) -> dict[str, str]:
    """The filtered pages measured: name -> query string."""
    day = seeded.day(120)
    return {
        "no filter (first page)": "",
        "node": f"node={seeded.busy_node}",
        "runbook + state": "runbook=drain-node&state=failed",
        "approver": "approver=approver03",
        "time range (one day)": f"since={day}&until={day}T23:59:59",
        "hostlist, sorted by finished": "node=gpu[0100-0163]&sort=finished&order=desc",
        "node + runbook + source + failed checks": (
            f"node={seeded.busy_node}&runbook=drain-node&source=alert&failed_checks=yes"),
        "several states + break-glass": "state=failed&state=cancelled&break_glass=yes",
        "sorted by runbook (whole table)": "sort=runbook&order=asc",
        "sorted by state (whole table)": "sort=state&order=desc",
        "sorted by requester (whole table)": "sort=requester&order=asc",
        "sorted by finished (whole table)": "sort=finished&order=asc",
    }


class Served:
    """`runbook serve` on a free loopback port, the console's identity from the proxy
    header; ``get`` times one page (handler time, time to first byte)."""

    def __init__(self, url: str, folder: Path) -> None:
        empty = folder / "runbooks"
        empty.mkdir()
        config = folder / "bot.yaml"
        config.write_text(yaml.safe_dump({
            "database_url": url, "database": {"create": True},
            "runbook_paths": [str(empty)], "requesters": ["*"],
            "console": {"proxy": {"trusted": ["127.0.0.1"]}, "auditors": [f"user:{AUDITOR}"]},
        }))
        self.port = postgres._free_port()
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")},
               "RUNBOOK_CONFIG": str(config), "RUNBOOK_ALERTS_TOKEN": secrets.token_hex(16)}
        self.env = env
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bot", "serve", "--port", str(self.port)], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                self.get("/healthz")
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    sys.exit("runbook serve did not start")
                self.connection.close()
                time.sleep(0.2)

    def get(self, path: str, user: str = AUDITOR) -> tuple[int, float, float, bytes]:
        """(status, handler ms, time to first byte ms, body) over a kept-alive connection."""
        started = time.perf_counter()
        self.connection.request("GET", path, headers={"X-Forwarded-User": user})
        answer = self.connection.getresponse()  # returns once the status line has arrived
        first = (time.perf_counter() - started) * 1000
        timing = answer.getheader("Server-Timing") or "handler;dur=nan"
        body = answer.read()
        return answer.status, float(timing.split("dur=")[1]), first, body

    def memory(self) -> dict[str, float]:
        """The server process's resident memory now and at its peak (VmHWM), in MB."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        found = {line.split(":")[0]: int(line.split()[1]) / 1024 for line in status.splitlines()
                 if line.startswith(("VmRSS", "VmHWM"))}
        return {"rss_mb": round(found["VmRSS"], 1), "peak_mb": round(found["VmHWM"], 1)}

    def stop(self) -> None:
        self.connection.close()
        self.process.terminate()
        self.process.wait(timeout=60)


def stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": round(statistics.median(ordered), 2),
            "p95": round(ordered[int(0.95 * (len(ordered) - 1))], 2),
            "max": round(ordered[-1], 2)}


def floor_ms(url: str, query: str, viewer: Viewer, config: Config, size: int,
             runs: int) -> dict[str, float]:
    """The page's own SQL (its rows, then their nodes and approvers) straight through
    psycopg, no console code around it: the floor of the page's time."""
    engine = db.connect(url, migrate=False)
    flt, sort, _ = filters.parse(parse_qsl(query))
    with engine.connect() as conn:
        allowed = scope.runbooks_in_scope(conn, viewer, config)
        rows = listing.page(conn, flt, sort, allowed, size).rows
    statement = listing.ordered(listing.matching(flt, allowed), sort).limit(size + 1)
    compiled = statement.compile(engine, compile_kwargs={"literal_binds": True})
    ids = ",".join(str(row["id"]) for row in rows) or "0"
    sqls = [str(compiled),
            f"SELECT execution_id, node FROM execution_nodes WHERE execution_id IN ({ids})",
            f"SELECT execution_id, \"user\" FROM approvals WHERE execution_id IN ({ids}) AND "
            "decision = 'approve' ORDER BY id"]
    engine.dispose()
    times = []
    with psycopg.connect(_plain(url)) as raw:
        for _ in range(runs + 2):
            started = time.perf_counter()
            for sql in sqls:
                raw.execute(sql).fetchall()
            times.append((time.perf_counter() - started) * 1000)
    return stats(times[2:])


def _plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


class InProcess:
    """The page's handler called directly (the console's own code, no server around it, no
    other thread of `runbook serve` sharing the interpreter): its CPU cost."""

    def __init__(self, url: str, folder: Path) -> None:
        from bot.service import Service
        from bot.surfaces.console import pages as console_pages
        from bot.surfaces.console.app import Console

        config = Config.model_validate({
            "database_url": url, "database": {"create": True},
            "runbook_paths": [str(folder / "runbooks")], "requesters": ["*"],
            "console": {"proxy": {"trusted": ["127.0.0.1"]}, "auditors": [f"user:{AUDITOR}"]}})
        self.bot = Service.from_config(config)
        self.console = Console(self.bot, console_pages.ROUTES)
        self.handler = next(h for p, h, _ in console_pages.ROUTES if p == "/executions")

    def time(self, query: str, user: str, runs: int) -> dict[str, float]:
        from starlette.datastructures import QueryParams

        from bot.surfaces.console.app import Ask

        ask = Ask(self.bot, Viewer(user, user == AUDITOR), QueryParams(query), {}, "GET",
                  self.console)
        times = []
        for _ in range(runs + 2):
            started = time.perf_counter()
            self.console._answer(self.handler, ask)
            times.append((time.perf_counter() - started) * 1000)
        return stats(times[2:])


def bench_pages(served: Served, seeded: Seeded, url: str, runs: int,
                folder: Path) -> list[dict[str, Any]]:
    config = Config.model_validate({"requesters": ["*"], "console": {
        "proxy": {"trusted": ["127.0.0.1"]}, "auditors": [f"user:{AUDITOR}"]}})
    direct = InProcess(url, folder)
    cases = [(name, query, AUDITOR) for name, query in pages(seeded).items()]
    cases.append(("a requester's view (every runbook's, by name)", "state=failed", REQUESTER))
    status, _, _, body = served.get("/ui/executions?runbook=drain-node")
    after = body.decode().split('rel="next"')[0].rsplit('href="', 1)[-1].split('"')[0]
    cases.append(("second page (cursor)", after.split("?", 1)[1].replace("&amp;", "&"), AUDITOR))
    found = []
    for name, query, user in cases:
        handler, first = [], []
        for run in range(runs + 2):
            status, spent, ttfb, body = served.get(f"/ui/executions?{query}", user)
            if status != 200:
                sys.exit(f"{name}: {status} {body[:300]!r}")
            if run >= 2:  # two warm-up runs: templates compiled, plans cached
                handler.append(spent)
                first.append(ttfb)
        rows = body.count(b'<tr><td><a href="/ui/executions/')
        viewer = Viewer(user, user == AUDITOR)
        found.append({"page": name, "query": query, "rows": rows,
                      "handler_ms": stats(handler), "ttfb_ms": stats(first),
                      "in_process_ms": direct.time(query, user, runs),
                      "floor_sql_ms": floor_ms(url, query, viewer, config, 50, runs)})
    direct.bot.db.dispose()
    return found


def bench_export(served: Served, seeded: Seeded, url: str, count: int,
                 folder: Path) -> dict[str, Any]:
    since, until = seeded.event_range(count)
    path = f"/ui/events.jsonl?scope=all&since={since}&until={until}"
    before = served.memory()
    started = time.perf_counter()
    served.connection.request("GET", path, headers={"X-Forwarded-User": AUDITOR})
    answer = served.connection.getresponse()
    first = (time.perf_counter() - started) * 1000
    size = lines = 0
    while piece := answer.read(1 << 20):
        size += len(piece)
        lines += piece.count(b"\n")
    seconds = time.perf_counter() - started
    after = served.memory()
    cli = _cli_export(served.env, since, until, folder)
    return {"filtered": bench_filtered_events(served, seeded), "events": lines,
            "bytes": size, "seconds": round(seconds, 2),
            "events_per_s": round(lines / seconds), "ttfb_ms": round(first, 1),
            "server_before": before, "server_after": after, "cli": cli,
            "floor": _fetch_floor(url, since, until)}


def bench_filtered_events(served: Served, seeded: Seeded) -> list[dict[str, Any]]:
    """Exports of the events of a filtered set of executions (their whole trails)."""
    found = []
    served.connection.close()  # idle past the server's keep-alive while the command ran
    for query in (f"node={seeded.busy_node}", "runbook=drain-node&state=failed",
                  "approver=approver03"):
        started = time.perf_counter()
        served.connection.request("GET", f"/ui/events.jsonl?{query}",
                                  headers={"X-Forwarded-User": AUDITOR})
        answer = served.connection.getresponse()
        first = (time.perf_counter() - started) * 1000
        lines = answer.read().count(b"\n")
        found.append({"query": query, "events": lines, "ttfb_ms": round(first, 1),
                      "seconds": round(time.perf_counter() - started, 2)})
    return found


def _cli_export(env: dict[str, str], since: str, until: str, folder: Path) -> dict[str, Any]:
    """`runbook audit export` of the same range to a file: its time and peak RSS (VmHWM,
    read while it runs: a child's ru_maxrss would count this process's pages before exec)."""
    out = folder / "export.jsonl"
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "bot", "audit", "export", "--since", since,
                                "--until", until, "--output", str(out)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0.0
    while process.poll() is None:
        peak = max(peak, _peak_mb(process.pid))
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    size = out.stat().st_size
    out.unlink()
    return {"exit": process.returncode, "seconds": round(seconds, 2), "bytes": size,
            "peak_rss_mb": round(peak, 1)}


def _peak_mb(pid: int) -> float:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # it has just ended
        return 0.0
    found = [line for line in status.splitlines() if line.startswith("VmHWM")]
    return int(found[0].split()[1]) / 1024 if found else 0.0


def _fetch_floor(url: str, since: str, until: str) -> dict[str, Any]:
    """The same rows through a server-side cursor, read and dropped: the floor."""
    started = time.perf_counter()
    count = 0
    with psycopg.connect(_plain(url)) as raw, raw.cursor(name="floor") as cursor:
        cursor.itersize = 1000
        cursor.execute("SELECT seq, ts, execution_id, kind, actor, data, prev_hash, hash FROM "
                       "audit_events WHERE ts >= %s AND ts < %s ORDER BY seq",
                       (_stored(since), _stored(until)))
        for _ in cursor:
            count += 1
    return {"events": count, "seconds": round(time.perf_counter() - started, 2)}


def _stored(moment: str) -> str:
    from bot.store.audit import moment as stored

    return stored(moment)


def report(found: list[dict[str, Any]], export: dict[str, Any], seeded: Seeded) -> None:
    print(f"\nseeded {seeded.executions:,} executions, {seeded.events:,} audit events, "
          f"{seeded.nodes_rows:,} execution nodes in {seeded.seconds:.1f} s (COPY; the "
          "events' hashes are filler, not a valid chain)")
    print(f"machine: {os.cpu_count()} CPUs, load average {seeded.load} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end (other work shares it: the figures are noisy)")
    print(f"\n{'page':<44} {'rows':>4} {'handler in serve':>17} {'first byte':>17} "
          f"{'handler alone':>17} {'floor SQL':>17}")
    print(f"{'(ms, median / p95)':<44} {'':>4}" + f" {'':>17}" * 4)
    for row in found:
        cells = [row[k] for k in ("handler_ms", "ttfb_ms", "in_process_ms", "floor_sql_ms")]
        print(f"{row['page'][:44]:<44} {row['rows']:>4}" + "".join(
            f" {c['median']:>8} / {c['p95']:>6}" for c in cells))
    worst_handler = max(r["handler_ms"]["p95"] for r in found)
    worst_ttfb = max(r["ttfb_ms"]["p95"] for r in found)
    print(f"worst p95: {worst_handler} ms in the handler (goal <= {PAGE_GOAL_MS:g}: "
          f"{'met' if worst_handler <= PAGE_GOAL_MS else 'NOT met'}), {worst_ttfb} ms to "
          f"first byte (goal <= {TTFB_GOAL_MS:g}: "
          f"{'met' if worst_ttfb <= TTFB_GOAL_MS else 'NOT met'})")
    e = export
    print(f"\nexport of {e['events']:,} events (/ui/events.jsonl?scope=all): "
          f"{e['bytes'] / 1e6:,.0f} MB in {e['seconds']} s ({e['events_per_s']:,} events/s), "
          f"first byte after {e['ttfb_ms']} ms")
    print(f"runbook serve resident memory: {e['server_before']['rss_mb']} MB before, peak "
          f"{e['server_after']['peak_mb']} MB (before the export: peak "
          f"{e['server_before']['peak_mb']} MB; goal <= {RSS_GOAL_MB:g} MB: "
          f"{'met' if e['server_after']['peak_mb'] <= RSS_GOAL_MB else 'NOT met'})")
    print(f"runbook audit export of the same range: {e['cli']['seconds']} s, peak RSS "
          f"{e['cli']['peak_rss_mb']} MB, {e['cli']['bytes'] / 1e6:,.0f} MB written")
    print(f"floor: the rows through a server-side cursor, nothing done with them: "
          f"{e['floor']['seconds']} s for {e['floor']['events']:,}")
    for item in e["filtered"]:
        print(f"events of the executions of {item['query']}: {item['events']:,} events in "
              f"{item['seconds']} s, first byte after {item['ttfb_ms']} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--executions", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--export-events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    cleanup_on_signals()
    server = None
    url = os.environ.get("RUNBOOK_BENCH_PG_URL")
    if not url:
        try:
            server = postgres.start()
        except postgres.PostgresMissing as exc:
            sys.exit(f"{exc} (or `make deps`; or set RUNBOOK_BENCH_PG_URL)")
        url = server.url
    url = postgres.fresh_database(url, f"bench_console_{secrets.token_hex(4)}")
    folder = Path(tempfile.mkdtemp(prefix="bench-console-"))
    served = None
    try:
        db.connect(url).dispose()  # the schema at head
        load = os.getloadavg()[0]
        seeded = seed(_plain(url), args.executions, args.events)
        seeded.load = round(load, 1)
        served = Served(url, folder)
        found = bench_pages(served, seeded, url, args.runs, folder)
        export = bench_export(served, seeded, url, args.export_events, folder)
    finally:
        if served is not None:
            served.stop()
        if server is not None:
            server.stop()
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    report(found, export, seeded)
    finish("console", {"pages": found, "export": export, "seed_seconds": seeded.seconds})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
