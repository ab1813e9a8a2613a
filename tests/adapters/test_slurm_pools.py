"""slurm.pool_leave and slurm.pool_join (handoff-node): drained with the pool's reason and
without the feature, and back; each reads first (running twice equals once), a node drained
for another reason is refused by leave and left drained by join; features parse from
``scontrol show node -o`` and ``sinfo --json`` and change with one scontrol line."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from adapters.actions import ActionContext, ActionError
from adapters.slurm import commands, parsing
from adapters.slurm.config import SlurmConfig
from adapters.slurm.fake import FakeSlurm
from adapters.slurm.pools import JoinArguments, LeaveArguments, PoolJoinAction, PoolLeaveAction

PREFIX, REASON = "pool: kubernetes", "pool: kubernetes (handoff-node)"


def context() -> ActionContext:
    return ActionContext(execution_id=1, step_id="s", deadline=time.monotonic() + 30,
                         progress=lambda line: None)


def slurm(features: frozenset[str] = frozenset({"training", "ib"})) -> FakeSlurm:
    backend = FakeSlurm(["gpu04"])
    backend.state["gpu04"] = replace(backend.state["gpu04"], features=features)
    return backend


def leave(backend: FakeSlurm) -> PoolLeaveAction:
    return PoolLeaveAction(backend, SlurmConfig(), lambda s: None)


def join(backend: FakeSlurm) -> PoolJoinAction:
    return PoolJoinAction(backend, SlurmConfig(), lambda s: None)


def test_leave_then_join_round_trip() -> None:
    backend = slurm()
    action = leave(backend)
    args = LeaveArguments(node="gpu04", prefix=PREFIX, feature="training", reason=REASON)
    assert action.plan(args) == [
        'scontrol update NodeName=gpu04 State=DRAIN Reason="pool: kubernetes (handoff-node)"',
        "scontrol update NodeName=gpu04 AvailableFeatures=<its features without training> "
        "ActiveFeatures=<the same>"]
    result = action.run(args, context())
    node = backend.state["gpu04"]
    assert result.changed and "DRAIN" in node.flags and node.reason == REASON
    assert node.features == {"ib"}
    assert not action.run(args, context()).changed  # twice equals once
    back = join(backend)
    back_args = JoinArguments(node="gpu04", prefix=PREFIX, feature="training")
    result = back.run(back_args, context())
    node = backend.state["gpu04"]
    assert result.changed and "DRAIN" not in node.flags and node.features == {"ib", "training"}
    assert "feature training added, resumed" in result.summary
    assert not back.run(back_args, context()).changed
    assert ("features", ["gpu04"], ["ib"]) in backend.calls


def test_leave_refuses_a_node_drained_for_another_reason() -> None:
    backend = slurm()
    backend.update_nodes(["gpu04"], "DRAIN", "XID 79")
    action = leave(backend)
    with pytest.raises(ActionError, match=r'gpu04 is drained for another reason \("XID 79"\)'):
        action.run(LeaveArguments(node="gpu04", prefix=PREFIX, reason=REASON), context())
    assert backend.state["gpu04"].features == {"training", "ib"}


def test_join_leaves_a_node_drained_for_another_reason_drained() -> None:
    backend = slurm(frozenset())
    backend.update_nodes(["gpu04"], "DRAIN", "health check failed: GPU 3")
    action = join(backend)
    result = action.run(JoinArguments(node="gpu04", prefix=PREFIX, feature="training"),
                        context())
    node = backend.state["gpu04"]
    assert "DRAIN" in node.flags and node.features == {"training"}
    assert 'left drained: "health check failed: GPU 3"' in result.summary


def test_without_a_feature_only_the_state_changes() -> None:
    backend = slurm()
    action = leave(backend)
    action.run(LeaveArguments(node="gpu04", prefix=PREFIX, reason=REASON), context())
    assert backend.state["gpu04"].features == {"training", "ib"}
    assert not [call for call in backend.calls if call[0] == "features"]
    with pytest.raises(ValueError):
        LeaveArguments(node="gpu04", prefix=PREFIX, reason=REASON, feature="a b")


def test_features_and_gres_parse_and_change_in_one_line() -> None:
    line = ("NodeName=gpu04 Arch=x86_64 AvailableFeatures=training,ib ActiveFeatures=training,ib "
            "Gres=gpu:3g.40gb:16 State=IDLE CfgTRES=cpu=2,gres/gpu=16")
    (node,) = parsing.parse_node_text(line)
    assert node.features == {"training", "ib"} and node.gres == "gpu:3g.40gb:16"
    (none,) = parsing.parse_node_text("NodeName=gpu01 AvailableFeatures=(null) State=IDLE")
    assert none.features == frozenset()
    (js,) = parsing.parse_nodes({"nodes": [{"name": "gpu02", "state": "idle",
                                            "features": "training", "gres": "gpu:h100:8"}]})
    assert js.features == {"training"} and js.gres == "gpu:h100:8"
    assert commands.update_features(["gpu04"], ["ib"]) == [
        "scontrol", "update", "NodeName=gpu04", "AvailableFeatures=ib", "ActiveFeatures=ib"]
