"""upgrade-driver end to end in the lab: Slurm (real Slurm, the fake driver tools through
srun, the soak against the lab's Prometheus and DCGM simulator) on one canary and one more
node: success, a health check failing on the second node (the stop, the nodes done and the
rollback-driver request), a cancel during the soak; Kubernetes (the lab's GPU Operator fake)
with one canary, the rest held back by skip labels: success (a node the site skips kept
so), an upgrade-failed node in the rest, a cancel in the soak. Soaks of seconds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from bot.config import EngineConfig, UserConfig, load_config
from bot.service import Service
from tests.lab.fixture import Lab
from tests.lab.kubehelp import api, nodes, set_driver, settled, wait_until
from tests.runbooks.test_slurm_runbooks import (
    events,
    node,
    reservations,
    resume_everything,
    run,
    wait_for_event,
)

pytestmark = pytest.mark.lab

NEW, NEXT = "550.54.15", "550.90.07"
APPROVERS = ("carol", "dave", "erin")  # a soak of seconds is break-glass: one more approval
CP_PATH = "/apis/nvidia.com/v1/clusterpolicies/cluster-policy"
SKIP, MARK = "nvidia.com/gpu-driver-upgrade.skip", "gpu-runbook-bot/upgrade-skip-set"
STATE = "nvidia.com/gpu-driver-upgrade-state"
DRIVER_LABEL = "lab.gpu-runbook-bot/driver-version"


@pytest.fixture(scope="module")
def bot(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    config = load_config(lab.dir / "bot.yaml")
    config = config.model_copy(update={
        "database_url": f"sqlite:///{tmp_path_factory.mktemp('upgrade') / 'bot.db'}",
        "engine": EngineConfig(lease_seconds=10, poll_seconds=0.1),
        "users": {**config.users, "erin": UserConfig(groups=["gpu-leads"])},
    })
    yield Service.from_config(config)


def upgrade(bot: Service, params: dict[str, str], **options: Any) -> Any:
    return run(bot, "upgrade-driver", {"version": NEW, "soak": "1s", **params},
               approvers=APPROVERS, break_glass=True, **options)


@pytest.fixture
def slurm_nodes(lab: Lab) -> Iterator[Lab]:
    """gpu01 and gpu02 back on the lab's default driver, in service, faults cleared."""
    yield lab
    for name in ("gpu01", "gpu02"):
        lab.lab("fault", name, "clear")
        lab.lab("fault", name, f"driver={lab['default_driver_version']}")
    resume_everything(lab, "gpu01", "gpu02")


def drivers(lab: Lab, *names: str) -> list[str]:
    return [lab.lab("driver", name).stdout.strip() for name in names]


def test_slurm_canary_soak_then_the_rest(slurm_nodes: Lab, bot: Service) -> None:
    lab = slurm_nodes
    ex = upgrade(bot, {"pool": "slurm", "canary": "gpu01", "nodes": "gpu02"})
    assert ex.state == "succeeded", ex.error
    assert drivers(lab, "gpu01", "gpu02") == [NEW, NEW]
    assert [node(lab, n)["state"] for n in ("gpu01", "gpu02")] == ["IDLE", "IDLE"]
    assert "driver-gpu0" not in reservations(lab)
    [finished] = [e["data"] for e in events(bot, ex.id) if e["kind"] == "step_finished"
                  and e["data"]["step"] == "slurm-upgrade"]
    assert finished["details"]["done"] == ["gpu01", "gpu02"]
    assert finished["details"]["previous"] == dict.fromkeys(
        ("gpu01", "gpu02"), lab["default_driver_version"])


