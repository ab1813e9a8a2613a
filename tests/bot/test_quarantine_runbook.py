"""The shipped quarantine-node runbook over the in-memory Slurm and Kubernetes: a node in
both pools is drained without waiting for its jobs (none is killed) and cordoned without an
eviction, both marked with the execution; risk low, so it needs no approval; a cancel during
the drain undoes only what this run did. The lab runs it on real Slurm (SIGKILL matrix, the
XID 79 alert path in test_monitoring_path.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adapters.kubernetes.backend import Pod
from adapters.slurm.backend import Job
from bot.execution.checks.core import Checks
from bot.execution.checks.slurm import SlurmEvaluator
from bot.execution.engine import Engine
from bot.runbooks.catalogue import KNOWN, Catalogue
from bot.runbooks.params import Inventory
from bot.service import Service
from tests.bot.schedule.windowfakes import Systems
from tests.conftest import BotFactory

RUNBOOKS = Path(__file__).resolve().parents[2] / "runbooks"


def quarantine_bot(make_bot: BotFactory) -> tuple[Service, Systems]:
    systems = Systems(["gpu01", "gpu02"], ["gpu02", "gpu03"])
    bot = make_bot({"quarantine-node": (RUNBOOKS / "quarantine-node.yaml").read_text()},
                   inventory={"nodes": ["gpu01", "gpu02", "gpu03"]})
    bot.inventory = Inventory(nodes=frozenset({"gpu01", "gpu02", "gpu03"}),
                              slurm=frozenset({"gpu01", "gpu02"}),
                              kubernetes=frozenset({"gpu02", "gpu03"}))
    bot.catalogue = Catalogue([*bot.catalogue._actions.values(), *systems.actions()], KNOWN)
    bot = systems.guarding(bot)
    bot.checks = Checks({**bot.checks._evaluators, "slurm": SlurmEvaluator(systems.slurm)},
                        sleep=lambda s: None)
    return bot, systems


def drive(bot: Service, execution_id: int) -> Any:
    engine = Engine(bot, sleep=lambda s: None)
    try:
        return engine.drive(execution_id)
    finally:
        engine.close()


def test_both_pools_out_at_once_without_an_approval_and_no_job_killed(
        make_bot: BotFactory) -> None:
    bot, systems = quarantine_bot(make_bot)
    systems.slurm.running = [Job(41, "train", "bob", "ml", "RUNNING", ["gpu02"])]
    systems.kubernetes.pods = [Pod("serving", "infer-0", "uid-0", node="gpu02",
                                   phase="Running", owner_kind="ReplicaSet")]
    execution_id = bot.request("quarantine-node", {"node": "gpu02", "reason": "XID 79"},
                               "alice")
    assert bot.get(execution_id).state == "approved"  # risk low: no person needed
    assert drive(bot, execution_id).state == "succeeded"
    node = systems.slurm.state["gpu02"]
    assert "DRAIN" in node.flags
    assert node.reason == f"quarantine: XID 79 (execution {execution_id})"
    assert [j.id for j in systems.slurm.running] == [41]  # left to finish
    assert not [c for c in systems.slurm.calls if c[0] == "requeue"]
    assert systems.cordoned()["gpu02"] == f"execution-{execution_id}"
    assert [p.name for p in systems.kubernetes.pods] == ["infer-0"]  # not evicted


def test_a_cancel_during_the_drain_undoes_only_this_run(make_bot: BotFactory) -> None:
    bot, systems = quarantine_bot(make_bot)
    execution_id = bot.request("quarantine-node", {"node": "gpu02", "reason": "XID 79"},
                               "alice")
    drain = systems.slurm.update_nodes

    def drain_then_cancel(names: list[str], state: str, reason: str | None = None) -> None:
        drain(names, state, reason)
        if state.upper() == "DRAIN":
            bot.cancel(execution_id, "alice")

    systems.slurm.update_nodes = drain_then_cancel  # type: ignore[method-assign]
    ended = drive(bot, execution_id)
    assert ended.state == "cancelled" and "undone: slurm-drain" in (ended.error or "")
    assert "DRAIN" not in systems.slurm.state["gpu02"].flags
    assert "gpu02" not in systems.cordoned()  # the cordon step never ran
