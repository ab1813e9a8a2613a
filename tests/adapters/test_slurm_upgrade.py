"""upgrade-slurm without a cluster: Slurm versions and the release window (every stage of
slurmdbd -> slurmctld -> slurmd), the actions against FakeSlurm and an in-memory set of
daemons (waits for the agent queue and the nodes' registration, batches with the canaries
first, the stop at a failed batch, a cancel between batches), the state save copy, and the
shipped runbook's plan and stage order."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from adapters.actions import (
    ActionContext,
    ActionError,
    ActionResult,
    ActionStopped,
    StrictArguments,
)
from adapters.host import HostCommand
from adapters.mariadb import DumpArguments
from adapters.slurm.backend import SlurmctldUnreachable
from adapters.slurm.config import SlurmConfig
from adapters.slurm.daemons import NodeDaemon, node_daemons_from, settings
from adapters.slurm.fake import FakeSlurm
from adapters.slurm.slurm_upgrade import (
    CheckArguments,
    CopyArguments,
    DaemonArguments,
    DaemonUpgradeAction,
    SlurmdArguments,
    SlurmdUpgradeAction,
    StateSaveCopyAction,
    UpgradeCheckAction,
    batches,
)
from adapters.slurm.versions import (
    parse_version,
    releases_apart,
    supported_span,
    window_problems,
)

V = parse_version
NODES = ["gpu01", "gpu02", "gpu03", "gpu04"]


# -- versions and the window ------------------------------------------------------------

def test_versions_parse_and_order() -> None:
    assert V("22.05.8") < V("22.05.10") < V("23.02.0") < V("23.11.10")
    assert str(V("slurm 24.11.1")) == "24.11.1" and V("24.05.0-0rc1") == V("24.05.0")
    for bad in ("22.06.1", "550.54.15", "22.05.x", ""):
        with pytest.raises(ValueError):
            V(bad)


@pytest.mark.parametrize(("older", "newer", "apart"), [
    ("22.05.8", "22.05.11", 0), ("22.05.8", "23.02.1", 1), ("22.05.8", "23.11.10", 2),
    ("22.05.8", "24.05.1", 3), ("23.11.1", "24.11.1", 2), ("25.05.0", "25.11.0", 1),
    ("25.11.2", "26.05.0", 1), ("25.05.0", "26.11.0", 3), ("20.11.9", "22.05.8", 2)])
def test_releases_apart(older: str, newer: str, apart: int) -> None:
    assert releases_apart(V(older), V(newer)) == apart


def test_the_span_is_two_before_24_11_and_three_from_it_unless_configured() -> None:
    assert supported_span(V("24.05.4")) == 2 and supported_span(V("24.11.0")) == 3
    assert supported_span(V("25.05.0")) == 3 and supported_span(V("24.11.0"), 1) == 1


def window(target: str, dbd: str, ctld: str, slurmd: dict[str, str],
           upgraded: set[str] | None = None, override: int | None = None) -> list[str]:
    return window_problems(V(target), V(dbd), V(ctld), {n: V(v) for n, v in slurmd.items()},
                           set(slurmd) if upgraded is None else upgraded, override)


def test_a_window_that_holds() -> None:
    assert window("22.05.8", "22.05.8", "22.05.8", dict.fromkeys(NODES, "22.05.8")) == []
    assert window("23.11.10", "22.05.8", "22.05.8", dict.fromkeys(NODES, "22.05.8")) == []
    assert window("24.11.1", "23.02.7", "23.02.7", dict.fromkeys(NODES, "23.02.7")) == []


def test_three_releases_before_24_11_are_refused() -> None:
    problems = window("24.05.1", "22.05.8", "22.05.8", {"gpu01": "22.05.8"})
    assert problems[0] == ("slurmdbd runs 22.05.8, 3 releases behind 24.05.1 (Slurm converts "
                           "from at most 2): upgrade through an intermediate release first")
    assert any("slurmctld runs 22.05.8, 3 releases behind" in p for p in problems)
    assert window("23.11.1", "22.05.8", "22.05.8", {"gpu01": "22.05.8"}, override=1)


def test_no_daemon_is_downgraded() -> None:
    assert window("22.05.8", "23.02.1", "22.05.8", {"gpu01": "22.05.8"}) == [
        "slurmdbd runs 23.02.1, newer than 22.05.8: this runbook never downgrades"]
    assert window("22.05.8", "22.05.8", "22.05.8", {"gpu01": "22.05.9", "gpu02": "22.05.8"}) \
        == ["slurmd on gpu01 runs 22.05.9, newer than 22.05.8: this runbook never downgrades"]


def test_nodes_left_out_must_stay_within_the_span_of_the_new_slurmctld() -> None:
    slurmd = {"gpu01": "21.08.8", "gpu02": "21.08.8", "gpu03": "21.08.8"}
    assert window("23.02.1", "21.08.8", "21.08.8", slurmd, upgraded={"gpu01"}) == []
    problems = window("23.11.1", "22.05.8", "22.05.8", {**slurmd, "gpu01": "22.05.8"},
                      upgraded={"gpu01"})
    assert problems == [
        f"after {stage}: slurmd on gpu[02-03] runs 21.08.8, 3 releases behind slurmctld 23.11.1 "
        "(at most 2): include those nodes, or upgrade them first"
        for stage in ("slurmctld", "slurmd")]
    assert window("23.11.1", "22.05.8", "22.05.8", {**slurmd, "gpu01": "22.05.8"}) == [
        "after slurmctld: slurmd on gpu[02-03] runs 21.08.8, 3 releases behind slurmctld "
        "23.11.1 (at most 2): include those nodes, or upgrade them first"]


def test_a_slurmd_newer_than_slurmctld_breaks_the_order_after_slurmdbd() -> None:
    problems = window("22.05.8", "22.05.8", "21.08.8", {"gpu01": "22.05.8"})
    assert problems == ["after slurmdbd: slurmd on gpu01 runs 22.05.8, newer than slurmctld "
                        "21.08.8"]


# -- an in-memory set of daemons -------------------------------------------------------

@dataclass
class Daemons:
    """slurmdbd, slurmctld and each slurmd as DaemonReads shows them; ``install`` plays the
    site's commands (records them, moves the version on, restarts the daemon)."""

    slurm: FakeSlurm
    version: str = "22.05.8"
    dbd: str = "22.05.8"
    ctld: str = "22.05.8"
    nodes: dict[str, NodeDaemon] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)  # "slurmctld", or a node name
    no_restart: set[str] = field(default_factory=set)
    away_polls: int = 2  # polls a restarted daemon does not answer
    away: dict[str, int] = field(default_factory=dict)
    state_save: str = "/nonexistent"

    def __post_init__(self) -> None:
        self.nodes = {n: NodeDaemon(n, self.version, "T0", True) for n in self.slurm.state}

    def controller(self) -> dict[str, str]:
        if self.away.get("slurmctld", 0) > 0:
            self.away["slurmctld"] -= 1
            raise SlurmctldUnreachable("slurmctld is not answering")  # as CliDaemonReads
        return {"SLURM_VERSION": self.ctld, "StateSaveLocation": self.state_save}

    def dbd_version(self) -> str:
        return self.dbd

    def node_daemons(self, names: list[str] | None = None) -> list[NodeDaemon]:
        shown = []
        for name in names if names is not None else list(self.nodes):
            node = self.nodes[name]
            if self.away.get(name, 0) > 0:
                self.away[name] -= 1
                node = NodeDaemon(name, node.version, node.started, False)
            shown.append(node)
        return shown

    def install(self, command: HostCommand, argv: list[str],
                timeout: float) -> subprocess.CompletedProcess[str]:
        daemon, version, *node = argv[1:]
        target = node[0] if node else daemon
        self.calls.append(target)
        if target in self.fail:
            return subprocess.CompletedProcess(argv, 1, "", f"{target}: dpkg failed\n")
        if daemon == "slurmdbd":
            self.dbd = version
            self.slurm.dbd_records = 3  # records slurmctld held while slurmdbd restarted
        elif daemon == "slurmctld":
            self.ctld = version
            self.away.update({"slurmctld": 1, **dict.fromkeys(self.nodes, self.away_polls)})
        elif target not in self.no_restart:
            old = self.nodes[target]
            self.nodes[target] = NodeDaemon(target, version, old.started + "'", True)
            self.away[target] = self.away_polls
        return subprocess.CompletedProcess(argv, 0, f"{target} installed\n", "")


