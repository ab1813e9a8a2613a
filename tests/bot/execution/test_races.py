"""Decisions racing from separate OS processes (safety invariants 1 and 2).

Two long-lived worker processes (started with "spawn", each with its own database
connections) take one decision each per trial on a fresh request, released together by a
shared barrier: approve against deny, approve against cancel, two approvers at once, and one
approver twice at once; for alert proposals, two Runs, Run against Dismiss, and one new alert
received twice. After every trial the execution, its recorded decisions and its audit
events must tell one consistent story: a decision that lost the race is refused and leaves
nothing applied. Run on PostgreSQL (READ COMMITTED: the compare-and-set's row lock decides)
and on a SQLite file (WAL; BEGIN IMMEDIATE already serialises whole decisions there); the
audit chain verifies at the end.
"""

from __future__ import annotations

import json
import multiprocessing
import queue
import random
import re
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from bot.alerts import proposing
from bot.execution import executions
from bot.execution.checks.core import Checks
from bot.runbooks.catalogue import Catalogue
from bot.runbooks.params import Inventory
from bot.service import Service
from bot.store import audit, db
from bot.store.schema import approvals, locks, proposals
from bot.store.words import Kind
from kit.canonical import canonical
from kit.errors import Refused
from tests import postgres
from tests.bot import fakes
from tests.conftest import lab_config

# Trials per test: approve against deny, the race that once let a denied request run, gets
# the most; the whole file stays within about a minute on two cores.
TRIALS = {"postgres": 100, "sqlite": 10}
DENY_TRIALS = {"postgres": 100, "sqlite": 10}
PROPOSAL_TRIALS = {"postgres": 30, "sqlite": 5}  # each failed in its first trials before the fix
SPAWN = multiprocessing.get_context("spawn")
WAIT = 60.0  # seconds a worker or the test waits for the other side before giving up

REQUESTER = "alice"  # oncall: may request and cancel, may not approve; carol and dave may


def _runbook(name: str, required: int) -> dict[str, Any]:
    """No node parameter, so no locks: every trial makes a new request of its own."""
    return {
        "name": name, "version": "1.0.0", "summary": f"race test, {required} approval(s)",
        "risk": "medium",
        "params": {"ticket": {"type": "text", "max_length": 40, "required": True}},
        "approval": {"required": required, "approvers": ["group:gpu-leads"]},
        "steps": [{"id": "a", "action": "test.record", "with": {"key": "{{ ticket }}"}}],
    }


RUNBOOKS = {"one": _runbook("one", 1), "two": _runbook("two", 2), "fleet": {
    # a set of nodes, as drain-nodes takes it: every node of the set is locked
    "name": "fleet", "version": "1.0.0", "summary": "race test, a set of nodes",
    "risk": "medium", "params": {"nodes": {"type": "nodes", "required": True}},
    "steps": [{"id": "a", "action": "test.record", "with": {"key": "{{ nodes }}"}}]}}


ALERT_RULES = [{"match": {"alertname": "GpuRace"}, "runbook": "one",
                "params": {"ticket": "{{ labels.ticket }}"}}]


def _bot(url: str, folder: str) -> Service:
    config = lab_config(url, Path(folder), alert_rules=ALERT_RULES)
    nodes = frozenset(config.inventory.nodes)
    return Service(config=config, db=db.connect(config.resolved_database_url()),
               catalogue=Catalogue(fakes.test_actions()), checks=Checks({}, sleep=lambda s: None),
               inventory=Inventory(nodes=nodes, slurm=nodes, kubernetes=frozenset()))


def _decide(bot: Service, op: str, execution_id: int, user: str) -> str:
    if op == "approve":
        return bot.approve(execution_id, user).state
    if op == "deny":
        return bot.deny(execution_id, user, "racing").state
    if op == "cancel":
        return bot.cancel(execution_id, user).state
    if op == "proposal_run":  # here execution_id is a proposal's id
        return f"execution {proposing.run(bot, execution_id, user)}"
    if op == "proposal_dismiss":
        return proposing.dismiss(bot, execution_id, user, "racing").state
    if op.startswith("request "):  # a request of the set after the word
        return f"execution {bot.request('fleet', {'nodes': op.split(' ', 1)[1]}, user)}"
    if op == "alert":  # the same new firing, as a retry or a second replica receives it
        made = proposing.receive(bot, proposing.parse(json.dumps({
            "version": "4", "status": "firing", "alerts": [{
                "status": "firing", "fingerprint": f"fp-new-{execution_id}",
                "startsAt": "2026-12-01T00:00:00Z",
                "labels": {"alertname": "GpuRace", "ticket": f"alert-{execution_id}"}}]}
        ).encode()))
        return " ".join(f"proposal {p.id} {p.state}" for p in made) or "none"
    raise AssertionError(op)