def test_slurm_a_failing_node_stops_it_with_the_rollback(slurm_nodes: Lab,
                                                         bot: Service) -> None:
    lab = slurm_nodes
    lab.lab("fault", "gpu02", "health=fail")
    ex = upgrade(bot, {"pool": "slurm", "canary": "gpu01", "nodes": "gpu02"})
    assert ex.state == "failed"
    error = ex.error or ""
    assert "stopped in the rest: gpu02: FAILED: health-check failed" in error
    assert f"Done (on driver {NEW}): gpu01" in error
    assert (f"`runbook run rollback-driver pool=slurm nodes=gpu01 "
            f"version={lab['default_driver_version']}`") in error
    assert "DRAIN" in node(lab, "gpu02")["state"]
    assert node(lab, "gpu01")["state"] == "IDLE"
    assert "driver-gpu02" not in reservations(lab)


def test_slurm_a_cancel_stops_at_the_canary(slurm_nodes: Lab, bot: Service) -> None:
    lab = slurm_nodes

    def cancel_at_the_canary(bot: Service, execution_id: int) -> None:
        wait_until(lambda: "DRAIN" in node(lab, "gpu01")["state"], "the canary's drain",
                   timeout=30, every=0.1)
        bot.cancel(execution_id, "alice")

    ex = upgrade(bot, {"pool": "slurm", "canary": "gpu01", "nodes": "gpu02"},
                 during=cancel_at_the_canary)
    assert ex.state == "cancelled", ex.error
    [failed] = [e["data"] for e in events(bot, ex.id) if e["kind"] == "step_failed"]
    assert "stopped in the canaries: slurm-upgrade: the execution was cancelled" in \
        failed["error"]
    assert "not started: gpu02" in failed["error"]
    assert "DRAIN" in node(lab, "gpu01")["state"]  # its driver is in an unknown state
    assert node(lab, "gpu02")["state"] == "IDLE"
    assert drivers(lab, "gpu02") == [lab["default_driver_version"]]


@pytest.fixture
def pool(lab: Lab) -> Iterator[Lab]:
    """Fast lab upgrades; afterwards the default driver, the upgrade policy as it was, no
    skip label or mark, faults cleared, the pool settled."""
    wait_until(lambda: settled(lab), "the Kubernetes pool to settle", timeout=60)
    code, policy = api(lab, "GET", CP_PATH)
    assert code == 200, policy
    before = policy["spec"]["driver"].get("upgradePolicy") or {}
    set_driver(lab, lab["default_driver_version"], 1, 0.05)
    yield lab
    for name in nodes(lab):
        lab.lab("fault", name, "clear")
    for name, found in nodes(lab).items():
        if {SKIP, MARK} & set(found["metadata"].get("labels", {})):
            api(lab, "PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {
                SKIP: None, MARK: None}}}, ctype="application/merge-patch+json")
    restore = {**before, "drain": before.get("drain"), "maxUnavailable":
               before.get("maxUnavailable")}
    api(lab, "PATCH", CP_PATH, {"spec": {"driver": {"upgradePolicy": restore}}},
        ctype="application/merge-patch+json")
    set_driver(lab, lab["default_driver_version"], 4, 0.05)
    wait_until(lambda: settled(lab) and set(driver_versions(lab).values()) == {
        lab["default_driver_version"]}, "the pool back on the default driver", timeout=90)
    set_driver(lab, lab["default_driver_version"], before.get("maxParallelUpgrades", 1), None)


def driver_versions(lab: Lab) -> dict[str, str]:
    return {name: n["metadata"]["labels"].get(DRIVER_LABEL) for name, n in nodes(lab).items()
            if n["metadata"]["labels"].get("nvidia.com/gpu.present") == "true"}


def upgrade_states(lab: Lab) -> dict[str, tuple[str, str, bool]]:
    """Each GPU node's driver, upgrade state and whether it carries the skip label."""
    return {name: (labels.get(DRIVER_LABEL), labels.get(STATE), labels.get(SKIP) == "true")
            for name, n in nodes(lab).items()
            if (labels := n["metadata"]["labels"]).get("nvidia.com/gpu.present") == "true"}


