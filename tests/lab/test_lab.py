"""Tests of the local lab itself: real Slurm, MariaDB, slurmdbd and slurmrestd."""
from __future__ import annotations

import json
import os
import socket
import tempfile
import urllib.request
from typing import Any

import pytest

from tests.lab.fixture import Lab, lab_command, start_lab

pytestmark = pytest.mark.lab


def node_state(node: dict[str, Any]) -> set[str]:
    """22.05: `state` is the base state, flags apart; 24.11: `state` is a list."""
    state = node.get("state", [])
    states = [state] if isinstance(state, str) else list(state)
    return {s.upper() for s in states + list(node.get("state_flags", []))}


def gpu_count(gres: str) -> int:
    # "gpu:h100:8" in 22.05, "gpu:h100:8(S:0)" in newer releases.
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu":
            return int(parts[-1])
    return 0


def test_nodes_idle_with_eight_gpus(lab: Lab) -> None:
    result = lab.run("sinfo", "--json")
    assert result.returncode == 0, result.stderr
    nodes = {n["name"]: n for n in json.loads(result.stdout)["nodes"]}
    assert set(lab["nodes"]) <= set(nodes)
    for name in lab["slurmd_nodes"]:
        assert node_state(nodes[name]) == {"IDLE"}, nodes[name]
        assert gpu_count(nodes[name]["gres"]) == 8


def test_accounting_has_account_and_qos(lab: Lab) -> None:
    accounts = lab.run("sacctmgr", "-n", "-P", "list", "account", "format=account")
    assert lab["account"] in accounts.stdout.split(), accounts.stderr
    qos = lab.run("sacctmgr", "-n", "-P", "list", "qos", "format=name")
    assert lab["qos"] in qos.stdout.split()
    assoc = lab.run("sacctmgr", "-n", "-P", "list", "assoc", "user=root", "format=account")
    assert lab["account"] in assoc.stdout.split()


def test_slurmrestd_lists_nodes_with_jwt(lab: Lab) -> None:
    rest = lab["slurmrestd"]
    request = urllib.request.Request(
        f"{rest['url']}/slurm/{rest['api_version']}/nodes",
        headers={"X-SLURM-USER-NAME": lab["jwt"]["user"],
                 "X-SLURM-USER-TOKEN": lab["jwt"]["token"]},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        body = json.load(response)
    assert {n["name"] for n in body["nodes"]} >= set(lab["slurmd_nodes"])


def test_srun_runs_on_the_named_node(lab: Lab) -> None:
    node = lab["slurmd_nodes"][1]
    result = lab.run("srun", "-w", node, "-N1", "printenv", "SLURMD_NODENAME")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == node


def test_health_fault_fails_dcgmi_on_that_node_only(lab: Lab) -> None:
    good, bad = lab["slurmd_nodes"][0], lab["slurmd_nodes"][1]
    assert lab.lab("fault", bad, "health=fail").returncode == 0
    try:
        failing = lab.run("srun", "-w", bad, "dcgmi", "diag", "-r", "2")
        passing = lab.run("srun", "-w", good, "dcgmi", "diag", "-r", "2")
    finally:
        lab.lab("fault", bad, "clear")
    assert failing.returncode != 0
    assert "Fail" in failing.stdout
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert "Fail" not in passing.stdout


def test_driver_fault_and_driver_install(lab: Lab) -> None:
    node = lab["slurmd_nodes"][2]
    try:
        lab.lab("fault", node, "driver=550.54.15")
        assert lab.lab("driver", node).stdout.strip() == "550.54.15"
        installed = lab.run("srun", "-w", node, "lab-driver-install", "550.90.07")
        assert installed.returncode == 0, installed.stderr
        assert lab.lab("driver", node).stdout.strip() == "550.90.07"
        smi = lab.run("srun", "-w", node, "nvidia-smi", "--query-gpu=driver_version",
                      "--format=csv,noheader")
        assert set(smi.stdout.split()) == {"550.90.07"}
    finally:
        lab.lab("fault", node, "clear")
    assert lab.lab("driver", node).stdout.strip() == lab["default_driver_version"]


def test_up_twice_is_harmless(lab: Lab) -> None:
    lab.reload()  # other tests restart daemons (reboots, service stop/start)
    before = {n: d["pid"] for n, d in lab["daemons"].items()}
    again = lab.lab("up")
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stdout
    lab.reload()
    assert {n: d["pid"] for n, d in lab["daemons"].items()} == before


def test_slurmdbd_service_stop_start(lab: Lab) -> None:
    try:
        assert lab.lab("service", "slurmdbd", "stop").returncode == 0
        assert lab.lab("service", "slurmdbd", "status").returncode == 1
        assert lab.run("sacctmgr", "-n", "list", "account").returncode != 0
    finally:
        started = lab.lab("service", "slurmdbd", "start")
    assert started.returncode == 0, started.stderr
    assert lab.run("sacctmgr", "-n", "list", "account").returncode == 0


def test_down_then_status_in_its_own_lab() -> None:
    # A lab of its own, so the shared one keeps running. Short folder: unix
    # socket paths must stay under 108 bytes.
    folder = tempfile.mkdtemp(prefix="grb-t-")
    env = dict(os.environ, RUNBOOK_LAB_DIR=folder)
    env.pop("RUNBOOK_LAB_PORT_BASE", None)
    try:
        own = start_lab(env, "--nodes", "2")
        assert lab_command("status", env=env).returncode == 0
        pids = [d["pid"] for d in own["daemons"].values()]
        down = lab_command("down", env=env)
        assert down.returncode == 0, down.stderr
        status = lab_command("status", env=env)
        assert status.returncode == 1
        assert "running" not in status.stdout and "stopped" in status.stdout
        assert not [p for p in pids if _alive(p)]
        # (not sinfo: with slurmctld gone it retries for ~9 s before failing)
        assert not [p for p in _ports(own) if _listening(p)]
        assert lab_command("down", env=env).returncode == 0  # harmless when stopped
    finally:
        lab_command("down", "--purge", env=env)
    assert not os.path.exists(folder)


def _ports(lab: Lab) -> list[int]:
    ports = lab["ports"]
    return [ports[n] for n in ("slurmctld", "slurmdbd", "slurmrestd", "mariadb")] + list(
        ports["slurmd"].values()
    )


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
