"""The two approval rules every surface shares (bot.execution.approval), as pure functions:
a request nobody could approve is named at once with what to configure, an approver's
refusal names the approvers, and who may steer a run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import Config
from bot.execution.approval import NOBODY_FIX, approval_problem, may_steer, unapprovable
from bot.execution.planning import ApprovalPolicy
from tests.conftest import lab_config


def _policy(required: int, approvers: list[str], self_approval: bool = False) -> ApprovalPolicy:
    return ApprovalPolicy(required, approvers, self_approval, 3600.0)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return lab_config(f"sqlite:///{tmp_path / 'bot.db'}", tmp_path)


@pytest.mark.parametrize(("required", "approvers", "problem"), [
    (0, [], None),
    (1, ["carol"], None),
    (1, [], f"demo needs 1 approval but nobody may approve it: {NOBODY_FIX}"),
    (2, [], f"demo needs 2 approvals but nobody may approve it: {NOBODY_FIX}"),
])
def test_a_request_nobody_could_approve_is_named(required: int, approvers: list[str],
                                                 problem: str | None) -> None:
    assert unapprovable(_policy(required, approvers), "demo") == problem


def test_an_approver_s_refusal_names_the_approvers_and_a_requester_may_deny(
        config: Config) -> None:
    policy = _policy(1, ["group:gpu-leads", "erin"])
    assert approval_problem(config, policy, "demo", "bob", "alice") == (
        "bob may not approve demo: its approvers are group:gpu-leads, erin")
    assert approval_problem(config, policy, "demo", "carol", "carol") == (
        "carol requested demo and may not approve it too")
    assert approval_problem(config, policy, "demo", "carol", "carol", denying=True) is None
    assert approval_problem(config, policy, "demo", "carol", "alice") is None


@pytest.mark.parametrize(("user", "steers"), [
    ("alice", True),  # the owner
    ("carol", True),  # an approver, through her group
    ("bob", False),  # neither
])
def test_the_owner_or_an_approver_steers(config: Config, user: str, steers: bool) -> None:
    assert may_steer(config, user, "alice", ["group:gpu-leads"]) is steers