def _worker(index: int, tasks: Any, results: Any, barrier: Any) -> None:
    """One racer: per task, wait for the other racer at the barrier, then decide at once.
    It keeps one Service (and its connection pool) per database it was sent to."""
    bots: dict[str, Service] = {}
    try:
        while (task := tasks.get()) is not None:
            trial, url, folder, op, execution_id, user, delay = task
            bot = bots.get(url) or bots.setdefault(url, _bot(url, folder))
            try:
                barrier.wait(WAIT)
            except threading.BrokenBarrierError:
                results.put((trial, index, "error", "the barrier broke"))
                continue
            if delay:
                time.sleep(delay)
            try:
                results.put((trial, index, "done", _decide(bot, op, execution_id, user)))
            except Refused as exc:
                results.put((trial, index, "refused", str(exc)))
            except Exception as exc:  # a deadlock, a leaked IntegrityError: the test fails
                results.put((trial, index, "error", f"{type(exc).__name__}: {exc}"))
    finally:
        for bot in bots.values():
            bot.db.dispose()


class Workers:
    """Two worker processes, started once for the whole file and reused by every trial."""

    def __init__(self) -> None:
        self.barrier = SPAWN.Barrier(2)
        self.results = SPAWN.Queue()
        self.tasks = [SPAWN.Queue(), SPAWN.Queue()]
        self.processes = [
            SPAWN.Process(target=_worker, args=(i, self.tasks[i], self.results, self.barrier),
                          daemon=True)
            for i in range(2)
        ]
        for process in self.processes:
            process.start()
        self.trials = 0

    def decide(self, url: str, folder: Path, execution_id: int,
               sides: list[tuple[str, str]], delays: list[float]) -> list[tuple[str, str]]:
        """Worker i does (op, user) ``sides[i]`` after ``delays[i]`` seconds, both released
        together; their (result, detail) in the same order."""
        self.trials += 1
        for index, (op, user) in enumerate(sides):
            self.tasks[index].put((self.trials, url, str(folder), op, execution_id, user,
                                   delays[index]))
        by_index: dict[int, tuple[str, str]] = {}
        while len(by_index) < 2:
            try:
                trial, index, result, detail = self.results.get(timeout=WAIT)
            except queue.Empty:
                alive = [p.is_alive() for p in self.processes]
                raise AssertionError(f"execution {execution_id}: no answer within {WAIT:g}s "
                                     f"(workers alive: {alive})") from None
            assert trial == self.trials, (trial, self.trials)
            by_index[index] = (result, detail)
        return [by_index[0], by_index[1]]

    def close(self) -> None:
        for tasks in self.tasks:
            tasks.put(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)


@dataclass(frozen=True)
class Outcome:
    op: str
    user: str
    result: str  # done | refused | error
    detail: str  # the state it left, or why it was refused


@dataclass(frozen=True)
class Trial:
    execution_id: int
    state: str
    decisions: list[tuple[str, str]]  # (user, decision) in the order recorded
    events: list[dict[str, Any]]

    def kinds(self, *kinds: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] in kinds]


