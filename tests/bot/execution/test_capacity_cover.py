"""The capacity guard cannot be forgotten: every shipped runbook step whose action takes GPUs
out of service (actions declare it with ``takes_out``) is covered by a capacity pre-check
over its very nodes, in every pool and branch the runbook has; a site runbook without one
is refused when it loads; a guard that a ``when:`` skips while its step runs, or that counts
other nodes, is refused when the plan is made."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from adapters.actions import ActionContext, ActionError, ActionResult, StrictArguments
from bot.config import Config
from bot.execution.capacity_guard import batch_guard
from bot.execution.checks.core import Outcome
from bot.execution.planning import PlanError, make_plan
from bot.runbooks import params
from bot.runbooks.catalogue import KNOWN, TAKES_OUT, Catalogue
from bot.runbooks.inventory import PoolInventory
from bot.runbooks.loading import RunbookError, load_file, load_text

RUNBOOKS = Path(__file__).resolve().parents[3] / "runbooks"
ARGUMENTS = {name: known[0] for name, known in KNOWN.items()}
SLURM = frozenset({"gpu01", "gpu02", "gpu03", "gpu04"})
K8S = frozenset({"gpu04", "gpu05", "gpu06"})
INVENTORY = PoolInventory(nodes=SLURM | K8S, slurm=SLURM, kubernetes=K8S,
                          names={"kubernetes": {"gpu05": "k8s-gpu05"}},
                          mig_layouts={"all-3g.40gb": {"3g.40gb": 2}})

# Every shipped runbook with a step that takes GPUs out, with a request for each of its
# branches (Slurm, Kubernetes, both; the pools of handoff-node and the drivers).
REQUESTS: dict[str, list[dict[str, str]]] = {
    "close-window": [{"window": "3", "nodes": "gpu[03-04]", "slurm_nodes": "gpu[03-04]",
                      "faulty": "gpu03", "faulty_slurm": "gpu03"}],  # keeps a faulty node out
    "drain-node": [{"node": n, "reason": "XID 79"} for n in ("gpu02", "gpu04", "gpu05")],
    "drain-nodes": [{"nodes": "gpu[01-06]", "reason": "row 4"}],
    "handoff-node": [{"node": "gpu04", "to": "kubernetes"}, {"node": "gpu04", "to": "slurm"}],
    "mig-reconfigure": [{"node": n, "layout": "all-3g.40gb"} for n in ("gpu02", "gpu04",
                                                                        "gpu05")],
    "open-maintenance": [{"name": "rack12", "nodes": "gpu[01-03]"}],
    "nccl-test": [{"nodes": "gpu[01-02]"}, {"nodes": "gpu04"}],
    "quarantine-node": [{"node": n, "reason": "XID 79"} for n in ("gpu02", "gpu04", "gpu05")],
    "open-window": [{"window": "3", "nodes": "gpu[03-05]", "duration": "4h",
                     "slurm_nodes": "gpu[03-04]", "k8s_nodes": "gpu04,k8s-gpu05",
                     "alert_nodes": "gpu03,gpu04,gpu05"}],
    "reset-gpu": [{"node": "gpu02", "gpu": "3", "reason": "XID 48"},
                  {"node": "gpu04", "gpu": "3", "reason": "XID 48"},
                  {"node": "gpu05", "gpu": "3", "reason": "XID 48", "method": "reboot"}],
    "resume-node": [{"node": n} for n in ("gpu02", "gpu04")],  # Kubernetes alone: uncordon
    "rollback-driver": [{"pool": "slurm", "nodes": "gpu[01-03]", "version": "535.161.08"},
                        {"pool": "kubernetes", "version": "535.161.08"}],
    "swap-gpu": [{"node": n, "gpu": "1", "reason": "XID 79"} for n in ("gpu02", "gpu04",
                                                                         "gpu05")],
    "upgrade-driver": [{"pool": "slurm", "version": "550.54.15", "canary": "gpu01",
                        "nodes": "gpu[02-03]"},
                       {"pool": "slurm", "version": "550.54.15", "canary": "gpu[01-02]"},
                       {"pool": "kubernetes", "version": "550.54.15", "canary": "gpu05"}],
}


class _Stub:
    """An action with a real action's name, arguments and ``takes_out``, that plans
    nothing: planning then checks the arguments and the guard's cover as it does live."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.Arguments = ARGUMENTS[name]
        self.takes_out = TAKES_OUT.get(name, ())

    def plan(self, args: Any) -> list[str]:
        return []

    def run(self, args: Any, ctx: ActionContext) -> ActionResult:
        raise AssertionError("never run")


