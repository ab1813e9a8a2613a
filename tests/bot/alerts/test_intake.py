"""Faults the bot did not raise, taken in as alerts (bot/alerts/intake.py), over the
in-memory Slurm and Kubernetes: a node NHC drained proposes the repair its rule names, with
the reason quoted and the GPU and XID read from it; once per node and cause, however often
it is scanned or after a dismissal; the bot's own drains propose nothing; a cause that went
away resolves its proposal; a Kubernetes node condition of a configured type proposes too;
nothing runs without a person. The lab drains through a real HealthCheckProgram in
tests/runbooks/test_nhc_lab.py."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from adapters.kubernetes.fake import FakeKubernetes
from adapters.slurm.fake import FakeSlurm
from bot.alerts import intake, proposing
from bot.config.remediation import IntakeConfig
from bot.execution import executions
from bot.runtime.tasks import intake_task
from bot.service import Service
from tests.bot.alerts.test_remediation import RUNBOOKS, WIDE, XID_RULE
from tests.conftest import BotFactory

NHC = "NHC: check_nv_dcgm: GPU 3: Row remap failure"
SWAP_RULE = {"match": {"alertname": "SlurmNodeDrained", "source": "nhc"}, "runbook": "swap-gpu",
             "params": {"node": "{{ labels.node }}", "gpu": "{{ labels.gpu }}",
                        "reason": "{{ labels.reason }}"}}
CONDITION_RULE = {"match": {"alertname": "KubernetesNodeCondition"}, "xid": "{{ labels.xid }}",
                  "params": {"node": "{{ labels.node }}", "gpu": "{{ labels.gpu }}",
                             "reason": "{{ labels.reason }}"}}


def make(make_bot: BotFactory, **intake_config: Any) -> Service:
    bot = make_bot(RUNBOOKS, remediation={**WIDE, "intake": intake_config},
                   alert_rules=[SWAP_RULE, CONDITION_RULE, XID_RULE])
    bot.backends = {"slurm": FakeSlurm(["gpu01", "gpu02", "gpu03", "gpu04"]),
                    "kubernetes": FakeKubernetes(["gpu04"])}
    return bot


def test_a_node_nhc_drained_proposes_the_repair_once(make_bot: BotFactory) -> None:
    bot = make(make_bot)
    bot.backends["slurm"].update_nodes(["gpu02"], "DRAIN", NHC)
    [proposal] = intake.scan(bot)
    assert (proposal.state, proposal.runbook) == ("open", "swap-gpu")
    assert proposal.params == {"node": "gpu02", "gpu": "3", "reason": NHC}
    assert proposal.labels["source"] == "nhc" and proposal.labels["reason"] == NHC
    assert intake.scan(bot) == []  # the same cause: no second proposal
    proposing.dismiss(bot, proposal.id, "alice", "known, ticket 12")
    assert intake.scan(bot) == []  # dismissed: not proposed again while the drain stays
    with bot.db.connect() as conn:
        assert executions.find(conn) == []  # nothing runs without a person


def test_the_bots_own_drains_propose_nothing(make_bot: BotFactory) -> None:
    bot = make(make_bot)
    slurm = bot.backends["slurm"]
    slurm.update_nodes(["gpu01"], "DRAIN", "XID 79 (execution 5)")
    slurm.update_nodes(["gpu03"], "DRAIN", "GPU telemetry: GPU 2 missing "
                                           "(execution 6: failed check)")
    assert intake.scan(bot) == []
    slurm.update_nodes(["gpu03"], "DRAIN", f"{NHC} ++ XID 79 (execution 5)")  # theirs first
    [proposal] = intake.scan(bot)
    assert proposal.params["node"] == "gpu03" and proposal.labels["reason"] == NHC


def test_a_new_cause_on_the_same_node_proposes_again(make_bot: BotFactory) -> None:
    bot = make(make_bot)
    slurm = bot.backends["slurm"]
    slurm.update_nodes(["gpu02"], "DRAIN", NHC)
    [first] = intake.scan(bot)
    slurm.update_nodes(["gpu02"], "DRAIN", "NHC: check_nv_dcgm: GPU 5: PCIe replay")
    touched = intake.scan(bot)
    [second] = [p for p in touched if p.id != first.id]
    assert second.params["gpu"] == "5"
    assert proposing.get(bot, first.id).alert_status == "resolved"  # its cause went away


def test_a_drain_lifted_resolves_its_proposal(make_bot: BotFactory) -> None:
    bot = make(make_bot)
    slurm = bot.backends["slurm"]
    slurm.update_nodes(["gpu02"], "DRAIN", NHC)
    [proposal] = intake.scan(bot)
    slurm.update_nodes(["gpu02"], "RESUME")
    [resolved] = intake.scan(bot)
    assert resolved.id == proposal.id and resolved.alert_status == "resolved"
    assert intake.scan(bot) == []


def test_a_drain_no_rule_matches_is_left_alone(make_bot: BotFactory) -> None:
    bot = make(make_bot)
    bot.backends["slurm"].update_nodes(["gpu02"], "DRAIN", "bob: PSU fan noise, ticket 4411")
    assert intake.scan(bot) == []  # source slurm-or-person: no rule in this configuration


def test_a_kubernetes_condition_proposes_by_the_xid_table(make_bot: BotFactory) -> None:
    bot = make(make_bot, kubernetes_conditions=["GpuXidError"])
    kube = bot.backends["kubernetes"]
    kube.nodes["gpu04"] = replace(kube.nodes["gpu04"], problems={
        "GpuXidError": ("XidError", "XID 48 on GPU 2", "2026-12-05T01:00:00Z"),
        "KernelDeadlock": ("DockerHung", "task hung", "2026-12-05T01:00:00Z")})
    [proposal] = intake.scan(bot)
    assert proposal.runbook == "reset-gpu" and proposal.params["gpu"] == "2"
    assert proposal.labels["condition"] == "GpuXidError"
    assert intake.scan(bot) == []
    kube.nodes["gpu04"] = replace(kube.nodes["gpu04"], problems={})
    [resolved] = intake.scan(bot)
    assert resolved.alert_status == "resolved"


def test_slurm_drains_can_be_turned_off(make_bot: BotFactory) -> None:
    bot = make(make_bot, slurm_drains=False)
    bot.backends["slurm"].update_nodes(["gpu02"], "DRAIN", NHC)
    assert intake.scan(bot) == []


def test_the_configuration_refuses_ready_and_odd_condition_types() -> None:
    for bad in (["Ready"], ["no spaces allowed"], ["x" * 80]):
        with pytest.raises(ValidationError, match="node condition type"):
            IntakeConfig.model_validate({"kubernetes_conditions": bad})


def test_the_task_scans_until_stopped_and_says_what_it_proposed(make_bot: BotFactory) -> None:
    bot = make(make_bot, every=0.01)
    bot.backends["slurm"].update_nodes(["gpu02"], "DRAIN", NHC)
    said: list[str] = []
    stop = threading.Event()
    task = threading.Thread(target=intake_task(bot, said.append).run, args=(stop,))
    task.start()
    try:
        for _ in range(500):
            if said:
                break
            stop.wait(0.01)
    finally:
        stop.set()
        task.join(5)
    assert said and "(SlurmNodeDrained on gpu02): open" in said[0]