class Racers:
    """One database, its requests made here and decided by the two workers."""

    def __init__(self, backend: str, url: str, folder: Path, workers: Workers) -> None:
        self.backend, self.url, self.folder, self.workers = backend, url, folder, workers
        self.bot = _bot(url, str(folder))
        self.bot.runbooks()  # record the versions once, before the workers look
        self.random = random.Random(20240607)
        self.trials = 0

    def race(self, runbook: str, first: tuple[str, str],
             second: tuple[str, str]) -> tuple[Trial, list[Outcome]]:
        """Request ``runbook``, then have (op, user) ``first`` and ``second`` decide at the
        same moment from the two processes; the outcomes come back in that order."""
        self.trials += 1
        trial = self.trials
        execution_id = self.bot.request(runbook, {"ticket": f"race-{trial}"}, REQUESTER)
        # Alternate which process plays which side; now and then hold one side back by up
        # to 2 ms so the other is caught at every point of its transaction, not just the start.
        sides = [first, second] if trial % 2 else [second, first]
        delays = [0.0, 0.0]
        if trial % 3 == 0:
            delays[self.random.randrange(2)] = self.random.uniform(0, 0.002)
        answers = self.workers.decide(self.url, self.folder, execution_id, sides, delays)
        outcomes = [Outcome(*sides[i], *answers[i]) for i in range(2)]
        if trial % 2 == 0:
            outcomes.reverse()
        errors = [o for o in outcomes if o.result == "error"]
        assert not errors, f"execution {execution_id}: {errors}"
        return self.look(execution_id), outcomes

    def race_proposal(self, first: tuple[str, str], second: tuple[str, str],
                      ) -> tuple[Any, list[Outcome], list[int]]:
        """An open proposal of runbook "one", acted on by both sides at the same moment; the
        proposal after it, the outcomes in the given order, and the executions it made."""
        self.trials += 1
        ticket = f"proposal-{self.trials}"
        with self.bot.db.begin() as conn:
            key = conn.execute(proposals.insert().values(
                fingerprint=f"fp{self.trials}", alertname="GpuRace", labels="{}",
                runbook="one", params=canonical({"ticket": ticket}), state="open",
                alert_status="firing", created_at="2026-12-01T00:00:00Z",
                updated_at="2026-12-01T00:00:00Z")).inserted_primary_key
        assert key is not None
        proposal_id = int(key[0])
        sides = [first, second] if self.trials % 2 else [second, first]
        answers = self.workers.decide(self.url, self.folder, proposal_id, sides, [0.0, 0.0])
        outcomes = [Outcome(*sides[i], *answers[i]) for i in range(2)]
        if self.trials % 2 == 0:
            outcomes.reverse()
        assert not [o for o in outcomes if o.result == "error"], outcomes
        with self.bot.db.connect() as conn:
            made = [e["execution_id"] for e in audit.events(conn)
                    if e["kind"] == Kind.REQUESTED and e["data"].get("params") == {
                        "ticket": ticket}]
        return proposing.get(self.bot, proposal_id), outcomes, made

    def race_requests(self, first: str, second: str) -> list[Outcome]:
        """Two requests of the "fleet" runbook over these sets, at the same moment."""
        self.trials += 1
        sides = [(f"request {first}", REQUESTER), (f"request {second}", REQUESTER)]
        if self.trials % 2 == 0:
            sides.reverse()
        answers = self.workers.decide(self.url, self.folder, 0, sides, [0.0, 0.0])
        outcomes = [Outcome(*sides[i], *answers[i]) for i in range(2)]
        assert not [o for o in outcomes if o.result == "error"], outcomes
        return outcomes

    def held(self) -> dict[str, int]:
        with self.bot.db.connect() as conn:
            return {row.name: row.execution_id for row in conn.execute(select(locks))}

    def look(self, execution_id: int) -> Trial:
        with self.bot.db.connect() as conn:
            ex = executions.get(conn, execution_id)
            decisions = [(row.user, row.decision) for row in conn.execute(
                select(approvals.c.user, approvals.c.decision)
                .where(approvals.c.execution_id == execution_id).order_by(approvals.c.id))]
            events = list(audit.events(conn, execution_id=execution_id))
        return Trial(execution_id, ex.state, decisions, events)


@pytest.fixture(scope="module")
def workers() -> Iterator[Workers]:
    found = Workers()
    yield found
    found.close()