CATALOGUE = Catalogue([_Stub(name) for name in KNOWN], KNOWN)  # type: ignore[misc]


def plan(text: str, raw: dict[str, str], name: str = "site.yaml") -> Any:
    loaded = load_text(text, Path(name), ARGUMENTS)
    values = params.validate(loaded.runbook, raw, INVENTORY)
    return make_plan(loaded, values, INVENTORY, CATALOGUE, Config())


def shipped(name: str) -> str:
    return (RUNBOOKS / f"{name}.yaml").read_text()


def test_every_shipped_runbook_that_takes_gpus_out_is_listed_here() -> None:
    taking = {path.stem for path in RUNBOOKS.glob("*.yaml")
              if any(step.action in TAKES_OUT
                     for step in load_file(path, ARGUMENTS).runbook.steps)}
    assert taking == set(REQUESTS)


@pytest.mark.parametrize("name,raw", [(name, raw) for name, asks in REQUESTS.items()
                                      for raw in asks])
def test_every_step_that_takes_gpus_out_is_under_a_guard_over_its_nodes(
        name: str, raw: dict[str, str]) -> None:
    made = plan(shipped(name), raw, f"{name}.yaml")
    taking = [s for s in made.steps if not s.skipped and TAKES_OUT.get(s.action)]
    guards = [c for c in made.pre_checks if c.kind == "capacity" and not c.skipped]
    assert taking and guards  # every branch listed takes something, under a guard


def test_the_declarations_cover_every_kind_of_taking_out() -> None:
    for name in ("slurm.drain", "slurm.drain_batches", "slurm.reservation_create",
                 "slurm.reboot", "slurm.driver_rollout", "slurm.driver_upgrade",
                 "slurm.mig_apply", "slurm.gpu_reset", "k8s.cordon", "k8s.cordon_nodes",
                 "k8s.drain", "k8s.drain_nodes", "k8s.request_reboot",
                 "gpu_operator.set_driver_version", "gpu_operator.set_mig_layout"):
        assert TAKES_OUT.get(name), f"{name} does not declare the nodes it takes out"
    for name in ("slurm.resume", "k8s.uncordon", "slurm.reservation_delete",
                 "slurm.wait_idle", "chat.notify"):
        assert name not in TAKES_OUT


def _without_capacity(text: str) -> str:
    data = yaml.safe_load(text)
    data["pre_checks"] = [c for c in data.get("pre_checks", []) if "capacity" not in c]
    return yaml.safe_dump(data, sort_keys=False)


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_a_runbook_without_its_guard_is_refused_when_it_loads(name: str) -> None:
    with pytest.raises(RunbookError, match=r"takes GPUs out of service: add a capacity "
                                           r"pre-check"):
        load_text(_without_capacity(shipped(name)), Path(f"{name}.yaml"), ARGUMENTS)


