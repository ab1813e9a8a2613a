"""A model-based test of the breaker on automation (hypothesis stateful): random interleavings
of drains, failed and succeeded repairs, resumes, cancels, alerts and resets by approvers and
by others. After every rule the breaker's state equals the model's:

- it is tripped exactly when an alert found the limits passed since the last reset, and stays
  tripped until an approver resets it (nobody else can);
- while tripped, every alert is refused and nothing is proposed; people's requests still work;
- each trip and each reset is one audit event, and the chain verifies.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from sqlalchemy import select

from bot.alerts import breaker, proposing
from bot.alerts.proposing import Webhook, WebhookAlert
from bot.execution.checks.core import Checks
from bot.execution.engine import Engine
from bot.runbooks.catalogue import Catalogue
from bot.runbooks.params import Inventory
from bot.service import Service
from bot.store import audit, db
from bot.store.schema import proposals
from bot.store.words import Kind
from kit.errors import Refused
from tests.bot import fakes
from tests.conftest import lab_config

NODES = ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"]
SHARE, PER_HOUR = 0.4, 3  # 3 of 5 held out trips it; so do 4 taken out within the hour


def _runbook(name: str, kind: str, fails: bool = False) -> dict[str, Any]:
    action = "test.flaky" if fails else "test.record"
    return {"name": name, "version": "1.0.0", "summary": name, "risk": "low",
            "remediation": kind, "params": {"node": {"type": "node", "required": True}},
            "steps": [{"id": "a", "action": action, "with": {"key": f"{name}-{{{{ node }}}}"}}]}


class Breaker(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        fakes.reset()
        self.folder = Path(tempfile.mkdtemp(prefix="breaker-model-"))
        for body in (_runbook("drain-node", "drain"), _runbook("resume-node", "resume"),
                     _runbook("reset-gpu", "repair", fails=True)):
            (self.folder / f"{body['name']}.yaml").write_text(yaml.safe_dump(body))
        config = lab_config(f"sqlite:///{self.folder}/bot.db", self.folder,
                            remediation={"breaker": {"max_pool_share": SHARE,
                                                     "max_nodes_per_hour": PER_HOUR}},
                            alert_rules=[{"match": {"alertname": "Hot"}, "runbook": "drain-node",
                                          "params": {"node": "{{ labels.node }}"}}])
        from tests.conftest import standard_actions

        engine = db.connect(config.resolved_database_url())
        nodes = frozenset(NODES)
        self.bot = Service(config=config, db=engine,
                           catalogue=Catalogue([*fakes.test_actions(),
                                                *standard_actions(config, engine)]),
                           checks=Checks({}, sleep=lambda s: None),
                           inventory=Inventory(nodes=nodes, slurm=nodes, kubernetes=frozenset()))
        self.out: set[str] = set()  # held out by the bot since the last reset
        self.taken: set[str] = set()  # taken out since the last reset (all within the hour)
        self.tripped = False
        self.trips = self.resets = self.alerts = 0

    def teardown(self) -> None:
        try:
            assert audit.verify(self.bot.db).ok
        finally:
            self.bot.db.dispose()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _drive(self, runbook: str, node: str) -> str:
        execution_id = self.bot.request(runbook, {"node": node}, "alice")
        engine = Engine(self.bot, sleep=lambda s: None)
        try:
            return str(engine.drive(execution_id).state)
        finally:
            engine.close()

    @rule(node=st.sampled_from(NODES))
    def drain(self, node: str) -> None:
        assert self._drive("drain-node", node) == "succeeded"
        self.out.add(node)
        self.taken.add(node)

    @rule(node=st.sampled_from(NODES))
    def failed_repair(self, node: str) -> None:
        fakes.FAILURES[f"reset-gpu-{node}"] = 1
        assert self._drive("reset-gpu", node) == "failed"  # it leaves the node out
        self.out.add(node)
        self.taken.add(node)

    @rule(node=st.sampled_from(NODES))
    def repaired(self, node: str) -> None:
        assert self._drive("reset-gpu", node) == "succeeded"
        self.out.discard(node)
        self.taken.add(node)

    @rule(node=st.sampled_from(NODES))
    def resume(self, node: str) -> None:
        assert self._drive("resume-node", node) == "succeeded"
        self.out.discard(node)

    @rule(node=st.sampled_from(NODES))
    def cancelled_drain(self, node: str) -> None:
        execution_id = self.bot.request("drain-node", {"node": node}, "alice")
        self.bot.cancel(execution_id, "alice")  # never ran: counts for nothing

    @rule(node=st.sampled_from(NODES))
    def alert(self, node: str) -> None:
        self.alerts += 1
        alert = WebhookAlert.model_validate({
            "status": "firing", "labels": {"alertname": "Hot", "node": node},
            "fingerprint": f"f{self.alerts}",
            "startsAt": f"2026-12-02T00:00:{self.alerts % 60:02d}Z"})
        [proposal] = proposing.receive(self.bot, Webhook(version="4", status="firing",
                                                         alerts=[alert]))
        over = len(self.out) / len(NODES) > SHARE or len(self.taken) > PER_HOUR
        if not self.tripped and over:
            self.tripped, self.trips = True, self.trips + 1
        if self.tripped:
            assert proposal.state == "refused" and "breaker" in (proposal.note or "")
        else:
            assert proposal.state == "open"
            proposing.dismiss(self.bot, proposal.id, "alice", None)

    @rule(user=st.sampled_from(["alice", "carol"]))
    def reset(self, user: str) -> None:
        try:
            breaker.reset(self.bot, user, "looked at it")
        except Refused as exc:
            assert user == "alice" or not self.tripped, str(exc)
            return
        assert user == "carol" and self.tripped
        self.tripped, self.resets = False, self.resets + 1
        self.out, self.taken = set(), set()

    @invariant()
    def agrees_with_the_model(self) -> None:
        now = breaker.status(self.bot)
        assert now.tripped == self.tripped
        assert set(now.held_out["slurm"]) == self.out
        assert set(now.last_hour) == self.taken

    @invariant()
    def each_trip_and_reset_is_one_event(self) -> None:
        with self.bot.db.connect() as conn:
            kinds = [e["kind"] for e in audit.events(conn)]
            opened = conn.execute(select(proposals.c.id).where(
                proposals.c.state == "open")).all()
        assert kinds.count(Kind.BREAKER_TRIPPED) == self.trips
        assert kinds.count(Kind.BREAKER_RESET) == self.resets
        assert opened == []  # every proposal was refused or dismissed at once


Breaker.TestCase.settings = settings(
    max_examples=8, stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_the_breaker_follows_its_model = Breaker.TestCase
