"""The XID table, repeat offenders, a failed run's follow-up proposal and the breaker on
automation, through the real service, proposals and engine on SQLite (PostgreSQL races are in
test_breaker_races)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from adapters.kubernetes.cordons import held_by as cordoned_by
from adapters.kubernetes.fake import FakeKubernetes
from adapters.slurm import reasons
from adapters.slurm.fake import FakeSlurm
from bot.alerts import breaker, proposing
from bot.alerts.proposing import Webhook, WebhookAlert
from bot.config import InventoryConfig
from bot.execution.engine import Engine
from bot.runbooks.inventory import InventorySources, Seen, build
from bot.service import Service
from bot.store import audit
from bot.store.schema import proposals
from bot.store.words import Kind
from bot.surfaces import rendering
from bot.surfaces.chat import commands
from kit.errors import Refused
from tests.bot import fakes
from tests.bot.execution.test_engine import record
from tests.conftest import BotFactory

NODE_PARAMS = {"node": {"type": "node", "required": True},
               "gpu": {"type": "int", "min": 0, "max": 7, "default": 0},
               "reason": {"type": "text", "default": "alert"}}


def remediation(name: str, kind: str | None, steps: list[dict[str, Any]] | None = None,
                **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name, "version": "1.0.0", "summary": f"{name} for tests", "risk": "low",
        "params": dict(NODE_PARAMS), "locks": [], "steps": steps or [record("a", name)]}
    if kind:
        body["remediation"] = kind
    body.update(extra)
    return body


def reset_gpu() -> dict[str, Any]:
    params = {**NODE_PARAMS, "method": {"type": "enum", "choices": ["reset", "reboot"],
                                        "default": "reset"}}
    return remediation("reset-gpu", "repair", params=params)


RUNBOOKS = {"drain-node": remediation("drain-node", "drain"),
            "resume-node": remediation("resume-node", "resume"),
            "swap-gpu": remediation("swap-gpu", "repair"),
            "reset-gpu": reset_gpu()}
XID_RULE = {"match": {"alertname": "GpuXid"}, "xid": "{{ labels.xid }}",
            "params": {"node": "{{ labels.node }}", "gpu": "{{ labels.gpu }}",
                       "reason": "XID {{ labels.xid }}"}}
DRAIN_RULE = {"match": {"alertname": "GpuHot"}, "runbook": "drain-node",
              "params": {"node": "{{ labels.node }}", "gpu": "{{ labels.gpu }}"}}
# wide limits unless a test narrows them: one node of four is 25% of the pool
WIDE = {"breaker": {"max_pool_share": 1.0, "max_nodes_per_hour": 100}}


def make(make_bot: BotFactory, remediation_config: dict[str, Any] | None = None,
         **overrides: Any) -> Service:
    fakes.reset()
    overrides.setdefault("alert_rules", [XID_RULE, DRAIN_RULE])
    return make_bot(RUNBOOKS, remediation=remediation_config or WIDE, **overrides)


def fire(bot: Service, name: str, fingerprint: str, **labels: str) -> list[Any]:
    alert = WebhookAlert.model_validate({
        "status": "firing", "labels": {"alertname": name, **labels},
        "fingerprint": fingerprint, "startsAt": "2026-12-02T01:00:00Z"})
    return proposing.receive(bot, Webhook(version="4", status="firing", alerts=[alert]))


def events(bot: Service) -> list[dict[str, Any]]:
    with bot.db.connect() as conn:
        return list(audit.events(conn))


def ran(bot: Service, runbook: str, node: str, **params: str) -> Any:
    execution_id = bot.request(runbook, {"node": node, **params}, "alice")
    engine = Engine(bot, sleep=lambda s: None)
    try:
        return engine.drive(execution_id)
    finally:
        engine.close()


# --- the XID table ----------------------------------------------------------------------


@pytest.mark.parametrize(("xid", "runbook", "method"), [
    ("48", "reset-gpu", "reset"), ("95", "reset-gpu", "reboot"), ("79", "swap-gpu", None)])
def test_the_xid_table_picks_the_runbook(make_bot: BotFactory, xid: str, runbook: str,
                                         method: str | None) -> None:
    bot = make(make_bot)
    [proposal] = fire(bot, "GpuXid", f"x{xid}", node="gpu02", gpu="3", xid=xid)
    assert proposal.state == "open" and proposal.runbook == runbook
    assert proposal.params.get("method") == method
    assert proposal.params["node"] == "gpu02" and proposal.params["gpu"] == "3"
    assert f"XID {xid}" in (proposal.note or "")


def test_an_application_xid_proposes_nothing(make_bot: BotFactory) -> None:
    bot = make(make_bot)
    assert fire(bot, "GpuXid", "x13", node="gpu02", gpu="3", xid="13") == []
    assert proposing.listing(bot, open_only=False) == []


def test_the_configuration_overrides_one_xid_and_keeps_the_rest(make_bot: BotFactory) -> None:
    bot = make(make_bot, {**WIDE, "xid": {"13": "reboot"}})
    [proposal] = fire(bot, "GpuXid", "x13", node="gpu02", gpu="1", xid="13")
    assert (proposal.runbook, proposal.params["method"]) == ("reset-gpu", "reboot")
    [other] = fire(bot, "GpuXid", "x48", node="gpu03", gpu="1", xid="48")
    assert other.params["method"] == "reset"


@pytest.mark.parametrize(("xid", "words"), [
    ("999", "not in the XID table"), ("79; rm -rf /", "not a number"), ("", "not a number")])
def test_an_unknown_or_garbled_xid_is_a_refused_proposal(make_bot: BotFactory, xid: str,
                                                          words: str) -> None:
    bot = make(make_bot)
    [proposal] = fire(bot, "GpuXid", "bad", node="gpu02", gpu="1", xid=xid)
    assert proposal.state == "refused" and words in (proposal.note or "")


def test_a_rule_names_a_runbook_or_an_xid_not_both(make_bot: BotFactory) -> None:
    with pytest.raises(ValueError, match="not both"):
        make(make_bot, alert_rules=[{**XID_RULE, "runbook": "swap-gpu"}])


# --- repeat offenders -------------------------------------------------------------------


def test_a_repeat_offender_gets_swap_gpu_marked_as_repeat(make_bot: BotFactory) -> None:
    bot = make(make_bot, {**WIDE, "repeat": {"remediations": 3, "days": 30}})
    for runbook in ("drain-node", "reset-gpu"):
        assert ran(bot, runbook, "gpu03").state == "succeeded"
    [second] = fire(bot, "GpuHot", "hot1", node="gpu03", gpu="5")
    assert second.runbook == "drain-node"  # two remediations: not yet a repeat offender
    proposing.dismiss(bot, second.id, "alice", None)
    assert ran(bot, "drain-node", "gpu03").state == "succeeded"
    [third] = fire(bot, "GpuXid", "x48", node="gpu03", gpu="5", xid="48")
    assert third.runbook == "swap-gpu" and third.params["gpu"] == "5"
    assert third.note is not None and third.note.startswith("repeat: gpu03 is a repeat offender")
    assert "3 remediations in 30 days" in third.note and "instead of reset-gpu" in third.note
    # another node is not touched by gpu03's record
    [clean] = fire(bot, "GpuXid", "x48b", node="gpu02", gpu="5", xid="48")
    assert clean.runbook == "reset-gpu"


def test_resume_node_warns_in_its_plan_but_not_in_its_hash(make_bot: BotFactory) -> None:
    bot = make(make_bot, {**WIDE, "repeat": {"remediations": 2, "days": 1}})
    before = bot.plan("resume-node", {"node": "gpu02"})
    assert before.warnings == []
    for _ in range(2):
        assert ran(bot, "drain-node", "gpu02").state == "succeeded"
    after = bot.plan("resume-node", {"node": "gpu02"})
    assert len(after.warnings) == 1 and "gpu02 is a repeat offender" in after.warnings[0]
    assert "consider swap-gpu" in rendering.plan_text(after)
    assert after.hash == before.hash  # advice, not an operation: approvals still apply
    assert bot.plan("resume-node", {"node": "gpu01"}).warnings == []


def test_cancelled_and_refused_runs_are_not_remediations(make_bot: BotFactory) -> None:
    bot = make(make_bot, {**WIDE, "repeat": {"remediations": 2, "days": 30}})
    execution_id = bot.request("drain-node", {"node": "gpu01"}, "alice")
    bot.cancel(execution_id, "alice")
    assert ran(bot, "drain-node", "gpu01").state == "succeeded"
    assert bot.repeat_offences("gpu01") == []


# --- a failed run's follow-up ------------------------------------------------------------


def follow_up_bot(make_bot: BotFactory, target_gpu: str = "{{ gpu }}") -> Service:
    failing = remediation("reset-gpu", "repair", [
        {"id": "reset", "action": "test.flaky", "with": {"key": "reset"}}],
        params={**NODE_PARAMS, "method": {"type": "enum", "choices": ["reset", "reboot"],
                                          "default": "reset"}},
        propose_on_failure={"runbook": "swap-gpu", "params": {
            "node": "{{ node }}", "gpu": target_gpu, "reason": "reset failed: {{ reason }}"}})
    fakes.reset()
    return make_bot({**RUNBOOKS, "reset-gpu": failing}, remediation=WIDE)


def test_a_failed_run_leaves_the_proposal_its_plan_shows(make_bot: BotFactory) -> None:
    bot = follow_up_bot(make_bot)
    plan = bot.plan("reset-gpu", {"node": "gpu02", "gpu": "6"})
    assert plan.propose_on_failure == {"runbook": "swap-gpu", "params": {
        "node": "gpu02", "gpu": "6", "reason": "reset failed: alert"}}
    assert "if it fails: propose swap-gpu node=gpu02 gpu=6" in rendering.plan_text(plan)
    fakes.FAILURES["reset"] = 1
    ex = ran(bot, "reset-gpu", "gpu02", gpu="6")
    assert ex.state == "failed"
    [proposal] = proposing.listing(bot)
    assert (proposal.runbook, proposal.params["gpu"]) == ("swap-gpu", "6")
    assert proposal.alertname == "reset-gpu failed"
    assert f"execution {ex.id}" in (proposal.note or "")
    kinds = [e["kind"] for e in events(bot) if e["execution_id"] == ex.id]
    assert kinds[-2:] == [Kind.FINISHED, Kind.PROPOSED]
    execution_id = proposing.run(bot, proposal.id, "carol")
    assert bot.get(execution_id).runbook == "swap-gpu"


def test_the_proposal_names_the_gpu_the_diagnostic_named(make_bot: BotFactory) -> None:
    failing = remediation("reset-gpu", "repair", [
        {"id": "reset", "action": "test.flaky", "with": {"key": "Fail - GPU: 5"}}],
        propose_on_failure={"runbook": "swap-gpu", "params": {
            "node": "{{ node }}", "gpu": "{{ gpu }}", "reason": "reset failed"}})
    fakes.reset()
    bot = make_bot({**RUNBOOKS, "reset-gpu": failing}, remediation=WIDE)
    fakes.FAILURES["Fail - GPU: 5"] = 2
    assert ran(bot, "reset-gpu", "gpu02", gpu="3").state == "failed"
    [proposal] = proposing.listing(bot)
    assert proposal.params["gpu"] == "5"
    assert (proposal.note or "").startswith("the diagnostic named GPU 5, not GPU 3: proposed "
                                            "for GPU 5. reset-gpu (execution")
    assert ran(bot, "reset-gpu", "gpu03", gpu="5").state == "failed"  # the same GPU: as is
    assert [p.params["gpu"] for p in proposing.listing(bot)] == ["5", "5"]


def test_a_run_that_succeeds_or_is_cancelled_proposes_nothing(make_bot: BotFactory) -> None:
    bot = follow_up_bot(make_bot)
    assert ran(bot, "reset-gpu", "gpu02").state == "succeeded"
    cancelled = bot.request("reset-gpu", {"node": "gpu03"}, "alice")
    bot.cancel(cancelled, "alice")
    with bot.db.connect() as conn:
        assert conn.execute(select(proposals)).first() is None


def test_after_step_limits_the_follow_up_to_that_steps_failure(make_bot: BotFactory) -> None:
    steps = [{"id": "wait", "action": "test.flaky", "with": {"key": "wait"}},
             {"id": "reset", "action": "test.flaky", "with": {"key": "reset"}}]
    body = remediation("reset-gpu", "repair", steps, propose_on_failure={
        "runbook": "swap-gpu", "params": {"node": "{{ node }}"}, "after_step": "reset"})
    fakes.reset()
    bot = make_bot({**RUNBOOKS, "reset-gpu": body}, remediation=WIDE)
    plan = bot.plan("reset-gpu", {"node": "gpu02"})
    assert "if step reset fails: propose swap-gpu node=gpu02" in rendering.plan_text(plan)
    fakes.FAILURES["wait"] = 1
    assert ran(bot, "reset-gpu", "gpu02").state == "failed"
    assert proposing.listing(bot) == []  # jobs that would not finish: no new GPU needed
    fakes.FAILURES["reset"] = 1
    assert ran(bot, "reset-gpu", "gpu03").state == "failed"
    [proposal] = proposing.listing(bot)
    assert proposal.params == {"node": "gpu03"}


def test_after_step_may_name_several_steps(make_bot: BotFactory) -> None:
    steps = [{"id": "wait", "action": "test.flaky", "with": {"key": "wait"}},
             {"id": "reset", "action": "test.flaky", "with": {"key": "reset"}},
             {"id": "reboot", "action": "test.flaky", "with": {"key": "reboot"}}]
    body = remediation("reset-gpu", "repair", steps, propose_on_failure={
        "runbook": "swap-gpu", "params": {"node": "{{ node }}"},
        "after_step": ["reset", "reboot"]})
    fakes.reset()
    bot = make_bot({**RUNBOOKS, "reset-gpu": body}, remediation=WIDE)
    plan = bot.plan("reset-gpu", {"node": "gpu02"})
    assert "if step reset or reboot fails: propose swap-gpu" in rendering.plan_text(plan)
    fakes.FAILURES["wait"] = 1
    ran(bot, "reset-gpu", "gpu02")
    assert proposing.listing(bot) == []
    fakes.FAILURES["reboot"] = 1
    assert ran(bot, "reset-gpu", "gpu03").state == "failed"
    assert [p.params for p in proposing.listing(bot)] == [{"node": "gpu03"}]


def test_after_step_must_name_a_step(make_bot: BotFactory) -> None:
    body = remediation("reset-gpu", "repair", propose_on_failure={
        "runbook": "swap-gpu", "params": {}, "after_step": "rest"})
    bot = make_bot({"reset-gpu": body})
    with pytest.raises(Exception, match="after_step: no step 'rest'"):
        bot.runbooks()


def test_a_follow_up_that_could_not_be_requested_refuses_the_plan(
        make_bot: BotFactory) -> None:
    bot = follow_up_bot(make_bot, target_gpu="{{ gpu + 40 }}")  # swap-gpu allows 0-7
    with pytest.raises(Refused, match="propose_on_failure \\(swap-gpu\\)"):
        bot.plan("reset-gpu", {"node": "gpu02", "gpu": "1"})


def test_a_follow_up_template_may_name_only_parameters_and_facts(
        make_bot: BotFactory) -> None:
    bot = follow_up_bot(make_bot, target_gpu="{{ secret_thing }}")
    with pytest.raises(Exception, match="secret_thing"):
        bot.runbooks()


# --- the breaker -------------------------------------------------------------------------


def test_the_breaker_trips_on_a_pools_share_and_stops_proposals(make_bot: BotFactory) -> None:
    bot = make(make_bot, {"breaker": {"max_pool_share": 0.5, "max_nodes_per_hour": 100}})
    for node in ("gpu01", "gpu02"):
        assert ran(bot, "drain-node", node).state == "succeeded"
    [open_one] = fire(bot, "GpuHot", "h1", node="gpu03", gpu="1")
    assert open_one.state == "open"  # 2 of 4 held out: not more than half
    proposing.run(bot, open_one.id, "carol")
    engine = Engine(bot, sleep=lambda s: None)
    engine.drive(bot.get(proposing.get(bot, open_one.id).execution_id or 0).id)
    engine.close()
    [stopped] = fire(bot, "GpuXid", "x48", node="gpu04", gpu="1", xid="48")
    assert stopped.state == "refused" and "breaker on automation tripped" in (stopped.note or "")
    assert "3 of the 4 nodes of the slurm pool" in (stopped.note or "")
    [again] = fire(bot, "GpuHot", "h2", node="gpu04", gpu="2")
    assert again.state == "refused" and "is tripped" in (again.note or "")
    trips = [e for e in events(bot) if e["kind"] == Kind.BREAKER_TRIPPED]
    assert len(trips) == 1  # recorded once, however many alerts it stopped
    # people still work
    assert ran(bot, "drain-node", "gpu04").state == "succeeded"


def test_a_resume_gives_the_node_back_to_the_count(make_bot: BotFactory) -> None:
    bot = make(make_bot, {"breaker": {"max_pool_share": 0.25, "max_nodes_per_hour": 100}})
    assert ran(bot, "drain-node", "gpu01").state == "succeeded"
    assert breaker.status(bot).held_out == {"slurm": ["gpu01"], "kubernetes": []}
    assert ran(bot, "resume-node", "gpu01").state == "succeeded"
    assert breaker.status(bot).held_out == {"slurm": [], "kubernetes": []}
    fakes.FAILURES["swap-gpu"] = 0
    assert breaker.stopped(bot) is None


def test_the_breaker_trips_on_nodes_per_hour(make_bot: BotFactory) -> None:
    bot = make(make_bot, {"breaker": {"max_pool_share": 1.0, "max_nodes_per_hour": 2}})
    for node in ("gpu01", "gpu02", "gpu03"):
        assert ran(bot, "drain-node", node).state == "succeeded"
        ran(bot, "resume-node", node)
    reason = breaker.stopped(bot)
    assert reason is not None and "3 nodes taken out in the last hour" in reason


def test_auto_run_stops_while_tripped_and_leaves_the_proposal_open(
        make_bot: BotFactory) -> None:
    rule = {**DRAIN_RULE, "auto_run": True}
    bot = make(make_bot, {"breaker": {"max_pool_share": 1.0, "max_nodes_per_hour": 1}},
               alert_rules=[rule])
    [first] = fire(bot, "GpuHot", "a1", node="gpu01", gpu="0")
    assert first.state == "started"  # risk low: it ran by itself
    Engine(bot, sleep=lambda s: None).drive(first.execution_id or 0)
    assert ran(bot, "drain-node", "gpu02").state == "succeeded"  # a person: 2 this hour
    [second] = fire(bot, "GpuHot", "a2", node="gpu03", gpu="0")
    assert second.state == "refused" and "breaker" in (second.note or "")


def test_only_an_approver_resets_it_with_a_reason_and_counting_starts_again(
        make_bot: BotFactory) -> None:
    bot = make(make_bot, {"breaker": {"max_pool_share": 0.25, "max_nodes_per_hour": 100}})
    with pytest.raises(Refused, match="not tripped"):
        breaker.reset(bot, "carol", "nothing to do")
    for node in ("gpu01", "gpu02"):
        ran(bot, "drain-node", node)
    assert breaker.stopped(bot) is not None
    with pytest.raises(Refused, match="only approvers"):
        breaker.reset(bot, "alice", "I want my alerts back")
    with pytest.raises(Refused, match="say why"):
        breaker.reset(bot, "carol", "  ")
    now = breaker.reset(bot, "carol", "gpu01 and gpu02 are known, racks being fixed")
    assert not now.tripped and now.held_out["slurm"] == []  # counted from the reset
    assert breaker.stopped(bot) is None
    [proposal] = fire(bot, "GpuHot", "after", node="gpu03", gpu="0")
    assert proposal.state == "open"
    resets = [e for e in events(bot) if e["kind"] == Kind.BREAKER_RESET]
    assert resets[0]["actor"] == "carol" and "racks" in resets[0]["data"]["reason"]


def test_the_chat_says_the_breaker_and_resets_it(make_bot: BotFactory) -> None:
    bot = make(make_bot, {"breaker": {"max_pool_share": 0.25, "max_nodes_per_hour": 100}})
    assert "closed" in commands.handle(bot, "breaker", "alice").text
    for node in ("gpu01", "gpu02"):
        ran(bot, "drain-node", node)
    breaker.stopped(bot)
    status = commands.handle(bot, "breaker status", "alice")
    assert "TRIPPED" in status.text and "gpu01, gpu02" in status.text
    assert commands.kind_of("breaker status") == "read"
    assert commands.kind_of("breaker reset because") == "act"
    refused = commands.handle(bot, "breaker reset please", "alice")
    assert not refused.ok and "only approvers" in refused.text
    assert not commands.handle(bot, "breaker reset", "carol").ok  # no reason: usage
    done = commands.handle(bot, "breaker reset racks fixed", "carol")
    assert done.ok and "breaker reset by carol" in done.text


def test_a_trip_after_a_reset_counts_only_from_the_reset(make_bot: BotFactory) -> None:
    bot = make(make_bot, {"breaker": {"max_pool_share": 0.25, "max_nodes_per_hour": 100}})
    for node in ("gpu01", "gpu02"):
        ran(bot, "drain-node", node)
    assert breaker.stopped(bot) is not None
    breaker.reset(bot, "carol", "known")
    for node in ("gpu03", "gpu01"):
        ran(bot, "drain-node", node)
    reason = breaker.stopped(bot)
    assert reason is not None and "2 of the 4 nodes" in reason
    assert breaker.status(bot).held_out["slurm"] == ["gpu01", "gpu03"]  # found by the model


# --- held out: what the systems show, not the history -------------------------------------


def cluster(bot: Service, slurm: FakeSlurm, kubernetes: FakeKubernetes) -> None:
    """The bot's inventory listed from the fakes, as `runbook serve` lists the pools."""
    sources = InventorySources(
        slurm=lambda: [Seen(n.name, drain_reason=n.reason if "DRAIN" in n.flags else None,
                            held_by=reasons.held_by(n.reason) if "DRAIN" in n.flags
                            else frozenset())
                       for n in slurm.nodes(None, with_jobs=False)],
        kubernetes=lambda: [Seen(n.name, held_by=cordoned_by(n.annotations)
                                 if n.unschedulable else frozenset())
                            for n in kubernetes.list_nodes()])
    bot.inventory = build(InventoryConfig(), sources)


