"""`lab up --slurm 24.11|26.05` in labs of their own: Slurm from a Debian root (built once
per machine, deploy/lab/labkit/roots.py), the same topology, accounting, faults and reset."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import urllib.request

import pytest

from tests.lab.fixture import REPO, Lab, lab_command, start_lab

sys.path.insert(0, str(REPO / "deploy" / "lab"))
from labkit import roots

pytestmark = pytest.mark.ownlab  # its own folder and ports: runs beside the shared lab
CLIENTS = ["scontrol", "sinfo", "squeue", "sbatch", "srun", "sacctmgr"]


def need_a_root(version: str) -> None:
    """A cached root, or debootstrap to build one (about 30 s, the Debian mirror)."""
    if roots.usable(roots.cache_dir() / roots.SUITES[version], version):
        return
    if not shutil.which("debootstrap"):
        message = "no Slurm root cached and no debootstrap to build one: `make deps`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def wait_state(lab: Lab, node: str, state: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while True:
        now = lab.run("sinfo", "-h", "-n", node, "-o", "%t").stdout.strip()
        if now == state or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def check_clients(lab: Lab, version: str) -> None:
    for client in CLIENTS:
        out = lab.run(client, "--version")
        assert out.stdout.split()[-1:] == [lab["slurm_version"]], (client, out.stdout, out.stderr)
        assert lab["slurm_version"].startswith(f"{version}.")
        assert shutil.which(client, path=lab.env["PATH"]) == str(lab.dir / "bin" / client)
    status = lab.lab("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert f"slurm {lab['slurm_version']} from the Debian root" in status.stdout


def check_jobs_and_faults(lab: Lab) -> None:
    first, second = lab["slurmd_nodes"][:2]
    states = lab.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.split("\n")
    assert sorted(line.split()[1] for line in states if line) == ["idle"] * len(lab["nodes"])
    ran = lab.run("srun", "-w", second, "printenv", "SLURMD_NODENAME")
    assert (ran.returncode, ran.stdout.strip()) == (0, second), ran.stderr
    assert lab.lab("fault", second, "health=fail").returncode == 0
    assert lab.run("srun", "-w", second, "dcgmi", "diag", "-r", "2").returncode == 1
    assert lab.run("srun", "-w", first, "dcgmi", "diag", "-r", "2").returncode == 0
    accounts = lab.run("sacctmgr", "-n", "-P", "show", "account", "format=account").stdout
    assert {lab["account"], lab["second_account"]} <= set(accounts.split())


def check_drain_resume(lab: Lab) -> None:
    node = lab["slurmd_nodes"][2]
    drained = lab.run("scontrol", "update", f"NodeName={node}", "State=DRAIN",
                      "Reason=lab versions test")
    assert drained.returncode == 0, drained.stderr
    assert wait_state(lab, node, "drain") == "drain"
    assert "lab versions test" in lab.run("sinfo", "-R", "-h", "-n", node).stdout
    resumed = lab.run("scontrol", "update", f"NodeName={node}", "State=RESUME")
    assert resumed.returncode == 0, resumed.stderr
    assert wait_state(lab, node, "idle") == "idle"


def check_rest_and_reset(lab: Lab) -> None:
    rest, token = lab["slurmrestd"], lab["jwt"]["token"]
    request = urllib.request.Request(
        f"{rest['url']}/slurm/{rest['api_version']}/ping/",
        headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
    assert lab.run("sbatch", "-w", lab["slurmd_nodes"][0], "--wrap", "sleep 300").returncode == 0
    reset = lab.lab("reset")
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert lab.run("squeue", "-h").stdout.strip() == ""
    assert not (lab.dir / "faults" / f"{lab['slurmd_nodes'][1]}.json").exists()


@pytest.mark.parametrize("version", ["24.11", "26.05"])
def test_lab_runs_slurm_from_a_debian_root(version: str) -> None:
    need_a_root(version)
    folder = tempfile.mkdtemp(prefix="grb-v-")  # short: unix socket paths stay < 108 bytes
    env = dict(os.environ, RUNBOOK_LAB_DIR=folder)
    env.pop("RUNBOOK_LAB_PORT_BASE", None)
    try:
        lab = start_lab(env, "--slurm", version, "--no-install")
        assert lab["slurm"]["version"] == version
        check_clients(lab, version)
        other = "26.05" if version == "24.11" else "24.11"
        refused = lab.lab("up", "--slurm", other)
        assert refused.returncode == 1 and f"runs Slurm {version}" in refused.stderr
        check_jobs_and_faults(lab)
        check_drain_resume(lab)
        check_rest_and_reset(lab)
    finally:
        lab_command("down", "--purge", env=env)
    assert not os.path.exists(folder)
    # The daemons' mounts lived in their own namespaces: none is left on the host.
    with open("/proc/self/mountinfo") as mounts:
        assert str(roots.cache_dir()) not in mounts.read()