COMMANDS = {"commands": {name: {"argv": ["site-install", name.split("-")[0]],
                                "accepts_args": True}
                         for name in ("slurmdbd-install", "slurmctld-install", "slurmd-install")}}


def cluster(**changes: Any) -> tuple[FakeSlurm, Daemons]:
    slurm = FakeSlurm(NODES)
    daemons = Daemons(slurm, **changes)
    return slurm, daemons


def action(cls: type[Any], slurm: FakeSlurm, daemons: Daemons,
           sleep: Callable[[float], None] | None = None, upgrade: dict[str, Any] | None = None
           ) -> Any:
    config = SlurmConfig.model_validate({"upgrade": upgrade if upgrade is not None else COMMANDS})
    return cls(slurm, config, sleep or (lambda s: None), reads=daemons, install=daemons.install)


def context(cancel_after: Callable[[], bool] = lambda: False, seconds: float = 30) -> ActionContext:
    return ActionContext(execution_id=1, step_id="s", deadline=time.monotonic() + seconds,
                         cancelled=cancel_after)


# -- the actions -----------------------------------------------------------------------

def test_the_check_changes_nothing_and_names_the_versions() -> None:
    slurm, daemons = cluster()
    check = action(UpgradeCheckAction, slurm, daemons)
    result = check.run(CheckArguments(version="22.05.8", nodes="gpu[01-04]", canary="gpu01"),
                       context())
    assert not result.changed and daemons.calls == []
    assert result.summary.startswith("window ok: slurmdbd 22.05.8, slurmctld 22.05.8, slurmd "
                                     "22.05.8 -> 22.05.8 (at most 2 releases apart)")


