"""A model-based test of the execution lifecycle (hypothesis stateful): random interleavings
of requests, approvals, denials, cancels (before and inside a step), runbook changes,
engine runs, an engine dying inside a step, another engine stealing a claim, lease and
approval expiry. After every rule the safety invariants hold:

- nothing denied, expired or short of approvals ran a step, and whatever started had
  the approvals its own plan's policy asks for, from allowed people, not the requester;
- approvals that let a plan start were given to that very plan (its hash);
- an execution runs only the steps of the runbook version it was requested with;
- an engine that lost its claim writes nothing more;
- a step that changed something is undone exactly once when the execution ends
  cancelled or failed;
- the audit chain verifies.

SQLite here; the PostgreSQL variant (marked) runs fewer examples.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from sqlalchemy import func, select, update

from adapters.actions import ActionContext, ActionResult, StrictArguments
from bot.execution import executions
from bot.execution.checks.core import Checks
from bot.execution.engine import Engine
from bot.runbooks.catalogue import Catalogue
from bot.runbooks.params import Inventory
from bot.service import Service
from bot.store import audit, db
from bot.store.schema import approvals
from bot.store.schema import executions as executions_table
from kit.errors import Refused
from tests import postgres
from tests.bot import fakes
from tests.conftest import lab_config

NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]
USERS = ["alice", "bob", "carol", "dave"]  # carol and dave approve (group gpu-leads)
DECIDERS = ["carol", "dave", "carol", "dave", "alice"]  # mostly people allowed to decide
RISKS = ["medium", "low", "high"]  # version 0 needs an approval

HOOK: dict[str, Callable[[], None] | None] = {"during": None}


class Death(BaseException):
    """The engine's process dies inside a step (nothing after this runs in it)."""


class HookArguments(StrictArguments):
    key: str


class HookAction:
    """A step during which the world moves: the rule sets what happens (a cancel, the
    engine's death, another engine claiming the execution) before the step returns."""

    name: ClassVar[str] = "test.hook"
    Arguments: ClassVar[type[StrictArguments]] = HookArguments

    def plan(self, args: Any) -> list[str]:
        return [f"hook {args.key}"]

    def run(self, args: Any, ctx: ActionContext) -> ActionResult:
        during, HOOK["during"] = HOOK["during"], None
        if during is not None:
            during()
        fakes.STATE[args.key] = True
        return ActionResult(summary=f"hook {args.key}")


class MortalEngine(Engine):
    """An engine that can die: after Death it lets nothing go (its process is gone)."""

    dead = False

    def __post_init__(self) -> None:
        super().__post_init__()
        let_go = self.claims.let_go

        def unless_dead(claim: Any) -> None:
            if not self.dead:
                let_go(claim)

        self.claims.let_go = unless_dead  # type: ignore[method-assign]


def version_body(n: int) -> dict[str, Any]:
    """Version n of the runbook: its risk and steps move with n."""
    steps: list[dict[str, Any]] = [
        {"id": "a", "action": "test.record", "with": {"key": f"v{n}-{{{{ node }}}}-a"},
         "undo": {"action": "test.forget", "with": {"key": f"v{n}-{{{{ node }}}}-a"}}},
        {"id": "h", "action": "test.hook", "with": {"key": f"v{n}-{{{{ node }}}}-h"},
         "undo": {"action": "test.forget", "with": {"key": f"v{n}-{{{{ node }}}}-h"}}},
    ]
    if n % 2:
        steps.append({"id": f"extra{n}", "action": "test.record",
                      "with": {"key": f"v{n}-{{{{ node }}}}-x"}})
    return {"name": "demo", "version": f"1.{n}.0", "summary": "model", "risk": RISKS[n % 3],
            "params": {"node": {"type": "node", "required": True}},
            "locks": ["node:{{ node }}"], "steps": steps}


_TEMPLATE: dict[str, Path] = {}
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def sqlite_url() -> str:
    """A fresh database, copied from one migrated once (migrations are the slow part)."""
    if "file" not in _TEMPLATE:
        folder = Path(tempfile.mkdtemp(prefix="model-template-"))
        engine = db.connect(f"sqlite:///{folder / 'bot.db'}")
        engine.dispose()
        _TEMPLATE["file"] = folder / "bot.db"
    folder = Path(tempfile.mkdtemp(prefix="model-"))
    shutil.copy(_TEMPLATE["file"], folder / "bot.db")
    return f"sqlite:///{folder / 'bot.db'}"