@pytest.fixture(scope="module",
                params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def racers(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
           workers: Workers) -> Iterator[Racers]:
    top = tmp_path_factory.mktemp(f"races-{request.param}")
    folder = top / "runbooks"
    folder.mkdir()
    for name, body in RUNBOOKS.items():
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    if request.param == "sqlite":
        url = f"sqlite:///{top / 'bot.db'}"
    else:
        server = request.getfixturevalue("postgres_server")
        url = postgres.fresh_database(server.url, f"races_{secrets.token_hex(6)}")
    db.connect(url).dispose()  # migrate once, here, not in two racing workers
    found = Racers(request.param, url, folder, workers)
    try:
        yield found
        verdict = audit.verify(found.bot.db)
        assert verdict.ok, verdict.problem
    finally:
        found.bot.db.dispose()


def trials(racers: Racers, counts: dict[str, int] = TRIALS) -> int:
    return counts[racers.backend]


LOST = re.compile(r"execution \d+ is (approved|denied|cancelled): there is nothing to "
                  r"(approve|deny|decide)")


def _lost_the_row(outcome: Outcome) -> bool:
    """Refused by the compare-and-set itself: it had read the request as awaiting approval."""
    return outcome.result == "refused" and outcome.detail.endswith("nothing to decide")


def test_approve_racing_deny_never_runs_a_denied_request(racers: Racers) -> None:
    raced = 0
    for _ in range(trials(racers, DENY_TRIALS)):
        trial, (approve, deny) = racers.race("one", ("approve", "carol"), ("deny", "dave"))
        where = f"execution {trial.execution_id}: {approve}, {deny}, {trial.decisions}"
        assert not (trial.kinds("approved") and trial.kinds("denied")), where
        assert sorted([approve.result, deny.result]) == ["done", "refused"], where
        loser = approve if approve.result == "refused" else deny
        assert LOST.fullmatch(loser.detail), where
        raced += _lost_the_row(loser)
        if deny.result == "done":
            assert trial.state == deny.detail == "denied", where
            assert trial.decisions == [("dave", "deny")], where
            assert not trial.kinds("approved"), where
            assert [e["data"]["state"] for e in trial.kinds("finished")] == ["denied"], where
            after = trial.events[trial.events.index(trial.kinds("finished")[0]) + 1:]
            assert {e["kind"] for e in after} <= {"approval_refused"}, where
        else:
            assert trial.state == approve.detail == "approved", where
            assert trial.decisions == [("carol", "approve")], where
            assert not trial.kinds("denied", "finished"), where
    if racers.backend == "postgres":
        # Both had read the request as awaiting approval, and the row decided: they raced.
        # (SQLite's BEGIN IMMEDIATE makes the loser wait before it reads anything.)
        assert raced > 0, "no trial overlapped: the test did not make them race"
    assert audit.verify(racers.bot.db).ok


def test_approve_racing_cancel_never_approves_a_cancelled_request(racers: Racers) -> None:
    for _ in range(trials(racers)):
        trial, (approve, cancel) = racers.race("one", ("approve", "carol"),
                                               ("cancel", REQUESTER))
        where = f"execution {trial.execution_id}: {approve}, {cancel}, {trial.decisions}"
        # A cancel always wins in the end: before the approval, or just after it.
        assert (cancel.result, cancel.detail, trial.state) == ("done", "cancelled",
                                                               "cancelled"), where
        finished = trial.kinds("finished")
        assert [e["data"]["state"] for e in finished] == ["cancelled"], where
        assert len(trial.kinds("cancel_requested")) == 1, where
        if approve.result == "done":
            assert approve.detail == "approved", where
            assert trial.decisions == [("carol", "approve")], where
            assert [e["seq"] for e in trial.kinds("approved")] < [finished[0]["seq"]], where
        else:
            assert LOST.fullmatch(approve.detail), where
            assert trial.decisions == [], where
            assert not trial.kinds("approved"), where
    assert audit.verify(racers.bot.db).ok


def test_two_approvers_at_once_both_count(racers: Racers) -> None:
    for _ in range(trials(racers)):
        trial, outcomes = racers.race("two", ("approve", "carol"), ("approve", "dave"))
        where = f"execution {trial.execution_id}: {outcomes}, {trial.decisions}"
        assert [o.result for o in outcomes] == ["done", "done"], where
        assert sorted(o.detail for o in outcomes) == ["approved", "awaiting_approval"], where
        assert trial.state == "approved", where
        assert sorted(trial.decisions) == [("carol", "approve"), ("dave", "approve")], where
        counts = [e["data"]["approvals"] for e in trial.kinds("approved")]
        assert counts == [1, 2], where
    assert audit.verify(racers.bot.db).ok


def test_one_approver_twice_at_once_counts_once(racers: Racers) -> None:
    for _ in range(trials(racers)):
        trial, outcomes = racers.race("two", ("approve", "carol"), ("approve", "carol"))
        where = f"execution {trial.execution_id}: {outcomes}, {trial.decisions}"
        assert sorted(o.result for o in outcomes) == ["done", "refused"], where
        won, lost = sorted(outcomes, key=lambda o: o.result)
        assert won.detail == "awaiting_approval", where
        assert re.fullmatch(rf"carol has already (approved|decided on) execution "
                            rf"{trial.execution_id}", lost.detail), where
        assert trial.state == "awaiting_approval", where
        assert trial.decisions == [("carol", "approve")], where
        assert [e["data"]["approvals"] for e in trial.kinds("approved")] == [1], where
        assert racers.bot.approvals(trial.execution_id) == ["carol"], where
    assert audit.verify(racers.bot.db).ok


def test_two_runs_of_one_proposal_at_once_make_one_execution(racers: Racers) -> None:
    for _ in range(trials(racers, PROPOSAL_TRIALS)):
        proposal, outcomes, made = racers.race_proposal(("proposal_run", "alice"),
                                                        ("proposal_run", "bob"))
        where = f"proposal {proposal.id}: {outcomes}, executions {made}"
        assert sorted(o.result for o in outcomes) == ["done", "refused"], where
        won = next(o for o in outcomes if o.result == "done")
        assert len(made) == 1 and won.detail == f"execution {made[0]}", where
        assert (proposal.state, proposal.execution_id) == ("started", made[0]), where
    assert audit.verify(racers.bot.db).ok


def test_run_racing_dismiss_of_one_proposal_does_one_of_them(racers: Racers) -> None:
    for _ in range(trials(racers, PROPOSAL_TRIALS)):
        proposal, (run, dismiss), made = racers.race_proposal(("proposal_run", "alice"),
                                                              ("proposal_dismiss", "bob"))
        where = f"proposal {proposal.id}: {run}, {dismiss}, executions {made}"
        assert sorted([run.result, dismiss.result]) == ["done", "refused"], where
        if run.result == "done":
            assert (proposal.state, len(made)) == ("started", 1), where
        else:
            assert (proposal.state, made) == ("dismissed", []), where
    assert audit.verify(racers.bot.db).ok


def test_one_new_alert_received_twice_at_once_makes_one_proposal(racers: Racers) -> None:
    for _ in range(trials(racers, PROPOSAL_TRIALS)):
        racers.trials += 1
        trial = racers.trials
        answers = racers.workers.decide(racers.url, racers.folder, trial,
                                        [("alert", "-"), ("alert", "-")], [0.0, 0.0])
        with racers.bot.db.connect() as conn:
            rows = conn.execute(select(proposals.c.id, proposals.c.state).where(
                proposals.c.fingerprint == f"fp-new-{trial}")).all()
            events = [e for e in audit.events(conn) if e["kind"] == Kind.PROPOSED
                      and e["data"]["fingerprint"] == f"fp-new-{trial}"]
        where = f"alert {trial}: {answers}, proposals {rows}"
        assert [r for r, _ in answers] == ["done", "done"], where
        assert [state for _, state in rows] == ["open"] and len(events) == 1, where
        assert sorted(detail for _, detail in answers) == [
            "none", f"proposal {rows[0][0]} open"], where
    assert audit.verify(racers.bot.db).ok


def test_two_overlapping_sets_requested_at_once_lock_all_or_nothing(racers: Racers) -> None:
    """gpu[01-03] and gpu[03-04] at the same moment: one request takes all its nodes, the
    other is refused naming the node they share and holds none (no half-taken set)."""
    for _ in range(trials(racers, PROPOSAL_TRIALS)):
        outcomes = racers.race_requests("gpu[01-03]", "gpu[03-04]")
        done = [o for o in outcomes if o.result == "done"]
        refused = [o for o in outcomes if o.result == "refused"]
        assert len(done) == 1 and len(refused) == 1, outcomes
        assert re.search(r"node:gpu03 is held by execution \d+", refused[0].detail), refused
        winner = int(done[0].detail.split()[1])
        wanted = (["gpu01", "gpu02", "gpu03"] if done[0].op.endswith("gpu[01-03]")
                  else ["gpu03", "gpu04"])
        assert racers.held() == {f"node:{node}": winner for node in wanted}
        racers.bot.cancel(winner, REQUESTER)  # its locks go with it
        assert racers.held() == {}