def test_the_plan_shows_the_window_now_and_refuses_an_upgrade_it_forbids() -> None:
    slurm, daemons = cluster()
    check = action(UpgradeCheckAction, slurm, daemons)
    shown = check.plan(CheckArguments(version="22.05.11", nodes=NODES))
    assert shown[-1].startswith("now: window ok: slurmdbd 22.05.8, slurmctld 22.05.8")
    with pytest.raises(ActionError, match=r"^the version window refuses this upgrade: slurmdbd "
                                          r"runs 22.05.8, 7 releases behind 26.05.5"):
        check.plan(CheckArguments(version="26.05.5", nodes=NODES))
    assert daemons.calls == []  # planning read, never installed
    daemons.away["slurmctld"] = 1  # not answering while planning: the step reads again
    assert "now: versions not readable (slurmctld is not answering)" in \
        check.plan(CheckArguments(version="26.05.5", nodes=NODES))[-1]


def test_the_check_refuses_before_anything_runs() -> None:
    slurm, daemons = cluster()
    check = action(UpgradeCheckAction, slurm, daemons)
    with pytest.raises(ActionError, match=r"^the version window check failed: slurmdbd runs "
                                          r"22.05.8, 3 releases behind 24.05.1.*Done before it: "
                                          r"nothing; not started: the accounting database "
                                          r"backup, slurmdbd, the state save copy, slurmctld, "
                                          r"slurmd"):
        check.run(CheckArguments(version="24.05.1", nodes=NODES), context())
    with pytest.raises(ActionError, match="the canary must be among the nodes"):
        check.run(CheckArguments(version="22.05.8", nodes="gpu[01-02]", canary="gpu03"),
                  context())
    with pytest.raises(ActionError, match=r"unknown to Slurm: gpu09"):
        check.run(CheckArguments(version="22.05.8", nodes="gpu[01,09]"), context())
    daemons.nodes["gpu02"] = NodeDaemon("gpu02", "22.05.8", "T0", False)
    with pytest.raises(ActionError, match=r"slurmd on gpu02 does not answer"):
        check.run(CheckArguments(version="22.05.8", nodes=NODES), context())
    unconfigured = action(UpgradeCheckAction, slurm, daemons, upgrade={})
    with pytest.raises(ActionError, match=r'upgrade command "slurmdbd-install" is not '
                                          r"allow-listed.*slurm.upgrade.commands"):
        unconfigured.run(CheckArguments(version="22.05.8", nodes=NODES), context())
    assert daemons.calls == []


