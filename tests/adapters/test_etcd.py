"""Tests of the etcd adapter: plan text and argument checks (fast, no etcd), and the
actions against the lab's real etcd (3.4 here, ``lab`` marker).

The lab tests cover health, key counts, snapshot save and status, a full restore cycle
(save, change keys, restore into a new data directory, ``lab etcd-switch`` to it: the
seed keys are back and the later changes gone), the refusals that keep a restore from
overwriting anything, and the errors when etcd is stopped. The module puts the lab's
etcd back on its original data directory, running and seeded, when it ends.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adapters.actions import ActionContext, ActionError, ActionResult
from adapters.etcd.actions import ACTION_CLASSES, EtcdActions
from adapters.etcd.backend import EtcdCommands, EtcdctlBackend
from adapters.etcd.config import EtcdConfig
from adapters.etcd.fake import FakeEtcd as FakeBackend
from tests.lab.fixture import Lab

PEER = "http://10.0.0.1:2380"
MEMBER = dict(name="etcd1", initial_cluster=f"etcd1={PEER}", initial_advertise_peer_urls=PEER)


def ctx(seconds: float = 60) -> ActionContext:
    return ActionContext(execution_id=1, step_id="test", deadline=time.monotonic() + seconds)


def plan(config: EtcdConfig, name: str, **arguments: Any) -> list[str]:
    action = EtcdActions(config).by_name()[name]
    return action.plan(action.Arguments(**arguments))


# --- plan text and arguments (no etcd needed) ---------------------------------------

def test_snapshot_save_plan_is_the_etcdctl_line() -> None:
    config = EtcdConfig(endpoints=["https://10.0.0.1:2379"], backup_dir="/backup")
    assert plan(config, "etcd.snapshot_save", path="/backup/etcd-1.db") == [
        "ETCDCTL_API=3 etcdctl --endpoints=https://10.0.0.1:2379 snapshot save /backup/etcd-1.db"]


def test_snapshot_save_plan_names_the_candidates_of_a_cluster() -> None:
    config = EtcdConfig(endpoints=["https://a:2379", "https://b:2379"],
                        cacert="/etc/etcd/ca.crt", cert="/etc/etcd/c.crt", key="/etc/etcd/c.key",
                        dial_timeout=1, command_timeout=3, backup_dir="/backup")
    (line,) = plan(config, "etcd.snapshot_save", path="/backup/x.db")
    assert line == ("ETCDCTL_API=3 etcdctl --endpoints=https://a:2379 --cacert=/etc/etcd/ca.crt "
                    "--cert=/etc/etcd/c.crt --key=/etc/etcd/c.key --dial-timeout=1s "
                    "--command-timeout=3s snapshot save /backup/x.db"
                    "  # from the first healthy of https://a:2379, https://b:2379")


def test_restore_plan_passes_the_member_with_etcdctl() -> None:
    config = EtcdConfig(endpoints=["http://10.0.0.1:2379"], etcdutl=None, **MEMBER)
    assert plan(config, "etcd.snapshot_restore", snapshot="/backup/a b.db",
                data_dir="/var/lib/etcd-restored") == [
        "ETCDCTL_API=3 etcdctl snapshot restore '/backup/a b.db' --data-dir "
        "/var/lib/etcd-restored --name etcd1 --initial-cluster etcd1=http://10.0.0.1:2380 "
        "--initial-advertise-peer-urls http://10.0.0.1:2380"]


def test_restore_plan_uses_etcdutl_when_it_is_installed(tmp_path: Path) -> None:
    etcdutl = tmp_path / "etcdutl"
    etcdutl.write_text("#!/bin/sh\n")
    etcdutl.chmod(etcdutl.stat().st_mode | stat.S_IXUSR)
    config = EtcdConfig(endpoints=["http://10.0.0.1:2379"], etcdutl=str(etcdutl),
                        initial_cluster_token="tok", **MEMBER)
    (line,) = plan(config, "etcd.snapshot_restore", snapshot="/b/s.db", data_dir="/d")
    assert line.startswith(f"{etcdutl} snapshot restore /b/s.db --data-dir /d --name etcd1 ")
    assert line.endswith("--initial-cluster-token tok")
    (status,) = plan(config, "etcd.snapshot_status", path="/b/s.db")
    assert status == f"{etcdutl} snapshot status /b/s.db -w json"


def test_restore_plan_says_which_member_settings_are_missing() -> None:
    config = EtcdConfig(endpoints=["http://10.0.0.1:2379"], name="etcd1")
    with pytest.raises(ActionError, match=r"etcd\.initial_cluster, etcd\.initial_advertise_peer"):
        plan(config, "etcd.snapshot_restore", snapshot="/b/s.db", data_dir="/d")


def test_read_plans() -> None:
    config = EtcdConfig(endpoints=["http://e:2379"])
    assert plan(config, "etcd.health", wait=30) == [
        "ETCDCTL_API=3 etcdctl --endpoints=http://e:2379 endpoint health -w json"
        "  # until every endpoint is healthy, at most 30s"]
    assert plan(config, "etcd.key_count", prefix="/registry/") == [
        "ETCDCTL_API=3 etcdctl --endpoints=http://e:2379 get --prefix --keys-only --limit=1 "
        "-w json /registry/"]
    assert plan(config, "etcd.keys_present", keys=["/a", "-odd"], values={"/b": "x"}) == [
        "ETCDCTL_API=3 etcdctl --endpoints=http://e:2379 get -w json /a",
        "ETCDCTL_API=3 etcdctl --endpoints=http://e:2379 get -w json -- -odd",
        "ETCDCTL_API=3 etcdctl --endpoints=http://e:2379 get -w json /b"]


@pytest.mark.parametrize(("name", "arguments", "error"), [
    ("etcd.snapshot_save", {"path": "relative.db"}, "absolute path"),
    ("etcd.snapshot_save", {"path": "/x.db", "force": True}, "Extra inputs"),
    ("etcd.snapshot_restore", {"snapshot": "/s.db", "data_dir": "d"}, "absolute path"),
    ("etcd.keys_present", {"keys": []}, "at least 1"),
    ("etcd.keys_present", {"keys": ["/a\nb"]}, "one line"),
    ("etcd.key_count", {"at_least": -1}, "greater than or equal"),
])
def test_arguments_are_checked(name: str, arguments: dict[str, Any], error: str) -> None:
    action = EtcdActions(EtcdConfig(endpoints=["http://e:2379"])).by_name()[name]
    with pytest.raises(ValueError, match=error):
        action.Arguments(**arguments)


@pytest.mark.parametrize(("fields", "error"), [
    ({"endpoints": []}, "at least 1"),
    ({"endpoints": ["10.0.0.1:2379"]}, "not a URL"),
    ({"endpoints": ["http://e:2379"], "name": "etcd2", "initial_cluster": f"etcd1={PEER}"},
     "names no member 'etcd2'"),
    ({"endpoints": ["http://e:2379"], **MEMBER, "initial_advertise_peer_urls": "http://x:2380"},
     "differ from the URLs"),
    ({"endpoints": ["http://e:2379"], "initial_cluster": "etcd1"}, "NAME=PEER_URL"),
    ({"endpoints": ["http://e:2379"], "etcdctl_path": "x"}, "Extra inputs"),
])
def test_config_is_checked(fields: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        EtcdConfig(**fields)


def test_child_environment_drops_operator_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # They would clash with our flags (etcdctl exits), or act unseen in the plan; etcd
    # credentials come from etcd.user/etcd.password_env (tests/adapters/test_environment.py).
    monkeypatch.setenv("ETCDCTL_ENDPOINTS", "http://elsewhere:2379")
    monkeypatch.setenv("ETCDCTL_WRITE_OUT", "table")
    monkeypatch.setenv("ETCDCTL_USER", "root")
    monkeypatch.setenv("ETCDCTL_API", "2")
    commands = EtcdCommands(EtcdConfig(endpoints=["http://e:2379"]))
    env = commands.env(commands.health())
    assert [name for name in env if name.startswith("ETCD")] == ["ETCDCTL_API"]
    assert env["ETCDCTL_API"] == "3"


def test_action_names() -> None:
    assert [cls.name for cls in ACTION_CLASSES] == [
        "etcd.snapshot_save", "etcd.snapshot_status", "etcd.snapshot_restore", "etcd.health",
        "etcd.key_count", "etcd.keys_present"]


def fake_action(backend: FakeBackend, name: str, **arguments: Any) -> ActionResult:
    sleeps: list[float] = []
    action = EtcdActions(EtcdConfig(endpoints=["http://e:2379"]), backend,
                         sleep=sleeps.append).by_name()[name]
    return action.run(action.Arguments(**arguments), ctx())


def test_keys_present_names_missing_keys_and_wrong_values() -> None:
    backend = FakeBackend({"/a": "1", "/b": "2"})
    with pytest.raises(ActionError, match=r"missing /c; unexpected values for /b \('2', "
                                          r"expected '3'\)"):
        fake_action(backend, "etcd.keys_present", keys=["/a", "/c"], values={"/b": "3"})
    result = fake_action(backend, "etcd.keys_present", keys=["/a"], values={"/b": "2"})
    assert result.changed is False and result.details["present"] == ["/a", "/b"]


def test_health_waits_until_healthy_and_fails_with_the_reason() -> None:
    backend = FakeBackend({}, sick_polls=3)
    assert fake_action(backend, "etcd.health", wait=10).changed is False
    assert backend.polls == 4
    with pytest.raises(ActionError, match=r"1 of 1 endpoint.*context deadline exceeded"):
        fake_action(FakeBackend({}, sick_polls=1), "etcd.health")


def test_key_count_at_least() -> None:
    backend = FakeBackend({"/r/a": "1", "/r/b": "2", "/s": "3"})
    assert fake_action(backend, "etcd.key_count", prefix="/r/").details["count"] == 2
    with pytest.raises(ActionError, match="2 keys under '/r/', expected at least 3"):
        fake_action(backend, "etcd.key_count", prefix="/r/", at_least=3)


# --- against the lab's real etcd ---------------------------------------------------------

@dataclass
class EtcdLab:
    lab: Lab
    config: EtcdConfig
    seed: dict[str, str]
    original_data_dir: str

    def actions(self, **overrides: Any) -> dict[str, Any]:
        config = self.config.model_copy(update=overrides) if overrides else self.config
        return dict(EtcdActions(config).by_name())

    def run(self, name: str, **arguments: Any) -> ActionResult:
        action = self.actions()[name]
        result: ActionResult = action.run(action.Arguments(**arguments), ctx())
        return result

    def etcdctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in self.lab.env.items() if not k.startswith("ETCDCTL_")}
        return subprocess.run(["etcdctl", f"--endpoints={self.config.endpoints[0]}", *args],
                              env={**env, "ETCDCTL_API": "3"}, capture_output=True, text=True,
                              timeout=30, check=False)

    def new_dir(self) -> Path:
        return self.lab.dir / "etcd" / f"test-{uuid.uuid4().hex[:8]}"

    def switch(self, path: Path | str) -> float:
        began = time.monotonic()
        result = self.lab.lab("etcd-switch", str(path), timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        return time.monotonic() - began


@pytest.fixture(scope="module")
def etcd(lab: Lab) -> Iterator[EtcdLab]:
    lab.reload()
    info = lab.info.get("etcd")
    if not info:
        pytest.fail("lab.json has no etcd section: run `lab up` with this checkout", pytrace=False)
    config = EtcdConfig(endpoints=[info["endpoint"]], name=info["name"],
                        initial_cluster=info["initial_cluster"],
                        initial_advertise_peer_urls=info["peer_url"],
                        backup_dir="/tmp")  # the tests' snapshots: in pytest's folders
    handle = EtcdLab(lab, config, dict(info["seed_keys"]), info["data_dir"])
    yield handle
    # Leave the lab's etcd as the module found it: original directory, running, seeded.
    lab.reload()
    if lab.info["etcd"]["data_dir"] != handle.original_data_dir:
        lab.lab("etcd-switch", handle.original_data_dir, timeout=120)
    lab.lab("service", "etcd", "start", timeout=120)
    for key, value in handle.seed.items():
        if handle.etcdctl("get", "--print-value-only", key).stdout.strip() != value:
            handle.etcdctl("put", key, value)
    handle.etcdctl("del", "--prefix", "/registry/grblab/later-")  # a failed test's leftovers
    handle.etcdctl("del", "/registry/grblab/between")
    for leftover in (lab.dir / "etcd").glob("test-*"):
        shutil.rmtree(leftover, ignore_errors=True)


@pytest.mark.lab
def test_lab_member_is_healthy_and_in_lab_tools(etcd: EtcdLab) -> None:
    result = etcd.run("etcd.health")
    assert result.changed is False
    assert result.details["endpoints"] == {
        etcd.config.endpoints[0]: {"healthy": True, "error": None,
                                   "took": result.details["endpoints"][etcd.config.endpoints[0]]
                                   ["took"]}}
    env = etcd.lab.lab("env").stdout
    assert "export ETCDCTL_API=3" in env
    assert f"export ETCDCTL_ENDPOINTS={etcd.config.endpoints[0]}" in env
    status = etcd.lab.lab("status").stdout
    assert any(line.split()[:2] == ["etcd", "running"] for line in status.splitlines()), status


@pytest.mark.lab
def test_operator_etcdctl_settings_do_not_break_the_tools(
        etcd: EtcdLab, monkeypatch: pytest.MonkeyPatch) -> None:
    # etcdctl 3.4 exits when ETCDCTL_ENDPOINTS and --endpoints are both given.
    monkeypatch.setenv("ETCDCTL_ENDPOINTS", "http://127.0.0.1:1")
    assert EtcdctlBackend(etcd.config).health()[etcd.config.endpoints[0]].healthy


@pytest.mark.lab
def test_key_count_and_get(etcd: EtcdLab) -> None:
    prefix = "/registry/grblab/config/"
    result = etcd.run("etcd.key_count", prefix=prefix, at_least=len(etcd.seed))
    assert result.details == {"prefix": prefix, "count": len(etcd.seed)}
    assert etcd.run("etcd.key_count").details["count"] >= len(etcd.seed)
    assert etcd.run("etcd.key_count", prefix="/no/such/prefix/").details["count"] == 0
    backend = EtcdctlBackend(etcd.config)
    key, value = next(iter(etcd.seed.items()))
    assert backend.get(key) == value
    assert backend.get("/no/such/key") is None
    etcd.run("etcd.keys_present", keys=list(etcd.seed), values=etcd.seed)


@pytest.mark.lab
def test_snapshot_save_and_status(etcd: EtcdLab, tmp_path: Path) -> None:
    path = tmp_path / "snaps" / "one.db"
    saved = etcd.run("etcd.snapshot_save", path=str(path))
    assert saved.changed is True and path.is_file()
    assert not list(path.parent.glob("*.partial*"))
    assert saved.details["endpoint"] == etcd.config.endpoints[0]
    assert saved.details["total_keys"] >= len(etcd.seed) and saved.details["revision"] > 0
    status = etcd.run("etcd.snapshot_status", path=str(path))
    assert status.changed is False
    assert status.details == {k: saved.details[k] for k in status.details}
    again = etcd.run("etcd.snapshot_save", path=str(path))
    assert "replaced an older file" in again.summary


@pytest.mark.lab
def test_restore_cycle_brings_the_seed_keys_back(etcd: EtcdLab, tmp_path: Path,
                                                  record_property: Any) -> None:
    snapshot = tmp_path / "before.db"
    began = time.monotonic()
    etcd.run("etcd.snapshot_save", path=str(snapshot))
    saved_in = time.monotonic() - began
    first_key, second_key = list(etcd.seed)[:2]
    later = f"/registry/grblab/later-{uuid.uuid4().hex[:8]}"
    assert etcd.etcdctl("put", later, "x").returncode == 0
    assert etcd.etcdctl("del", first_key).returncode == 0
    assert etcd.etcdctl("put", second_key, "changed").returncode == 0
    with pytest.raises(ActionError, match=f"missing {first_key}"):
        etcd.run("etcd.keys_present", keys=list(etcd.seed), values=etcd.seed)

    data_dir = etcd.new_dir()
    began = time.monotonic()
    restored = etcd.run("etcd.snapshot_restore", snapshot=str(snapshot), data_dir=str(data_dir))
    restored_in = time.monotonic() - began
    switched_in = etcd.switch(data_dir)  # stop, point at data_dir, start, wait healthy
    assert restored.changed is True and (data_dir / "member" / "snap").is_dir()
    assert not data_dir.with_name(data_dir.name + ".partial").exists()

    present = etcd.run("etcd.keys_present", keys=list(etcd.seed), values=etcd.seed)
    assert present.details["missing"] == [] and present.details["mismatched"] == {}
    assert etcd.run("etcd.key_count", prefix=later).details["count"] == 0
    etcd.lab.reload()
    assert etcd.lab["etcd"]["data_dir"] == str(data_dir)

    # Run twice equals once: the same snapshot in the same directory changes nothing.
    again = etcd.run("etcd.snapshot_restore", snapshot=str(snapshot), data_dir=str(data_dir))
    assert again.changed is False and "already holds" in again.summary
    # The member keeps its directory across a plain restart.
    assert etcd.lab.lab("service", "etcd", "restart").returncode == 0
    etcd.run("etcd.keys_present", keys=list(etcd.seed), values=etcd.seed)
    cycle = saved_in + restored_in + switched_in
    record_property("etcd_cycle_seconds", round(cycle, 2))
    print(f"etcd cycle: save {saved_in:.2f}s, restore {restored_in:.2f}s, "
          f"switch (stop+start+healthy) {switched_in:.2f}s, total {cycle:.2f}s")
    etcd.switch(etcd.original_data_dir)  # still holds the changes: undo them
    assert etcd.etcdctl("del", later).returncode == 0
    for key in (first_key, second_key):
        assert etcd.etcdctl("put", key, etcd.seed[key]).returncode == 0


@pytest.mark.lab
def test_restore_refuses_a_directory_in_use(etcd: EtcdLab, tmp_path: Path) -> None:
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    etcd.run("etcd.snapshot_save", path=str(first))
    assert etcd.etcdctl("put", "/registry/grblab/between", "x").returncode == 0
    etcd.run("etcd.snapshot_save", path=str(second))
    etcd.etcdctl("del", "/registry/grblab/between")
    data_dir = etcd.new_dir()
    etcd.run("etcd.snapshot_restore", snapshot=str(first), data_dir=str(data_dir))
    marker = json.loads((data_dir / "member" / "restored-from.json").read_text())
    with pytest.raises(ActionError, match=r"restored from another snapshot.*new data directory"):
        etcd.run("etcd.snapshot_restore", snapshot=str(second), data_dir=str(data_dir))
    assert json.loads((data_dir / "member" / "restored-from.json").read_text()) == marker

    foreign = etcd.new_dir()
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not etcd")
    with pytest.raises(ActionError, match="exists and is not empty"):
        etcd.run("etcd.snapshot_restore", snapshot=str(first), data_dir=str(foreign))
    assert [p.name for p in foreign.iterdir()] == ["keep.txt"]

    with pytest.raises(ActionError, match="does not exist: nothing was restored"):
        etcd.run("etcd.snapshot_restore", snapshot=str(tmp_path / "nope.db"),
                 data_dir=str(etcd.new_dir()))

    empty = etcd.new_dir()
    empty.mkdir()  # an empty directory is fine (e.g. a mount point made beforehand)
    assert etcd.run("etcd.snapshot_restore", snapshot=str(first),
                    data_dir=str(empty)).changed is True


@pytest.mark.lab
def test_switch_refuses_a_directory_without_a_member(etcd: EtcdLab) -> None:
    empty = etcd.new_dir()
    empty.mkdir()
    result = etcd.lab.lab("etcd-switch", str(empty))
    assert result.returncode == 1 and "holds no etcd member" in result.stderr
    etcd.run("etcd.health")  # still up, on the directory it had


@pytest.mark.lab
def test_stopped_etcd_gives_clear_errors(etcd: EtcdLab, tmp_path: Path) -> None:
    quick = etcd.actions(dial_timeout=0.5, command_timeout=1)
    assert etcd.lab.lab("service", "etcd", "stop").returncode == 0
    try:
        endpoint = etcd.config.endpoints[0]
        health = quick["etcd.health"]
        with pytest.raises(ActionError, match=f"1 of 1 endpoint.*{endpoint}.*is etcd running"):
            health.run(health.Arguments(), ctx())
        save = quick["etcd.snapshot_save"]
        path = tmp_path / "never.db"
        with pytest.raises(ActionError, match=r"no healthy etcd endpoint.*nothing was saved"):
            save.run(save.Arguments(path=str(path)), ctx())
        assert not path.exists() and not list(tmp_path.glob("never.db*"))
        count = quick["etcd.key_count"]
        with pytest.raises(ActionError, match=r"counting etcd keys failed: .*is etcd running"):
            count.run(count.Arguments(), ctx())
    finally:
        assert etcd.lab.lab("service", "etcd", "start").returncode == 0
    etcd.run("etcd.health")
