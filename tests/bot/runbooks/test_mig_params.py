"""The ``mig_layout`` parameter type (a layout the configuration lists, refused otherwise with
the allowed ones and a suggestion for a typo), the configuration's ``mig.layouts`` reaching the
inventory and the templates, and the plan of the shipped mig-reconfigure runbook (the label
command, the expected resources per GPU rendered from the configuration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.actions import Action
from adapters.kubernetes.actions import KubernetesActions
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.fake import FakeKubernetes
from adapters.kubernetes.gpu_gate import GpuGateAction
from adapters.prometheus.fake import FakePrometheus
from adapters.slurm.config import SlurmConfig
from adapters.slurm.fake import FakeSlurm
from adapters.slurm.mig import CheckGresAction, MigApplyAction
from bot.config import Config
from bot.execution.assembly import assemble
from bot.execution.planning import make_plan
from bot.runbooks.catalogue import KNOWN, Catalogue
from bot.runbooks.inventory import InventorySources, build
from bot.runbooks.loading import load_file
from bot.runbooks.model import Runbook
from bot.runbooks.params import Inventory, ParamError, validate
from bot.store import db

LAYOUTS = {"all-disabled": {}, "all-3g.40gb": {"3g.40gb": 2}, "all-1g.10gb": {"1g.10gb": 7}}
INVENTORY = Inventory(nodes=frozenset({"gpu03", "gpu06"}), slurm=frozenset({"gpu03"}),
                      kubernetes=frozenset({"gpu06"}), mig_layouts=LAYOUTS)
SHIPPED = Path(__file__).resolve().parents[3] / "runbooks" / "mig-reconfigure.yaml"


def runbook() -> Runbook:
    return Runbook.model_validate({
        "name": "mig", "version": "1.0.0", "summary": "s", "risk": "low",
        "params": {"layout": {"type": "mig_layout", "required": True}},
        "steps": [{"id": "a", "action": "chat.notify", "with": {"message": "x"}}]})


def test_a_listed_layout_is_accepted() -> None:
    assert validate(runbook(), {"layout": "all-3g.40gb"}, INVENTORY) == {"layout": "all-3g.40gb"}


def test_a_typo_is_refused_with_a_suggestion_and_the_allowed_layouts() -> None:
    with pytest.raises(ParamError) as caught:
        validate(runbook(), {"layout": "all-3g.40g"}, INVENTORY)
    assert caught.value.problems == [
        'layout: "all-3g.40g" is not a configured MIG layout (did you mean "all-3g.40gb"?); '
        "allowed: all-1g.10gb, all-3g.40gb, all-disabled"]


@pytest.mark.parametrize("value", ["all-7g.80gb", "ALL-3G.40GB", "all-3g.40gb; reboot", ""])
def test_an_unlisted_layout_is_refused(value: str) -> None:
    with pytest.raises(ParamError, match=r"not a configured MIG layout.*allowed: all-1g.10gb, "
                                         r"all-3g.40gb, all-disabled"):
        validate(runbook(), {"layout": value}, INVENTORY)


def test_without_configured_layouts_every_layout_is_refused() -> None:
    with pytest.raises(ParamError, match=r"the configuration lists none: mig.layouts"):
        validate(runbook(), {"layout": "all-disabled"}, Inventory())


def test_the_configuration_reaches_the_inventory_and_the_templates(tmp_path: Path) -> None:
    config = Config.model_validate({"mig": {"layouts": LAYOUTS}, "inventory": {
        "nodes": ["gpu03"], "discover": False}})
    inventory = assemble(config, db.connect(f"sqlite:///{tmp_path}/bot.db")).inventory
    assert inventory.mig_layouts == LAYOUTS
    assert inventory.facts()["mig_layouts"]["all-1g.10gb"] == {"1g.10gb": 7}
    assert build(Config().inventory, InventorySources()).mig_layouts == {}


def catalogue() -> Catalogue:
    slurm = SlurmConfig.model_validate({"commands": {
        "mig-apply": {"argv": ["nvidia-mig-parted", "apply", "-f", "/etc/mig.yaml", "-c"],
                      "accepts_args": True},
        "gpu-count": {"argv": ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"]}}})
    backend = FakeSlurm(["gpu03"])
    kube = FakeKubernetes(["gpu06"])
    return Catalogue([*KubernetesActions(kube).all(),
                      GpuGateAction(kube, KubernetesConfig(), prometheus=FakePrometheus([])),
                      MigApplyAction(backend, slurm),
                      CheckGresAction(backend, slurm, prometheus=FakePrometheus([])),
                      *_slurm_basics(backend, slurm)], KNOWN)


def _slurm_basics(backend: FakeSlurm, config: SlurmConfig) -> list[Action]:
    from adapters.host import HostCommand, HostRunAction
    from adapters.slurm.actions import SlurmActions

    return [*SlurmActions(backend, config).all(),
            HostRunAction({"mig-reload": HostCommand(argv=["lab", "mig-reload"],
                                                     accepts_args=True)})]


def test_the_plan_shows_the_label_and_the_resources_from_the_configuration() -> None:
    loaded = load_file(SHIPPED, {k: v[0] for k, v in KNOWN.items()})
    config = Config.model_validate({"mig": {"layouts": LAYOUTS}})
    values = validate(loaded.runbook, {"node": "gpu06", "layout": "all-3g.40gb"}, INVENTORY)
    plan = make_plan(loaded, values, INVENTORY, catalogue(), config)
    steps = {s.id: s for s in plan.steps}
    assert steps["k8s-label"].operations == [
        "kubectl label node gpu06 nvidia.com/mig.config=all-3g.40gb --overwrite"]
    assert steps["k8s-resources"].args["per_gpu"] == {"3g.40gb": 2}
    assert "nvidia.com/mig-3g.40gb=2 per GPU and no nvidia.com/gpu" in \
        steps["k8s-resources"].operations[0]
    assert steps["slurm-apply"].skipped and not steps["k8s-drain"].skipped
    slurm = make_plan(loaded, validate(loaded.runbook, {"node": "gpu03", "layout":
                                                        "all-disabled"}, INVENTORY),
                      INVENTORY, catalogue(), config)
    ops = {s.id: s.operations for s in slurm.steps}
    assert ops["slurm-apply"][1].endswith(
        "-- nvidia-mig-parted apply -f /etc/mig.yaml -c all-disabled")
    assert "Gres must be one GPU type, no MIG profile, 1 per GPU" in ops["slurm-check"][1]
    assert ops["slurm-check"][2].startswith("then DCGM in Prometheus: the GPUs counted of gpu03 "
                                            "report")
    assert ops["slurm-publish"] == ["run on the bot host: lab mig-reload gpu03"]