def site_skip(lab: Lab, name: str) -> None:
    code, body = api(lab, "PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {
        SKIP: "true"}}}, ctype="application/merge-patch+json")
    assert code == 200, body


def test_kubernetes_canary_held_rest_then_an_upgrade_failed_stop(
        pool: Lab, bot: Service) -> None:
    lab, old = pool, pool["default_driver_version"]
    site_skip(lab, "gpu08")  # the site holds gpu08 back on purpose: it stays so
    seen: list[dict[str, tuple[str, str, bool]]] = []

    def watch(bot: Service, execution_id: int) -> None:  # the canary leads the others
        while bot.get(execution_id).state not in ("succeeded", "failed", "cancelled"):
            seen.append(upgrade_states(lab))
            time.sleep(0.1)

    ex = upgrade(bot, {"pool": "kubernetes", "canary": "gpu06", "max_parallel": "4"},
                 during=watch)
    assert ex.state == "succeeded", ex.error
    assert driver_versions(lab) == {**dict.fromkeys(driver_versions(lab), NEW), "gpu08": old}
    held = [v for v in seen if v["gpu06"][:2] == (NEW, "upgrade-done")
            and all(s == (old, "upgrade-required", True) for n, s in v.items() if n != "gpu06")]
    assert held, "the soak: the canary on the new driver, the others held on the old one"
    assert not any(v["gpu06"][0] != NEW and NEW in {s[0] for s in v.values()} for v in seen)
    labels = {n: x["metadata"]["labels"] for n, x in nodes(lab).items()}
    assert [n for n, x in labels.items() if SKIP in x or MARK in x] == ["gpu08"]
    assert MARK not in labels["gpu08"]  # the site's label: kept, never the bot's
    policy = api(lab, "GET", CP_PATH)[1]["spec"]["driver"]
    assert policy["version"] == NEW
    assert policy["upgradePolicy"]["maxParallelUpgrades"] == 4
    assert policy["upgradePolicy"]["drain"]["enable"] is True

    # The next driver, and gpu07's upgrade fails: a stop in the rest, the canary done.
    lab.lab("fault", "gpu07", "upgrade=fail")
    ex = upgrade(bot, {"pool": "kubernetes", "canary": "gpu06", "max_parallel": "4",
                       "version": NEXT})
    assert ex.state == "failed"
    error = ex.error or ""
    assert "gpu07 reports nvidia.com/gpu-driver-upgrade-state=upgrade-failed" in error
    assert "gpu06" in error.split(f"Done (on driver {NEXT}):")[1]
    assert "runbook run rollback-driver pool=kubernetes" in error
    assert driver_versions(lab)["gpu07"] == NEW
    assert not any(MARK in x["metadata"]["labels"] for x in nodes(lab).values())


def test_kubernetes_a_cancel_in_the_soak_leaves_the_rest_held(pool: Lab, bot: Service) -> None:
    lab, old = pool, pool["default_driver_version"]

    def cancel_in_the_soak(bot: Service, execution_id: int) -> None:
        wait_for_event(bot, execution_id, "step_started", "k8s-soak", seconds=30)
        bot.cancel(execution_id, "alice")

    ex = upgrade(bot, {"pool": "kubernetes", "canary": "gpu06", "soak": "30s"},
                 during=cancel_in_the_soak)
    assert ex.state == "cancelled", ex.error
    [failed] = [e["data"] for e in events(bot, ex.id) if e["kind"] == "step_failed"]
    assert failed["step"] == "k8s-soak"
    assert "The rest was not started" in failed["error"]
    assert "runbook run rollback-driver pool=kubernetes, then kubectl label nodes -l " \
        f"{MARK}=true {SKIP}- {MARK}-" in failed["error"]
    states = upgrade_states(lab)
    assert states.pop("gpu06")[0] == NEW
    assert set(states.values()) == {(old, "upgrade-required", True)}  # held: fail safe
