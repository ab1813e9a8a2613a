"""Seeds bench/console.py's PostgreSQL database fast, with COPY: executions spread over 200
days (states that no engine picks up: ended, or held), the nodes each touched (one node, or a
hostlist of 4 to 32), approvals, and about 20 audit events each, in time order. The events'
hashes are filler: NOT a valid chain (verify would fail); the timings do not depend on it."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg

START = datetime(2026, 5, 15, tzinfo=UTC)
DAYS = 200
RUNBOOKS = ("drain-node", "resume-node", "swap-gpu", "reboot-node", "driver-rollback",
            "restore-db", "open-reservation", "close-reservation", "drain-pool", "cordon-node",
            "health-check", "gpu-reset")
STATES = (("succeeded", 70), ("failed", 12), ("cancelled", 6), ("denied", 5), ("expired", 5),
          ("held", 2))
SOURCES = (("cli", 40), ("chat", 35), ("alert", 15), ("schedule", 7), ("window", 3))
NODES = 2048
PIECE = 20_000  # rows per write into a COPY


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _weighted(rng: random.Random, choices: tuple[tuple[str, int], ...]) -> str:
    return rng.choices([c for c, _ in choices], [w for _, w in choices])[0]


@dataclass
class Seeded:
    executions: int
    events: int
    nodes_rows: int
    seconds: float
    busy_node: str
    first_ts: str
    last_ts: str
    load: float = 0.0  # the machine's load average when the run began

    def day(self, number: int) -> str:
        return (START + timedelta(days=number)).strftime("%Y-%m-%d")

    def event_range(self, count: int) -> tuple[str, str]:
        """A time range holding about ``count`` events (events are spread evenly)."""
        first = datetime.fromisoformat(self.first_ts.replace("Z", "+00:00"))
        last = datetime.fromisoformat(self.last_ts.replace("Z", "+00:00"))
        share = min(1.0, count / self.events)
        since = first + (last - first) * 0.1
        return (since.strftime("%Y-%m-%dT%H:%M:%S"),
                (since + (last - first) * share).strftime("%Y-%m-%dT%H:%M:%S"))


@dataclass
class _Execution:
    id: int
    runbook: str
    state: str
    requested_by: str
    requested_at: datetime
    finished_at: datetime | None
    source: str
    break_glass: bool
    checks_failed: int
    nodes: list[str]
    approvers: list[str]


def _executions(count: int, rng: random.Random) -> Iterator[_Execution]:
    gap = DAYS * 86400 / count
    for number in range(1, count + 1):
        state = _weighted(rng, STATES)
        requested = START + timedelta(seconds=number * gap + rng.random())
        finished = None if state == "held" else requested + timedelta(seconds=rng.randint(5, 900))
        first = rng.randint(1, NODES)
        width = 1 if rng.random() < 0.8 else rng.randint(4, 32)
        nodes = [f"gpu{n:04d}" for n in range(first, min(NODES, first + width - 1) + 1)]
        approvers = rng.sample([f"approver{n:02d}" for n in range(30)], rng.randint(0, 2))
        yield _Execution(number, rng.choice(RUNBOOKS), state, f"user{rng.randint(0, 49):03d}",
                         requested, finished, _weighted(rng, SOURCES), rng.random() < 0.02,
                         1 if state == "failed" and rng.random() < 0.6 else 0, nodes, approvers)


def _execution_line(ex: _Execution) -> str:
    plan = '{"locks":[' + ",".join(f'"node:{n}"' for n in ex.nodes) + "]}"
    finished = _stamp(ex.finished_at) if ex.finished_at else "\\N"
    return "\t".join((
        str(ex.id), ex.runbook, f"1.{ex.id % 4}.0", "0" * 64, '{"node":"' + ex.nodes[0] + '"}',
        ex.requested_by, _stamp(ex.requested_at), ex.state, "steps", plan, "1" * 64,
        str(len(ex.approvers)), "\\N", "restart", "\\N", "\\N", "f", "f", "0",
        "\\N" if ex.state != "failed" else "step drain failed: timeout", finished, "0", "0",
        ex.source, "t" if ex.break_glass else "f", str(ex.checks_failed))) + "\n"


EXECUTION_COLUMNS = (
    "id, runbook, version, content_hash, params, requested_by, requested_at, state, stage, "
    "plan, plan_hash, approvals_required, approval_deadline, resume, owner, lease_until, "
    "cancel_requested, resume_requested, fencing_token, error, finished_at, row_version, "
    "epoch, source, break_glass, checks_failed")
KINDS = ("requested", "planned", "approved", "started", "check_evaluated", "step_started",
         "step_finished", "step_started", "step_finished", "step_started", "step_finished",
         "step_started", "step_finished", "check_evaluated", "step_started", "step_finished",
         "step_started", "step_finished", "check_evaluated", "finished")


def _event_lines(ex: _Execution, seq: int, per: int) -> Iterator[str]:
    for i in range(per):
        kind = KINDS[i % len(KINDS)]
        ts = _stamp(ex.requested_at + timedelta(seconds=i * 2, microseconds=seq % 997))
        yield "\t".join((str(seq + i), ts, str(ex.id), kind, ex.requested_by,
                         _event_data(ex, kind, i), f"{seq + i - 1:064x}",
                         f"{seq + i:064x}")) + "\n"


def _event_data(ex: _Execution, kind: str, position: int) -> str:
    """Canonical JSON of about the size the bot writes for each kind."""
    if kind == "requested":
        return f'{{"params":{{"node":"{ex.nodes[0]}"}},"runbook":"{ex.runbook}",' \
               f'"source":"{ex.source}","version":"1.0.0"}}'
    if kind == "check_evaluated":
        passed = "false" if ex.checks_failed else "true"
        return f'{{"check":"gpu idle","expect":"< 5","kind":"promql","passed":{passed},' \
               f'"stage":"pre-check","value":3}}'
    return f'{{"attempt":1,"changed":true,"step":"s{position}","summary":"node ' \
           f'{ex.nodes[0]} done"}}'


def seed(url: str, count: int, events: int, seed_value: int = 15) -> Seeded:
    rng = random.Random(seed_value)
    per = max(1, events // count)
    started = time.perf_counter()
    all_rows = list(_executions(count, rng))
    counts = {"events": 0, "nodes": 0}
    with psycopg.connect(url) as conn:
        _copy(conn, f"COPY executions ({EXECUTION_COLUMNS}) FROM STDIN",
              (_execution_line(ex) for ex in all_rows))
        _copy(conn, "COPY execution_nodes (node, execution_id) FROM STDIN",
              _counted(counts, "nodes", (f"{n}\t{ex.id}\n" for ex in all_rows for n in ex.nodes)))
        _copy(conn, 'COPY approvals (execution_id, "user", decision, plan_hash, at) FROM STDIN',
              (f"{ex.id}\t{user}\tapprove\t{'1' * 64}\t{_stamp(ex.requested_at)}\n"
               for ex in all_rows for user in ex.approvers))
        _copy(conn, "COPY audit_events (seq, ts, execution_id, kind, actor, data, prev_hash, "
                    "hash) FROM STDIN",
              _counted(counts, "events", (line for i, ex in enumerate(all_rows)
                                          for line in _event_lines(ex, i * per + 1, per))))
        with conn.cursor() as cursor:
            for name in sorted({ex.runbook for ex in all_rows}):
                cursor.execute("INSERT INTO runbook_versions VALUES (%s, '1.0.0', %s, '', %s)",
                               (name, "0" * 64, _stamp(START)))
            cursor.execute("SELECT setval('executions_id_seq', %s)", (count,))
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
    busiest: dict[str, int] = {}
    for ex in all_rows:
        for node in ex.nodes:
            busiest[node] = busiest.get(node, 0) + 1
    first, last = all_rows[0].requested_at, all_rows[-1].requested_at
    return Seeded(count, counts["events"], counts["nodes"], time.perf_counter() - started,
                  max(busiest, key=lambda n: busiest[n]), _stamp(first), _stamp(last))


def _counted(counts: dict[str, int], key: str, lines: Iterator[str]) -> Iterator[str]:
    for line in lines:
        counts[key] += 1
        yield line


def _copy(conn: psycopg.Connection[tuple[object, ...]], sql: str, lines: Iterator[str]) -> None:
    with conn.cursor() as cursor, cursor.copy(sql) as copy:
        gathered: list[str] = []
        for line in lines:
            gathered.append(line)
            if len(gathered) >= PIECE:
                copy.write("".join(gathered))
                gathered = []
        if gathered:
            copy.write("".join(gathered))
