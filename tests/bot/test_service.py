"""Requests, approvals and locks: who may ask and approve, self-approval, two-person rules,
denial, expiry, lock conflicts, and the audit event every refused request leaves."""

from __future__ import annotations

import time
from typing import Any

import pytest

from bot import audit
from bot.engine import Engine
from bot.service import Refused
from tests.bot import fakes
from tests.bot.test_engine import record, runbook


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


def kinds(bot: Any, execution_id: int | None = None) -> list[str]:
    with bot.engine.connect() as conn:
        return [e["kind"] for e in audit.events(conn, execution_id=execution_id)]


def medium(**extra: Any) -> dict[str, Any]:
    return runbook([record("a", "{{ node }}")], risk="medium", **extra)


def test_low_risk_needs_no_approval(make_bot: Any) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")])})
    assert bot.get(bot.request("demo", {"node": "gpu01"}, "alice")).state == "approved"


def test_medium_risk_waits_for_an_approver(make_bot: Any) -> None:
    bot = make_bot({"demo": medium()})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    assert bot.get(execution_id).state == "awaiting_approval"
    engine = Engine(bot, sleep=lambda s: None)
    assert engine.drive(execution_id, wait_for_approval=False).state == "awaiting_approval"
    assert fakes.JOURNAL == []
    assert bot.approve(execution_id, "carol").state == "approved"
    assert engine.drive(execution_id).state == "succeeded"
    engine.close()
    assert kinds(bot, execution_id)[:4] == ["requested", "planned", "approved", "started"]


def test_self_approval_refused(make_bot: Any) -> None:
    bot = make_bot({"demo": medium()})
    execution_id = bot.request("demo", {"node": "gpu01"}, "carol")
    with pytest.raises(Refused, match="may not approve it too"):
        bot.approve(execution_id, "carol")
    assert bot.get(execution_id).state == "awaiting_approval"
    assert "approval_refused" in kinds(bot, execution_id)


def test_self_approval_allowed_when_policy_says_so(make_bot: Any) -> None:
    policy = {"required": 1, "approvers": ["group:gpu-leads"], "self_approval": True}
    bot = make_bot({"demo": medium(approval=policy)})
    execution_id = bot.request("demo", {"node": "gpu01"}, "carol")
    assert bot.approve(execution_id, "carol").state == "approved"


def test_unauthorised_approver_refused(make_bot: Any) -> None:
    bot = make_bot({"demo": medium()})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    with pytest.raises(Refused, match="bob may not approve demo"):
        bot.approve(execution_id, "bob")


def test_two_person_rule(make_bot: Any) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")], risk="high")})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    assert bot.approve(execution_id, "carol").state == "awaiting_approval"
    with pytest.raises(Refused, match="already approved"):
        bot.approve(execution_id, "carol")
    assert bot.approve(execution_id, "dave").state == "approved"


def test_deny_ends_with_nothing_run_and_releases_locks(make_bot: Any) -> None:
    bot = make_bot({"demo": medium()})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    ex = bot.deny(execution_id, "dave", "not during the launch")
    assert ex.state == "denied"
    assert "not during the launch" in (ex.error or "")
    assert fakes.JOURNAL == []
    bot.request("demo", {"node": "gpu01"}, "bob")  # the lock is free again


def test_expiry_ends_the_request(make_bot: Any) -> None:
    policy = {"required": 1, "approvers": ["group:gpu-leads"], "expires": "1s"}
    bot = make_bot({"demo": medium(approval=policy)})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    time.sleep(1.1)
    with pytest.raises(Refused, match="expired"):
        bot.approve(execution_id, "carol")
    assert bot.get(execution_id).state == "expired"
    assert "expired" in kinds(bot, execution_id)
    bot.request("demo", {"node": "gpu01"}, "bob")  # lock released


def test_lock_conflict_names_holder(make_bot: Any) -> None:
    bot = make_bot({"demo": medium()})
    first = bot.request("demo", {"node": "gpu01"}, "alice")
    with pytest.raises(Refused, match=rf"node:gpu01 is held by execution {first} \(demo, "
                                      r"requested by alice\) since 20"):
        bot.request("demo", {"node": "gpu01"}, "bob")
    bot.request("demo", {"node": "gpu02"}, "bob")  # other node: fine
    assert kinds(bot)[-3] == "refused"


def test_cancel_before_start_releases_lock(make_bot: Any) -> None:
    bot = make_bot({"demo": medium()})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    assert bot.cancel(execution_id, "alice").state == "cancelled"
    with pytest.raises(Refused, match="already ended"):
        bot.cancel(execution_id, "alice")
    bot.request("demo", {"node": "gpu01"}, "bob")


def test_stranger_may_not_cancel(make_bot: Any) -> None:
    bot = make_bot({"demo": medium()})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    with pytest.raises(Refused, match="may not cancel"):
        bot.cancel(execution_id, "bob")


@pytest.mark.parametrize("params, message", [
    ({"node": "gpu01;reboot"}, "is not a node name"),
    ({"node": "$(id)"}, "is not a node name"),
    ({"node": "gpu99"}, "not a known node"),
    ({"node": "gpu01", "nod": "x"}, 'did you mean "node"'),
    ({}, "node is required"),
    ({"node": "x" * 10_000}, "not a node name"),
])
def test_bad_input_refused_and_audited_only(make_bot: Any, params: dict[str, str],
                                            message: str) -> None:
    bot = make_bot({"demo": medium()})
    bot.runbooks()  # records the version first: that event is not part of the refusal
    before = kinds(bot)
    with pytest.raises(Refused, match=message.replace("$", r"\$").replace("(", r"\(")):
        bot.request("demo", params, "alice")
    assert kinds(bot) == [*before, "refused"]
    with bot.engine.connect() as conn:
        event = list(audit.events(conn))[-1]
    assert len(audit.canonical(event["data"])) < 3000  # a 10,000-character value is clipped


def test_unknown_runbook_suggests(make_bot: Any) -> None:
    bot = make_bot({"demo": medium()})
    with pytest.raises(Refused, match='did you mean "demo"'):
        bot.request("dmeo", {"node": "gpu01"}, "alice")


def test_requester_must_be_allowed(make_bot: Any) -> None:
    bot = make_bot({"demo": medium()})
    with pytest.raises(Refused, match="mallory may not request"):
        bot.request("demo", {"node": "gpu01"}, "mallory")


def test_version_conflict_refused(make_bot: Any, tmp_path: Any) -> None:
    bot = make_bot({"demo": medium()})
    bot.runbooks()
    changed = medium(summary="same version, other content")
    other = make_bot({"demo": changed}, url=bot.config.database_url)
    with pytest.raises(Exception, match="Bump the version"):
        other.runbooks()
