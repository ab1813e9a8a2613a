"""Audit log throughput on a SQLite file database.

1. append: ``bot.store.audit.append`` with one event per transaction (``engine.begin()``,
   the way the engine writes every state change), on a file DB opened by
   ``bot.store.db.connect`` (WAL, synchronous=NORMAL, BEGIN IMMEDIATE).
   Goal: >= 2,000 events/s.
2. verify: ``bot.store.audit.verify(engine)`` over a log of --events events (default
   1,000,000). The log is built quickly: valid chained events computed with
   ``bot.store.audit.event_hash``, bulk-inserted with executemany in one transaction.
   Goal: >= 100,000 events/s.
3. sanity: edit one event in the middle (and, separately, delete one) and show
   that verify names it.

Run: .venv/bin/python bench/audit_throughput.py [--events 1000000] [--appends 5000]

Prints human-readable lines and, last, one JSON line. It never asserts a time.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import cleanup_on_signals, finish  # bench/, next to this file

from bot.store import audit, db
from bot.store.words import Kind
from kit.canonical import canonical

APPEND_GOAL = 2_000
VERIFY_GOAL = 100_000
KINDS = (Kind.STEP_STARTED, Kind.STEP_FINISHED, Kind.CHECK_EVALUATED, Kind.REQUESTED,
         Kind.PLANNED)


def bench_append(url: str, count: int) -> dict[str, Any]:
    engine = db.connect(url)
    data = {"step": "drain", "action": "slurm.drain", "args": {"node": "gpu07", "reason": "XID 79"},
            "operations": ['scontrol update NodeName=gpu07 State=DRAIN Reason="XID 79"'],
            "attempt": 1}
    for i in range(50):  # warm-up: connection pool, statement caches
        with engine.begin() as conn:
            audit.append(conn, Kind.REQUESTED, "bench", {"warm-up": i}, None)
    latencies = []
    began = time.perf_counter()
    for i in range(count):
        t0 = time.perf_counter()
        with engine.begin() as conn:
            audit.append(conn, KINDS[i % len(KINDS)], "engine", data, execution_id=1 + i // 20)
        latencies.append((time.perf_counter() - t0) * 1000)
    elapsed = time.perf_counter() - began
    verdict = audit.verify(engine)
    engine.dispose()
    return {
        "events": count,
        "seconds": elapsed,
        "events_per_s": count / elapsed,
        "latency_median_ms": statistics.median(latencies),
        "latency_p99_ms": sorted(latencies)[int(0.99 * (len(latencies) - 1))],
        "chain_ok": verdict.ok,
    }


def build_log(path: Path, count: int, batch: int = 50_000) -> float:
    """Insert ``count`` valid chained events; returns seconds taken."""
    began = time.perf_counter()
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute("PRAGMA synchronous=OFF")
    raw.execute("BEGIN IMMEDIATE")
    prev = audit.GENESIS
    base = 1_750_000_000  # a fixed epoch second: timestamps advance 1 ms per event
    rows: list[tuple[Any, ...]] = []
    sql = ("INSERT INTO audit_events (seq, ts, execution_id, kind, actor, data, prev_hash, hash) "
           "VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
    for seq in range(1, count + 1):
        millis = base * 1000 + seq
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(millis // 1000)) + (
            f".{(millis % 1000) * 1000:06d}Z")
        execution_id = None if seq % 50 == 0 else 1 + seq // 40
        kind = KINDS[seq % len(KINDS)]
        actor = "engine" if seq % 7 else "alice"
        data_json = canonical({
            "step": f"s{seq % 200:04d}", "attempt": 1, "state": "succeeded",
            "summary": f"drained gpu{seq % 64:02d}", "details": {"node": f"gpu{seq % 64:02d}"},
            "changed": bool(seq % 2), "note": "ünïcode ok",
        })
        digest = audit.event_hash(ts, execution_id, kind, actor, data_json, prev)
        rows.append((seq, ts, execution_id, kind, actor, data_json, prev, digest))
        prev = digest
        if len(rows) >= batch:
            raw.executemany(sql, rows)
            rows.clear()
    if rows:
        raw.executemany(sql, rows)
    raw.execute("COMMIT")
    raw.close()
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000,
                        help="events in the log that verify walks (default 1,000,000)")
    parser.add_argument("--appends", type=int, default=5_000,
                        help="events appended one per transaction (default 5,000)")
    parser.add_argument("--verify-runs", type=int, default=3)
    parser.add_argument("--profile", metavar="FILE",
                        help="write a cProfile of one verify run to FILE (pstats format)")
    args = parser.parse_args(argv)
    cleanup_on_signals()
    result: dict[str, Any] = {"benchmark": "audit_throughput", "python": sys.version.split()[0],
                              "sqlite": sqlite3.sqlite_version}

    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        folder = Path(tmp)

        # 1. append, one event per transaction
        appended = bench_append(f"sqlite:///{folder / 'append.db'}", args.appends)
        result["append"] = {**appended, "goal_events_per_s": APPEND_GOAL,
                            "goal_met": appended["events_per_s"] >= APPEND_GOAL}
        print(f"append (bot.store.audit.append, one event per transaction, SQLite file DB, WAL): "
              f"{appended['events']} events in {appended['seconds']:.2f} s = "
              f"{appended['events_per_s']:,.0f} events/s "
              f"(per transaction: median {appended['latency_median_ms']:.3f} ms, "
              f"p99 {appended['latency_p99_ms']:.3f} ms; chain ok: {appended['chain_ok']})")
        print(f"  goal >= {APPEND_GOAL:,} events/s: "
              f"{'met' if result['append']['goal_met'] else 'MISSED'}")

        # 2. verify a large log
        path = folder / "verify.db"
        url = f"sqlite:///{path}"
        db.connect(url).dispose()  # create the schema through the migrations
        built = build_log(path, args.events)
        size_mb = path.stat().st_size / 1e6
        print(f"built a log of {args.events:,} chained events in {built:.1f} s "
              f"({size_mb:.0f} MB)")
        engine = db.connect(url)
        times = []
        verdict = None
        for run in range(args.verify_runs):
            profiler = None
            if args.profile and run == 0:
                import cProfile

                profiler = cProfile.Profile()
                profiler.enable()
            t0 = time.perf_counter()
            verdict = audit.verify(engine)
            elapsed = time.perf_counter() - t0
            if profiler:
                profiler.disable()
                profiler.dump_stats(args.profile)
                print(f"  (run {run + 1} profiled to {args.profile}; not counted)")
                continue
            times.append(elapsed)
        assert verdict is not None
        best, median = min(times), statistics.median(times)
        rate = verdict.events / median
        result["verify"] = {
            "events": args.events, "ok": verdict.ok, "counted": verdict.events,
            "build_seconds": built, "db_mb": size_mb,
            "seconds_median": median, "seconds_best": best, "runs": len(times),
            "events_per_s": rate, "events_per_s_best": verdict.events / best,
            "goal_events_per_s": VERIFY_GOAL, "goal_met": rate >= VERIFY_GOAL,
        }
        print(f"verify (bot.store.audit.verify): {verdict.events:,} events, ok={verdict.ok}, "
              f"median {median:.2f} s over {len(times)} runs (best {best:.2f} s) = "
              f"{rate:,.0f} events/s (best {verdict.events / best:,.0f})")
        print(f"  goal >= {VERIFY_GOAL:,} events/s: "
              f"{'met' if result['verify']['goal_met'] else 'MISSED'}")

        # 3. sanity: an edited event and a deleted event are named
        middle = max(1, args.events // 2)
        raw = sqlite3.connect(path, isolation_level=None)
        (original,) = raw.execute("SELECT data FROM audit_events WHERE seq = ?",
                                  (middle,)).fetchone()
        raw.execute("UPDATE audit_events SET data = ? WHERE seq = ?",
                    (original.replace("succeeded", "suceeded"), middle))
        t0 = time.perf_counter()
        edited = audit.verify(engine)
        edited_s = time.perf_counter() - t0
        raw.execute("UPDATE audit_events SET data = ? WHERE seq = ?", (original, middle))
        gone = middle + 1 if middle < args.events else middle
        raw.execute("DELETE FROM audit_events WHERE seq = ?", (gone,))
        deleted = audit.verify(engine)
        raw.close()
        engine.dispose()
        edit_found = (not edited.ok) and edited.seq == middle
        delete_found = (not deleted.ok) and deleted.seq == gone
        result["tamper"] = {
            "edited_seq": middle, "edit_detected": edit_found, "edit_problem": edited.problem,
            "edit_verify_seconds": edited_s,
            "deleted_seq": gone, "delete_detected": delete_found,
            "delete_problem": deleted.problem,
        }
        print(f"tamper: edited event {middle}: "
              f"{'DETECTED' if edit_found else 'NOT DETECTED'} - {edited.problem!r} "
              f"(after {edited.events:,} good events, {edited_s:.2f} s)")
        print(f"tamper: deleted event {gone}: "
              f"{'DETECTED' if delete_found else 'NOT DETECTED'} - {deleted.problem!r}")

    finish("audit_throughput", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
