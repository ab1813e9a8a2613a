"""Requests, approvals and locks: who may ask and approve, self-approval, two-person rules,
denial, expiry, lock conflicts (every node a plan names is locked, hostlists included), and
the audit event every refused request leaves."""

from __future__ import annotations

import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from adapters.actions import Action
from adapters.prometheus.config import PrometheusConfig
from adapters.prometheus.fake import FakePrometheus
from adapters.prometheus.identity import GpuIdentityAction
from adapters.slurm.config import SlurmConfig
from adapters.slurm.health import HealthCheckAction
from adapters.slurm.rolling import DriverRolloutAction
from bot.config import Config
from bot.execution.engine import Engine
from bot.execution.planning import MAX_PLAN_NODES, PlanError, runbook_nodes
from bot.runbooks.catalogue import KNOWN, Catalogue
from bot.service import Service
from bot.store import audit
from bot.store.schema import locks as locks_table
from kit import hostlist
from kit.canonical import canonical
from kit.errors import Refused
from tests.bot import fakes
from tests.bot.execution.test_engine import record, runbook
from tests.bot.schedule.windowfakes import Systems
from tests.conftest import BotFactory


@pytest.fixture(autouse=True)
def _clean() -> None:
    fakes.reset()


def kinds(bot: Service, execution_id: int | None = None) -> list[str]:
    with bot.db.connect() as conn:
        return [e["kind"] for e in audit.events(conn, execution_id=execution_id)]


def medium(**extra: Any) -> dict[str, Any]:
    return runbook([record("a", "{{ node }}")], risk="medium", **extra)