def test_a_guard_skipped_while_its_step_runs_is_refused_at_plan() -> None:
    data = yaml.safe_load(shipped("rollback-driver"))
    for check in data["pre_checks"]:  # both guards now ask for the other pool
        check["when"] = ("{{ pool == 'kubernetes' }}" if "slurm" in check["when"]
                         else "{{ pool == 'slurm' }}")
    text = yaml.safe_dump(data, sort_keys=False)
    with pytest.raises(PlanError, match=r"step rollout \(slurm.driver_rollout\) takes "
                                        r"gpu\[01-03\] out of service and no capacity "
                                        r"pre-check of this plan counts them"):
        plan(text, {"pool": "slurm", "nodes": "gpu[01-03]", "version": "535.161.08"})
    with pytest.raises(PlanError, match=r"step set-version \(gpu_operator.set_driver_version"
                                        r"\) takes nodes of a whole pool out of service"):
        plan(text, {"pool": "kubernetes", "version": "535.161.08"})


def test_a_guard_over_other_nodes_is_refused_at_plan() -> None:
    text = shipped("upgrade-driver").replace(
        """pool_of: "{{ canary }}{{ ',' ~ nodes if nodes else '' }}\"""",
        'pool_of: "{{ canary }}"')
    with pytest.raises(PlanError, match=r"takes gpu\[02-03\] out of service and no capacity"):
        plan(text, {"pool": "slurm", "version": "550.54.15", "canary": "gpu01",
                    "nodes": "gpu[02-03]"})


def test_a_node_named_in_another_system_is_matched_to_the_bot_name() -> None:
    # open-window cordons k8s-gpu05, the Kubernetes name of gpu05: covered by nodes=gpu05
    made = plan(shipped("open-window"), REQUESTS["open-window"][0])
    assert not next(s for s in made.steps if s.id == "cordon").skipped
    raw = {**REQUESTS["open-window"][0], "nodes": "gpu[03-04]"}
    with pytest.raises(PlanError, match=r"step cordon \(k8s.cordon_nodes\) takes gpu05 out"):
        plan(shipped("open-window"), raw)


class _TakesAll(StrictArguments):
    nodes: str


class _Taker:
    name: ClassVar[str] = "site.take"
    Arguments: ClassVar[type[StrictArguments]] = _TakesAll
    takes_out: ClassVar[tuple[str, ...]] = ("nodes",)


def test_a_configured_action_declaring_takes_out_is_held_to_it_at_plan() -> None:
    catalogue = Catalogue([_Taker()], KNOWN)  # type: ignore[list-item]
    assert catalogue.takes_out("site.take") == ("nodes",)
    assert catalogue.takes_out("slurm.drain") == ("nodes",)
    assert catalogue.takes_out("slurm.resume") == ()


def test_the_batch_guard_lets_break_glass_lower_the_runbook_floor_never_the_site_one() -> None:
    made = plan(shipped("rollback-driver"), REQUESTS["rollback-driver"][0])
    asked: list[Any] = []

    def evaluate(below_site: bool) -> Any:
        def outcome(check: Any) -> Outcome:
            asked.append(check.spec["capacity"])
            return Outcome(False, 4, "Slurm pool: 12 free GPUs now, 4 after taking gpu02 out",
                           {"below_site_floor": below_site})
        return outcome

    guard = batch_guard(made, evaluate(False))
    assert guard is not None
    with pytest.raises(ActionError, match=r"capacity guard before taking gpu02 out: .*4 after "
                                          r"taking gpu02 out; gpu02 was not touched"):
        guard(["gpu02"])
    assert asked[-1] == {"pool_of": "gpu02", "min_free_gpus_after": 8}  # the batch alone
    glass = dataclasses.replace(made, break_glass=True)
    overriding, strict = batch_guard(glass, evaluate(False)), batch_guard(glass, evaluate(True))
    assert overriding is not None and strict is not None
    assert "overridden by break-glass" in overriding(["gpu02"])
    with pytest.raises(ActionError, match="capacity guard before taking gpu02 out"):
        strict(["gpu02"])
    unguarded = dataclasses.replace(made, pre_checks=[])
    assert batch_guard(unguarded, evaluate(False)) is None