def test_slurmdbd_waits_for_its_version_the_accounts_and_an_empty_agent_queue() -> None:
    slurm, daemons = cluster()
    polls: list[int] = []

    def sleep(seconds: float) -> None:  # slurmctld sends one held record per poll
        polls.append(slurm.dbd_records)
        slurm.dbd_records = max(0, slurm.dbd_records - 1)

    upgrade = action(DaemonUpgradeAction, slurm, daemons, sleep)
    result = upgrade.run(DaemonArguments(daemon="slurmdbd", version="23.02.7"), context())
    assert daemons.calls == ["slurmdbd"] and daemons.dbd == "23.02.7"
    assert polls == [3, 2, 1] and result.summary == "slurmdbd runs 23.02.7"
    assert upgrade.plan(DaemonArguments(daemon="slurmdbd", version="23.02.7")) == [
        "run on the bot host: site-install slurmdbd 23.02.7",
        "wait until sacctmgr show configuration says SLURMDBD_VERSION=23.02.7, sacctmgr lists "
        "the accounts and sdiag's DBD Agent queue size is 0 (at most 10m)"]


def test_slurmctld_waits_until_the_nodes_register_again() -> None:
    slurm, daemons = cluster(away_polls=3)
    result = action(DaemonUpgradeAction, slurm, daemons).run(
        DaemonArguments(daemon="slurmctld", version="22.05.8"), context())
    assert result.summary == "slurmctld runs 22.05.8; 4 node(s) registered again"
    assert all(count == 0 for count in daemons.away.values())  # waited through every "away"


def test_a_failed_install_stops_and_says_what_was_done() -> None:
    slurm, daemons = cluster(fail={"slurmctld"})
    with pytest.raises(ActionError) as caught:
        action(DaemonUpgradeAction, slurm, daemons).run(
            DaemonArguments(daemon="slurmctld", version="22.05.8"), context())
    assert str(caught.value) == (
        "slurmctld failed: site-install slurmctld 22.05.8 exited 1: slurmctld: dpkg failed. "
        "Done before it: the accounting database backup, slurmdbd, the state save copy; not "
        "started: slurmd. Nothing is rolled back (Slurm does not downgrade): fix the cause "
        "and run upgrade-slurm again")


@pytest.mark.parametrize("daemon, back", [
    ("slurmdbd", ". To go back instead: reinstall the old release's slurmdbd and restore the "
                 "accounting database from /b/acct.sql (runbook run restore-slurmdbd "
                 "backup=/b/acct.sql)"),
    ("slurmctld", ". To go back instead: reinstall the old release's slurmdbd and restore the "
                  "accounting database from /b/acct.sql (runbook run restore-slurmdbd "
                  "backup=/b/acct.sql), then the old slurmctld with its StateSaveLocation "
                  "from /b/state (and the old slurmd where a node was upgraded)")])
def test_a_failed_stage_says_how_to_go_back_from_what_the_run_saved(daemon: str,
                                                                    back: str) -> None:
    slurm, daemons = cluster(fail={daemon})
    with pytest.raises(ActionError) as caught:
        action(DaemonUpgradeAction, slurm, daemons).run(DaemonArguments(
            daemon=daemon, version="22.05.8", backup="/b/acct.sql", state_copy="/b/state"),
            context())
    assert str(caught.value).endswith("fix the cause and run upgrade-slurm again" + back)


def test_a_daemon_that_never_comes_back_times_out() -> None:
    slurm, daemons = cluster(away_polls=10**9)
    with pytest.raises(ActionError, match=r"^slurmctld failed: timed out waiting for slurmctld "
                                          r"22.05.8: not registered yet: gpu\[01-04\]"):
        action(DaemonUpgradeAction, slurm, daemons).run(
            DaemonArguments(daemon="slurmctld", version="22.05.8", timeout=0.2), context())


def test_batches_put_the_canaries_alone_first() -> None:
    assert batches(NODES, ["gpu03"], 2) == [["gpu03"], ["gpu01", "gpu02"], ["gpu04"]]
    assert batches(NODES, [], 3) == [["gpu01", "gpu02", "gpu03"], ["gpu04"]]
    assert batches(NODES, ["gpu01", "gpu02"], 1) == [["gpu01", "gpu02"], ["gpu03"], ["gpu04"]]