def test_held_out_is_what_the_cluster_shows_not_the_history(make_bot: BotFactory) -> None:
    bot = make(make_bot, {"breaker": {"max_pool_share": 0.5, "max_nodes_per_hour": 100}})
    slurm = FakeSlurm(["gpu01", "gpu02", "gpu03", "gpu04"])
    kubernetes = FakeKubernetes(["gpu05", "gpu06", "gpu07"])
    for node in ("gpu01", "gpu02", "gpu03"):  # the history: three drains by the bot
        assert ran(bot, "drain-node", node).state == "succeeded"
    slurm.update_nodes(["gpu01"], "DRAIN", "bob: PSU fan")  # somebody else's
    slurm.update_nodes(["gpu02"], "DRAIN", "XID 79 (execution 2)")  # the bot's
    # gpu03 was resumed by hand since: back in service whatever the history says
    kubernetes.patch_node("gpu05", {"spec": {"unschedulable": True}, "metadata": {
        "annotations": {"gpu-runbook-bot/cordoned-by": "execution-3"}}}, strategic=True)
    cluster(bot, slurm, kubernetes)
    now = breaker.status(bot)
    assert now.held_out == {"slurm": ["gpu02"], "kubernetes": ["gpu05"]}
    [proposal] = fire(bot, "GpuHot", "c1", node="gpu04", gpu="1")
    assert proposal.state == "open", proposal.note  # 1 of 4 (the history: 3 of 4, tripped)
    slurm.update_nodes(["gpu02"], "RESUME")
    cluster(bot, slurm, kubernetes)
    assert breaker.status(bot).held_out == {"slurm": [], "kubernetes": ["gpu05"]}


def test_a_reset_forgives_the_holds_made_before_it(make_bot: BotFactory) -> None:
    bot = make(make_bot, {"breaker": {"max_pool_share": 0.2, "max_nodes_per_hour": 100}})
    slurm = FakeSlurm(["gpu01", "gpu02", "gpu03", "gpu04"])
    first = ran(bot, "drain-node", "gpu01")
    slurm.update_nodes(["gpu01", "gpu02"], "DRAIN", f"XID 79 (execution {first.id})")
    cluster(bot, slurm, FakeKubernetes([]))
    [stopped] = fire(bot, "GpuHot", "r1", node="gpu03", gpu="1")
    assert stopped.state == "refused"
    breaker.reset(bot, "carol", "gpu01 and gpu02 are being worked on")
    assert breaker.status(bot).held_out == {"slurm": []}
    later = ran(bot, "drain-node", "gpu03")
    slurm.update_nodes(["gpu03"], "DRAIN", f"ECC (execution {later.id})")
    cluster(bot, slurm, FakeKubernetes([]))
    assert breaker.status(bot).held_out == {"slurm": ["gpu03"]}