def test_low_risk_needs_no_approval(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")])})
    assert bot.get(bot.request("demo", {"node": "gpu01"}, "alice")).state == "approved"


def test_medium_risk_waits_for_an_approver(make_bot: BotFactory) -> None:
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


def test_self_approval_refused(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": medium()})
    execution_id = bot.request("demo", {"node": "gpu01"}, "carol")
    with pytest.raises(Refused, match="may not approve it too"):
        bot.approve(execution_id, "carol")
    assert bot.get(execution_id).state == "awaiting_approval"
    assert "approval_refused" in kinds(bot, execution_id)


def test_self_approval_allowed_when_policy_says_so(make_bot: BotFactory) -> None:
    policy = {"required": 1, "approvers": ["group:gpu-leads"], "self_approval": True}
    bot = make_bot({"demo": medium(approval=policy)})
    execution_id = bot.request("demo", {"node": "gpu01"}, "carol")
    assert bot.approve(execution_id, "carol").state == "approved"


def test_unauthorised_approver_refused(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": medium()})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    with pytest.raises(Refused, match="bob may not approve demo"):
        bot.approve(execution_id, "bob")


def test_two_person_rule(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": runbook([record("a", "a")], risk="high")})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    assert bot.approve(execution_id, "carol").state == "awaiting_approval"
    with pytest.raises(Refused, match="already approved"):
        bot.approve(execution_id, "carol")
    assert bot.approve(execution_id, "dave").state == "approved"


def test_deny_ends_with_nothing_run_and_releases_locks(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": medium()})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    ex = bot.deny(execution_id, "dave", "not during the launch")
    assert ex.state == "denied"
    assert "not during the launch" in (ex.error or "")
    assert fakes.JOURNAL == []
    bot.request("demo", {"node": "gpu01"}, "bob")  # the lock is free again


def test_expiry_ends_the_request(make_bot: BotFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The approval window read by a clock the test sets: just before the deadline the request
    still waits, at it the request has expired."""
    from types import SimpleNamespace

    from bot.execution import executions

    policy = {"required": 1, "approvers": ["group:gpu-leads"], "expires": "1s"}
    bot = make_bot({"demo": medium(approval=policy)})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    deadline = bot.get(execution_id).approval_deadline
    assert deadline is not None
    monkeypatch.setattr(executions, "time", SimpleNamespace(time=lambda: deadline - 0.001))
    assert bot.get(execution_id).state == "awaiting_approval"
    monkeypatch.setattr(executions, "time", SimpleNamespace(time=lambda: deadline))
    with pytest.raises(Refused, match="expired"):
        bot.approve(execution_id, "carol")
    assert bot.get(execution_id).state == "expired"
    assert "expired" in kinds(bot, execution_id)
    bot.request("demo", {"node": "gpu01"}, "bob")  # lock released


def test_lock_conflict_names_holder(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": medium()})
    first = bot.request("demo", {"node": "gpu01"}, "alice")
    with pytest.raises(Refused, match=rf"node:gpu01 is held by execution {first} \(demo, "
                                      r"requested by alice\) since 20"):
        bot.request("demo", {"node": "gpu01"}, "bob")
    bot.request("demo", {"node": "gpu02"}, "bob")  # other node: fine
    assert kinds(bot)[-3] == "refused"


def test_cancel_before_start_releases_lock(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": medium()})
    execution_id = bot.request("demo", {"node": "gpu01"}, "alice")
    assert bot.cancel(execution_id, "alice").state == "cancelled"
    with pytest.raises(Refused, match="already ended"):
        bot.cancel(execution_id, "alice")
    bot.request("demo", {"node": "gpu01"}, "bob")


def test_stranger_may_not_cancel(make_bot: BotFactory) -> None:
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
def test_bad_input_refused_and_audited_only(make_bot: BotFactory, params: dict[str, str],
                                            message: str) -> None:
    bot = make_bot({"demo": medium()})
    bot.runbooks()  # records the version first: that event is not part of the refusal
    before = kinds(bot)
    with pytest.raises(Refused, match=message.replace("$", r"\$").replace("(", r"\(")):
        bot.request("demo", params, "alice")
    assert kinds(bot) == [*before, "refused"]
    with bot.db.connect() as conn:
        event = list(audit.events(conn))[-1]
    assert len(canonical(event["data"])) < 3000  # a 10,000-character value is clipped


def test_unknown_runbook_suggests(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": medium()})
    with pytest.raises(Refused, match='did you mean "demo"'):
        bot.request("dmeo", {"node": "gpu01"}, "alice")


def test_nobody_approves_by_default_so_a_run_needing_approval_is_refused_at_once(
        make_bot: BotFactory) -> None:
    """No `approvers:`: nobody may approve. A request that needs approvals is refused when it
    is asked for, saying what to configure, and leaves only the refusal's audit event; one
    that needs none runs, and a runbook naming its own approvers is unaffected."""
    own = {"required": 1, "approvers": ["group:gpu-leads"]}
    bot = make_bot({"drain-node": medium(name="drain-node"),
                    "quick": runbook([record("q", "q")], name="quick"),
                    "owned": medium(name="owned", approval=own)},
                   approvers=Config().approvers)
    bot.runbooks()
    before = kinds(bot)
    with pytest.raises(Refused) as refused:
        bot.request("drain-node", {"node": "gpu01"}, "alice")
    assert str(refused.value) == (
        "drain-node needs 1 approval but nobody may approve it: set approvers: in the "
        "configuration or approval.approvers in the runbook")
    assert kinds(bot) == [*before, "refused"]
    with bot.db.connect() as conn:
        assert conn.execute(select(locks_table)).all() == []
    assert bot.get(bot.request("quick", {"node": "gpu02"}, "alice")).state == "approved"
    owned = bot.request("owned", {"node": "gpu03"}, "alice")
    assert bot.approve(owned, "carol").state == "approved"
    policy = bot.plan("drain-node", {"node": "gpu01"}).approval
    assert policy.describe().startswith("1 approval(s) from nobody")


def test_requester_must_be_allowed(make_bot: BotFactory) -> None:
    bot = make_bot({"demo": medium()})
    with pytest.raises(Refused, match="mallory may not request"):
        bot.request("demo", {"node": "gpu01"}, "mallory")


def test_version_conflict_refused(make_bot: BotFactory, tmp_path: Any) -> None:
    bot = make_bot({"demo": medium()})
    bot.runbooks()
    changed = medium(summary="same version, other content")
    other = make_bot({"demo": changed}, url=bot.config.database_url)
    with pytest.raises(Exception, match="Bump the version"):
        other.runbooks()


# --- every node a plan touches is locked ----------------------------------------------------

RUNBOOKS = Path(__file__).resolve().parents[2] / "runbooks"


def nodes_runbook(name: str, **extra: Any) -> dict[str, Any]:
    """A runbook over a hostlist that declares no lock of its own."""
    return runbook([record("a", "{{ nodes }}")], name=name, locks=[],
                   params={"nodes": {"type": "nodes", "required": True}}, **extra)


def node_runbook(name: str, **extra: Any) -> dict[str, Any]:
    return runbook([record("a", "{{ node }}")], name=name, locks=[], **extra)


def held_locks(bot: Service) -> dict[str, int]:
    with bot.db.connect() as conn:
        return {row.name: row.execution_id for row in conn.execute(select(locks_table))}


def shipped_bot(make_bot: BotFactory, url: str, names: tuple[str, ...]) -> Service:
    """A bot over the shipped runbooks, with the real Slurm actions over an in-memory Slurm."""
    systems = Systems(["gpu01", "gpu02", "gpu03", "gpu04"], ["gpu04"])
    bot = make_bot({name: (RUNBOOKS / f"{name}.yaml").read_text() for name in names}, url=url)
    commands = {name: {"argv": ["true"], "accepts_args": True}
                for name in ("driver-install", "driver-version", "health-check",
                             "gpu-identity")}
    slurm = SlurmConfig.model_validate({"commands": commands})
    extra: list[Action] = [HealthCheckAction(systems.slurm, slurm, lambda s: None,
                                               prometheus=FakePrometheus([])),  # planned only
                           DriverRolloutAction(systems.slurm, slurm, lambda s: None,
                                               prometheus=FakePrometheus([])),
                           GpuIdentityAction(FakePrometheus([]), PrometheusConfig(
                               url="http://prometheus:9090"))]  # planned only
    bot.catalogue = Catalogue([*bot.catalogue._actions.values(), *systems.actions(), *extra],
                              KNOWN)
    return systems.guarding(bot)


def test_rollback_driver_pending_refuses_swap_gpu_on_its_nodes(make_bot: BotFactory,
                                                                db_url: str) -> None:
    bot = shipped_bot(make_bot, db_url, ("rollback-driver", "swap-gpu"))
    assert bot.plan("rollback-driver", {"nodes": "gpu[01-02]", "version": "535.161.08"}
                    ).locks == ["driver:slurm-pool", "node:gpu01", "node:gpu02"]
    first = bot.request("rollback-driver", {"nodes": "gpu01", "version": "535.161.08"}, "alice")
    assert bot.get(first).state == "awaiting_approval"  # two approvals: pending for a while
    swap = {"node": "gpu01", "gpu": "3", "reason": "XID 79"}
    with pytest.raises(Refused, match=rf"node:gpu01 is held by execution {first} "
                                      r"\(rollback-driver, requested by alice\)"):
        bot.request("swap-gpu", swap, "bob")
    assert held_locks(bot) == {"driver:slurm-pool": first, "node:gpu01": first}
    other = bot.request("swap-gpu", {**swap, "node": "gpu03"}, "bob")  # another node: fine
    assert held_locks(bot)["node:gpu03"] == other
    bot.cancel(first, "alice")
    bot.request("swap-gpu", swap, "bob")  # released with the rollback


def test_overlapping_hostlists_conflict(make_bot: BotFactory, db_url: str) -> None:
    bot = make_bot({"many": nodes_runbook("many"), "one": node_runbook("one")}, url=db_url)
    first = bot.request("many", {"nodes": "gpu[01-02]"}, "alice")
    assert held_locks(bot) == {"node:gpu01": first, "node:gpu02": first}
    with pytest.raises(Refused, match=rf"node:gpu02 is held by execution {first} \(many, "):
        bot.request("one", {"node": "gpu02"}, "bob")
    with pytest.raises(Refused, match=rf"node:gpu02 is held by execution {first} \(many, "):
        bot.request("many", {"nodes": "gpu[02-03]"}, "bob")
    second = bot.request("one", {"node": "gpu03"}, "bob")  # the refusal took nothing
    with pytest.raises(Refused, match=rf"node:gpu03 is held by execution {second} \(one, "):
        bot.request("many", {"nodes": "gpu04,gpu03"}, "bob")
    assert held_locks(bot) == {"node:gpu01": first, "node:gpu02": first, "node:gpu03": second}
    third = bot.request("many", {"nodes": "gpu04"}, "bob")
    assert held_locks(bot)["node:gpu04"] == third


def test_a_plan_locks_each_node_it_names_besides_its_own_locks(make_bot: BotFactory) -> None:
    both = runbook([record("a", "{{ node }}")], name="both", locks=["node:{{ node }}", "rack:r1"],
                   params={"node": {"type": "node", "required": True},
                           "spare": {"type": "node"}, "more": {"type": "nodes"}})
    bot = make_bot({"both": both})
    assert bot.plan("both", {"node": "gpu02"}).locks == ["node:gpu02", "rack:r1"]
    plan = bot.plan("both", {"node": "gpu02", "spare": "gpu04", "more": "gpu[01-02]"})
    assert plan.locks == ["node:gpu01", "node:gpu02", "node:gpu04", "rack:r1"]


def test_a_big_hostlist_is_one_lock_per_node_and_a_huge_one_is_refused(make_bot: BotFactory,
                                                                       db_url: str) -> None:
    nodes = [f"gpu{number:04d}" for number in range(1, 4225)]
    bot = make_bot({"many": nodes_runbook("many"), "one": node_runbook("one")}, url=db_url,
                   inventory={"nodes": nodes})
    first = bot.request("many", {"nodes": "gpu[0001-0128]"}, "alice")
    assert len(held_locks(bot)) == 128
    with pytest.raises(Refused, match=rf"node:gpu0128 is held by execution {first}"):
        bot.request("one", {"node": "gpu0128"}, "bob")
    biggest = bot.request("many", {"nodes": "gpu[0129-4224]"}, "bob")  # 4096 nodes: the cap
    assert sum(1 for ex in held_locks(bot).values() if ex == biggest) == MAX_PLAN_NODES
    with pytest.raises(Refused, match="names 4097 nodes; a plan may touch at most 4096"):
        bot.plan("many", {"nodes": "gpu[0001-4097]"})


@pytest.mark.parametrize(("nodes", "count"), [
    ("gpu[0-9999]", 10_000),
    ("gpu[" + ",".join(["0-9999"] * 500) + "]", 10_000),  # once 5 million names made
    (",".join(f"gpu[0-9999]-{n}" for n in range(400)), 4_000_000),
    ("gpu[0-99999999]", 100_000_000),
])
def test_a_hostlist_beyond_the_inventory_is_refused_before_it_is_expanded(
        make_bot: BotFactory, nodes: str, count: int) -> None:
    bot = make_bot({"many": nodes_runbook("many")})
    tracemalloc.start()
    try:
        started = time.perf_counter()
        with pytest.raises(Refused) as refused:
            bot.plan("many", {"nodes": nodes})
        took = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    shown = nodes if len(nodes) <= 60 else f"{nodes[:60]}... ({len(nodes)} characters)"
    assert str(refused.value) == (
        f"many: nodes: {shown} names {count:,} nodes; the inventory holds 4")
    assert peak < 5_000_000, (took, peak)  # bytes: never millions of names


def test_a_plan_refuses_a_hostlist_over_its_cap_from_the_ranges(make_bot: BotFactory) -> None:
    """Past the parameters (an inventory as big as the hostlist), planning's own cap is
    decided from the ranges too."""
    loaded = make_bot({"many": nodes_runbook("many")}).runbook("many")
    with pytest.raises(PlanError, match=r"names 100000000 nodes; a plan may touch at most 4096"):
        runbook_nodes(loaded, {"nodes": "gpu[0-99999999]"})
    assert len(runbook_nodes(loaded, {"nodes": "gpu[0001-4096]"})) == MAX_PLAN_NODES


def test_racing_overlapping_requests_take_all_their_nodes_or_none(make_bot: BotFactory,
                                                                  db_url: str) -> None:
    bot = make_bot({"many": nodes_runbook("many")}, url=db_url)
    asks = ["gpu[01-02]", "gpu[02-03]", "gpu[03-04]", "gpu[04,01]", "gpu[01-04]", "gpu02"] * 2
    granted: dict[int, str] = {}
    refused: list[str] = []
    start = threading.Barrier(len(asks))

    def ask(nodes: str, user: str) -> None:
        start.wait()
        try:
            granted[bot.request("many", {"nodes": nodes}, user)] = nodes
        except Refused as exc:
            assert "is held by execution" in str(exc)
            refused.append(nodes)

    threads = [threading.Thread(target=ask, args=(nodes, ("alice", "bob")[i % 2]))
               for i, nodes in enumerate(asks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert granted and len(granted) + len(refused) == len(asks)
    held = held_locks(bot)
    for execution_id, nodes in granted.items():  # each holds every node it asked for
        assert {name for name, ex in held.items() if ex == execution_id} == {
            f"node:{node}" for node in hostlist.expand(nodes)}
    assert set(held.values()) == set(granted)  # and a refused one holds nothing


@pytest.mark.parametrize("given, missing", [
    ({"version": "535.161.08"}, "nodes= is required for the Slurm pool: the nodes"),
    ({"nodes": "gpu01"}, "version= is required for the Slurm pool: the driver version")])
def test_a_slurm_rollback_without_its_nodes_or_driver_says_which(
        make_bot: BotFactory, db_url: str, given: dict[str, str], missing: str) -> None:
    bot = shipped_bot(make_bot, db_url, ("rollback-driver",))
    with pytest.raises(Refused) as err:
        bot.plan("rollback-driver", given)
    assert str(err.value) == ("rollback-driver: step rollout (slurm.driver_rollout): "
                              + missing + (" (a hostlist, gpu[01-16])" if "nodes" in missing
                                           else " (535.161.08)"))