class Lifecycle(RuleBasedStateMachine):
    url_factory: ClassVar[Callable[[], str]] = staticmethod(sqlite_url)

    def __init__(self) -> None:
        super().__init__()
        fakes.reset()
        HOOK["during"] = None
        self.folder = Path(tempfile.mkdtemp(prefix="model-runbooks-"))
        self.version = 0
        self._write_runbook()
        config = lab_config(type(self).url_factory(), self.folder,
                            engine={"lease_seconds": 30, "poll_seconds": 0.01,
                                    "clock_skew_seconds": 0})
        nodes = frozenset(NODES)
        from tests.conftest import standard_actions

        sa_engine = db.connect(config.resolved_database_url())
        self.bot = Service(config=config, db=sa_engine,
                       catalogue=Catalogue([*fakes.test_actions(), HookAction(),
                                            *standard_actions(config, sa_engine)]),
                       checks=Checks({}, sleep=lambda s: None),
                       inventory=Inventory(nodes=nodes, slurm=nodes, kubernetes=frozenset()))
        self.ids: list[int] = []
        self.pinned: dict[int, str] = {}  # execution -> the version it was requested with
        self.silenced: dict[int, int] = {}  # execution -> audit events when its claim was stolen

    def teardown(self) -> None:
        self.bot.db.dispose()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _write_runbook(self) -> None:
        # libyaml's dumper where there is one: the same text in a third of the time
        text = yaml.dump(version_body(self.version), Dumper=DUMPER, sort_keys=False)
        (self.folder / "demo.yaml").write_text(text)

    # --- rules -------------------------------------------------------------------------

    def _pick(self, pick: int) -> int:
        """Mostly an execution still under way (where the interesting things happen)."""
        with self.bot.db.connect() as conn:
            live = [ex.id for ex in executions.find(conn, states=executions.ACTIVE | {"held"})]
        pool = live if live and pick % 4 else self.ids
        return pool[pick % len(pool)]

    @rule(node=st.sampled_from(NODES), user=st.sampled_from(USERS))
    def request(self, node: str, user: str) -> None:
        try:
            execution_id = self.bot.request("demo", {"node": node}, user)
        except Refused:
            return
        self.ids.append(execution_id)
        self.pinned[execution_id] = self.bot.get(execution_id).version

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers(0, 50), user=st.sampled_from(DECIDERS))
    def approve(self, pick: int, user: str) -> None:
        execution_id = self._pick(pick)
        with contextlib.suppress(Refused):
            self.bot.approve(execution_id, user)

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers(0, 50), user=st.sampled_from(DECIDERS))
    def deny(self, pick: int, user: str) -> None:
        execution_id = self._pick(pick)
        with contextlib.suppress(Refused):
            self.bot.deny(execution_id, user, "model says no")

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers(0, 50), now=st.integers(0, 1))
    def cancel(self, pick: int, now: int) -> None:
        if not now:  # (cancels also come inside steps: engine_runs)
            return
        execution_id = self._pick(pick)
        with contextlib.suppress(Refused):
            self.bot.cancel(execution_id, self.bot.get(execution_id).requested_by)

    @rule()
    def change_runbook(self) -> None:
        self.version += 1
        self._write_runbook()
        self.bot._runbooks = None

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers(0, 50), now=st.integers(0, 3))
    def expire_approval_window(self, pick: int, now: int) -> None:
        if now:  # rarer than the other rules: most requests live long enough to be decided
            return
        execution_id = self._pick(pick)
        with self.bot.db.begin() as conn:
            conn.execute(update(executions_table)
                         .where(executions_table.c.id == execution_id,
                                executions_table.c.approval_deadline.is_not(None))
                         .values(approval_deadline=time.time() - 1))

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers(0, 50))
    def lease_runs_out(self, pick: int) -> None:
        execution_id = self._pick(pick)
        with self.bot.db.begin() as conn:
            conn.execute(update(executions_table)
                         .where(executions_table.c.id == execution_id,
                                executions_table.c.lease_until.is_not(None))
                         .values(lease_until=time.time() - 1))

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers(0, 50),
          during=st.sampled_from(["nothing", "cancel", "death", "stolen"]))
    def engine_runs(self, pick: int, during: str) -> None:
        execution_id = self._pick(pick)
        engine = MortalEngine(self.bot, sleep=lambda s: None)
        HOOK["during"] = self._event_for(during, execution_id, engine)
        try:
            engine.drive(execution_id, wait_for_approval=False)
        except Death:
            pass
        finally:
            HOOK["during"] = None
            engine.close()
        if execution_id in self.silenced:
            # the engine whose claim was stolen wrote nothing after that moment
            assert self._event_count(execution_id) == self.silenced.pop(execution_id)

    def _event_for(self, during: str, execution_id: int,
                   engine: MortalEngine) -> Callable[[], None] | None:
        bot = self.bot

        def cancel() -> None:
            with contextlib.suppress(Refused):
                bot.cancel(execution_id, bot.get(execution_id).requested_by)

        def death() -> None:
            engine.dead = True
            raise Death()

        def stolen() -> None:
            with bot.db.begin() as conn:  # another engine claimed it; its lease ran out
                executions.update_if(conn, execution_id, {}, epoch=executions_table.c.epoch + 1,
                                     owner="thief", lease_until=time.time() - 1)
            self.silenced[execution_id] = self._event_count(execution_id)

        return {"nothing": None, "cancel": cancel, "death": death, "stolen": stolen}[during]

    def _event_count(self, execution_id: int) -> int:
        with self.bot.db.connect() as conn:
            return len(list(audit.events(conn, execution_id=execution_id)))

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def only_approved_plans_ran(self) -> None:
        with self.bot.db.connect() as conn:
            for ex in executions.find(conn, limit=1000):
                seen = list(audit.events(conn, execution_id=ex.id))
                started = [e for e in seen if e["kind"] == "started"]
                ran = [e for e in seen if e["kind"] == "step_started"]
                if ran:
                    assert started, f"execution {ex.id} ran a step without starting"
                if ex.state in ("denied", "expired"):
                    assert not started, f"{ex.state} execution {ex.id} started"
                for event in started:
                    self._approved_enough(conn, ex, event)
                assert ex.version == self.pinned.get(ex.id, ex.version)
                for event in ran:  # only its own version's steps
                    assert event["data"]["step"] in {s.id for s in ex.plan.steps}

    def _approved_enough(self, conn: Any, ex: executions.Execution,
                         event: dict[str, Any]) -> None:
        data = event["data"]
        assert data["plan_hash"] == ex.plan_hash  # a started plan never changes again
        assert data["version"] == ex.version
        approvers = set(data["approved_by"])
        assert len(approvers) >= ex.plan.approval.required
        assert ex.requested_by not in approvers or ex.plan.approval.self_approval
        assert approvers <= {"carol", "dave"}
        for user in approvers:  # given to this very plan
            count = conn.execute(select(func.count()).select_from(approvals).where(
                approvals.c.execution_id == ex.id, approvals.c.user == user,
                approvals.c.plan_hash == data["plan_hash"],
                approvals.c.decision == "approve")).scalar_one()
            assert count == 1
        denied = conn.execute(select(func.count()).select_from(approvals).where(
            approvals.c.execution_id == ex.id,
            approvals.c.decision == "deny")).scalar_one()
        assert denied == 0, f"execution {ex.id} started despite a denial"

    @invariant()
    def changed_steps_undone_once(self) -> None:
        with self.bot.db.connect() as conn:
            for ex in executions.find(conn, states=frozenset({"cancelled", "failed"}),
                                      limit=1000):
                seen = list(audit.events(conn, execution_id=ex.id))
                changed = {e["data"]["step"] for e in seen
                           if e["kind"] == "step_finished" and e["data"].get("changed", True)}
                undoable = {s.id for s in ex.plan.steps if s.undo is not None}
                for step in changed & undoable:
                    undone = [e for e in seen if e["kind"] == "undo_finished"
                              and e["data"]["step"] == step]
                    assert len(undone) == 1, f"execution {ex.id} step {step} undone " \
                                             f"{len(undone)} times"

    @invariant()
    def audit_chain_verifies(self) -> None:
        verdict = audit.verify(self.bot.db)
        assert verdict.ok, verdict.problem


Lifecycle.TestCase.settings = settings(
    max_examples=25, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_lifecycle_on_sqlite = Lifecycle.TestCase


@pytest.mark.postgres
def test_lifecycle_on_postgres(postgres_server: postgres.PostgresServer) -> None:
    """A shorter run of the same machine on PostgreSQL."""
    import secrets

    from hypothesis.stateful import run_state_machine_as_test

    class OnPostgres(Lifecycle):
        url_factory = staticmethod(
            lambda: postgres.fresh_database(postgres_server.url, f"m_{secrets.token_hex(5)}"))

    run_state_machine_as_test(OnPostgres, settings=settings(
        max_examples=6, stateful_step_count=20, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))