def test_slurmd_canary_first_then_batches_jobs_left_running() -> None:
    slurm, daemons = cluster()
    from adapters.slurm.backend import Job
    slurm.running = [Job(7, "train", "alice", "ml", "RUNNING", ["gpu02"])]
    upgrade = action(SlurmdUpgradeAction, slurm, daemons)
    args = SlurmdArguments(version="22.05.8", nodes=NODES, canary="gpu03", max_parallel=2)
    result = upgrade.run(args, context())
    assert daemons.calls[0] == "gpu03" and sorted(daemons.calls[1:3]) == ["gpu01", "gpu02"]
    assert daemons.calls[3] == "gpu04" and result.details["nodes"] == [
        "gpu03", "gpu01", "gpu02", "gpu04"]
    assert slurm.calls == [] and slurm.running[0].state == "RUNNING"  # nothing drained
    assert all(n.started == "T0'" for n in daemons.nodes.values())
    plan = upgrade.plan(args)
    assert plan[0] == ("4 node(s) in 3 batch(es), jobs left running (no drain); stop at the "
                       "first failure; each batch within 10m")
    assert plan[1].startswith("canary gpu03: run on the bot host: site-install slurmd "
                              "22.05.8 gpu03; wait until")
    assert plan[2].startswith("batch 2 gpu[01-02]: run on the bot host: site-install slurmd "
                              "22.05.8 gpu01; site-install slurmd 22.05.8 gpu02")


def test_a_failed_batch_stops_the_upgrade() -> None:
    slurm, daemons = cluster(fail={"gpu02"})
    args = SlurmdArguments(version="22.05.8", nodes=NODES, canary="gpu01", max_parallel=2)
    with pytest.raises(ActionError) as caught:
        action(SlurmdUpgradeAction, slurm, daemons).run(args, context())
    assert sorted(daemons.calls) == ["gpu01", "gpu02", "gpu03"]  # gpu04's batch never started
    assert str(caught.value).startswith(
        "slurmd failed: slurmd on gpu[02-03]: gpu02: site-install slurmd 22.05.8 gpu02 exited "
        "1: gpu02: dpkg failed; upgraded: gpu01; not started: gpu04. Done before it: the "
        "accounting database backup, slurmdbd, the state save copy, slurmctld; not started: "
        "nothing.")


def test_a_slurmd_that_did_not_restart_is_a_failure() -> None:
    slurm, daemons = cluster(no_restart={"gpu01"})
    with pytest.raises(ActionError, match=r"gpu01 \(slurmd not restarted, started T0\)"):
        action(SlurmdUpgradeAction, slurm, daemons).run(
            SlurmdArguments(version="22.05.8", nodes="gpu01", node_timeout=0.2), context())


def test_a_cancel_stops_between_batches() -> None:
    slurm, daemons = cluster(away_polls=0)
    cancelled = lambda: len(daemons.calls) >= 1  # noqa: E731 - asked during the canary
    with pytest.raises(ActionStopped) as caught:
        action(SlurmdUpgradeAction, slurm, daemons).run(
            SlurmdArguments(version="22.05.8", nodes=NODES, canary="gpu01"), context(cancelled))
    assert daemons.calls == ["gpu01"]
    assert str(caught.value) == ("s: stopped while before slurmd on gpu02: the execution was "
                                 "cancelled; upgraded: gpu01; not started: gpu[02-04]")


def test_a_cancel_while_a_batch_waits_stops_it() -> None:
    slurm, daemons = cluster()
    cancelled = lambda: len(daemons.calls) >= 1  # noqa: E731
    with pytest.raises(ActionStopped) as caught:
        action(SlurmdUpgradeAction, slurm, daemons).run(
            SlurmdArguments(version="22.05.8", nodes=NODES, canary="gpu01"), context(cancelled))
    assert daemons.calls == ["gpu01"]
    assert str(caught.value) == (
        "slurmd on gpu01: s: stopped while waiting for slurmd 22.05.8 on gpu01: the execution "
        "was cancelled; upgraded: none; not started: gpu[02-04]")


def test_the_state_save_copy(tmp_path: Path) -> None:
    source = tmp_path / "statesave"
    (source / "hash.0").mkdir(parents=True)
    (source / "node_state").write_text("nodes")
    (source / "hash.0" / "job.1").write_text("job")
    slurm, daemons = cluster(state_save=str(source))
    copy = action(StateSaveCopyAction, slurm, daemons)
    result = copy.run(CopyArguments(path=str(tmp_path / "copy")), context())
    assert (tmp_path / "copy" / "hash.0" / "job.1").read_text() == "job"
    assert result.details["files"] == 2 and not (tmp_path / "copy.partial").exists()
    (source / "node_state").write_text("newer")
    copy.run(CopyArguments(path=str(tmp_path / "copy")), context())  # replaced
    assert (tmp_path / "copy" / "node_state").read_text() == "newer"
    with pytest.raises(ActionError, match="is inside StateSaveLocation"):
        copy.run(CopyArguments(path=str(source / "copy")), context())
    daemons.state_save = str(tmp_path / "absent")
    with pytest.raises(ActionError, match=r"^the state save copy failed: StateSaveLocation "
                                          r".*absent is not a directory the bot host sees"):
        copy.run(CopyArguments(path=str(tmp_path / "copy")), context())


def test_reading_scontrol_and_sacctmgr_text() -> None:
    assert settings("Configuration data as of x\nSLURM_VERSION           = 22.05.8\n"
                    "StateSaveLocation       = /var/spool/slurmctld\n") == {
        "SLURM_VERSION": "22.05.8", "StateSaveLocation": "/var/spool/slurmctld"}
    text = ("NodeName=gpu01 Arch=x86_64 State=IDLE ThreadsPerCore=1 Version=22.05.8 "
            "SlurmdStartTime=2026-12-02T07:00:01 LastBusyTime=x\n"
            "NodeName=gpu02 State=IDLE* Version=(null) SlurmdStartTime=None\n")
    assert node_daemons_from(text) == [
        NodeDaemon("gpu01", "22.05.8", "2026-12-02T07:00:01", True),
        NodeDaemon("gpu02", "", "None", False)]


# -- the shipped runbook ---------------------------------------------------------------

SHIPPED = Path(__file__).resolve().parents[2] / "runbooks" / "upgrade-slurm.yaml"


class FakeDump:
    name: ClassVar[str] = "mariadb.dump"
    Arguments: ClassVar[type[StrictArguments]] = DumpArguments

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def plan(self, args: Any) -> list[str]:
        return [f"mariadb-dump {args.database} > {args.path}"]

    def run(self, args: Any, ctx: ActionContext) -> ActionResult:
        self.calls.append("backup")
        return ActionResult(summary="dumped")


def test_the_runbook_runs_the_stages_in_order(tmp_path: Path) -> None:
    from bot.config import Config
    from bot.execution.planning import make_plan
    from bot.runbooks.catalogue import KNOWN, Catalogue
    from bot.runbooks.loading import load_file
    from bot.runbooks.params import Inventory, validate

    (tmp_path / "statesave").mkdir()
    slurm, daemons = cluster(state_save=str(tmp_path / "statesave"), version="22.05.8")
    def sleep(seconds: float) -> None:  # slurmctld sends a held record per poll
        slurm.dbd_records = max(0, slurm.dbd_records - 1)

    actions = [action(cls, slurm, daemons, sleep) for cls in (
        UpgradeCheckAction, DaemonUpgradeAction, StateSaveCopyAction, SlurmdUpgradeAction)]
    catalogue = Catalogue([*actions, FakeDump(daemons.calls)], KNOWN)
    inventory = Inventory(nodes=frozenset(NODES), slurm=frozenset(NODES))
    loaded = load_file(SHIPPED, {k: v[0] for k, v in KNOWN.items()})
    values = validate(loaded.runbook, {"version": "22.05.8", "canary": "gpu02", "max_parallel":
                                       "2", "state_copy": str(tmp_path / "copy")}, inventory)
    plan = make_plan(loaded, values, inventory, catalogue, Config())
    assert [s.id for s in plan.steps] == ["window", "backup", "slurmdbd", "state-save-copy",
                                          "slurmctld", "slurmd"]
    assert {"slurm:upgrade", "service:slurmdbd", "node:gpu02"} <= set(plan.locks)
    assert plan.steps[-1].args["nodes"] == NODES  # default: every Slurm node
    for step in plan.steps:
        found = catalogue.get(step.action)
        found.run(found.Arguments.model_validate(step.args), context())
    assert daemons.calls[:4] == ["backup", "slurmdbd", "slurmctld", "gpu02"]  # the canary
    assert sorted(daemons.calls[4:6]) == ["gpu01", "gpu03"] and daemons.calls[6:] == ["gpu04"]
    assert (tmp_path / "copy").is_dir()
    with pytest.raises(Exception, match=r"does not match"):
        validate(loaded.runbook, {"version": "550.54.15"}, inventory)
