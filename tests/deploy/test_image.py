"""The container image: deploy/image/build (what `make image` runs) builds it with podman
from a locally made base, and the image runs: `runbook --help`, `runbook validate` of the
shipped runbooks, as the non-root user, with the Slurm clients, munge, etcdctl and the
MariaDB client on its PATH; `runbook serve` passes the image's own HEALTHCHECK (with the /alerts
token; without one it refuses to start on 0.0.0.0); the munged
sidecar entry point (run-munged) serves credentials as that user from a root-owned key; and,
with the lab, the image's Slurm clients reach a real slurmctld through munge.

The image is built once per session (the build reuses the base image and podman's layer
cache, so a warm build takes seconds). As root (CI) a missing podman is installed by the
build; elsewhere the tests skip, naming what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.fixture import Lab

pytestmark = pytest.mark.image

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "deploy" / "image" / "build"
CONTAINERS_CONF = REPO / "deploy" / "image" / "containers.conf"
BUILD_TIMEOUT = 1200  # cold: the tools, debootstrap, Debian's packages; warm: about 20 s
UID = "10001"


def podman_env() -> dict[str, str]:
    return dict(os.environ, CONTAINERS_CONF=str(CONTAINERS_CONF))


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], env=podman_env(), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, check=False)


def run(image: str, *argv: str, options: tuple[str, ...] = (), network: str = "none",
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`podman run --rm`, by default with no network; no healthcheck timers (no systemd)."""
    return podman("run", "--rm", "--network", network, "--no-healthcheck", *options, image,
                  *argv, timeout=timeout)


@pytest.fixture(scope="session")
def image() -> Iterator[str]:
    if shutil.which("podman") is None and os.geteuid() != 0:
        pytest.skip("podman is not installed and this user is not root, so deploy/image/build "
                    "cannot install it (apt-get install podman buildah runc debootstrap)")
    began = time.monotonic()
    out = subprocess.run([str(BUILD)], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                         timeout=BUILD_TIMEOUT, check=False, env=podman_env())
    assert out.returncode == 0, f"deploy/image/build failed:\n{out.stderr[-6000:]}"
    ref = out.stdout.strip().splitlines()[-1]
    print(f"image {ref} built in {time.monotonic() - began:.0f}s")
    yield ref


def test_runbook_help(image: str) -> None:
    out = run(image, "runbook", "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: runbook")
    for command in ("validate", "serve", "run", "approve", "audit"):
        assert command in out.stdout


def test_runbook_validate_of_the_shipped_runbooks(image: str) -> None:
    out = run(image, "runbook", "validate")
    assert out.returncode == 0, out.stdout + out.stderr
    shipped = sorted(p.name for p in (REPO / "runbooks").glob("*.yaml"))
    checked = sorted(Path(line.split()[1]).name for line in out.stdout.splitlines()
                     if line.startswith("ok "))
    assert checked == shipped, out.stdout
    # A broken runbook is named with its problem and the exit code says so.
    bad = run(image, "sh", "-c", "printf 'name: Bad\\n' > /tmp/bad.yaml && "
              "runbook validate /tmp/bad.yaml", options=("--tmpfs", "/tmp"))
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "/tmp/bad.yaml" in bad.stdout + bad.stderr


def test_non_root_with_the_clients_the_runbooks_need(image: str) -> None:
    out = run(image, "sh", "-c", "id -u; id -g; for tool in sinfo scontrol srun sacct munge "
              "munged etcdctl mariadb mariadb-dump run-munged; do command -v $tool; done; "
              "test ! -e /etc/munge/munge.key && echo no-baked-key; "
              "python3 -c 'import psycopg; print(\"psycopg\")'")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.split()
    assert lines[:2] == [UID, UID]
    for tool in ("sinfo", "scontrol", "srun", "sacct", "munged", "etcdctl", "mariadb-dump",
                 "run-munged"):
        assert any(line.endswith(f"/{tool}") for line in lines), tool
    assert "no-baked-key" in lines  # every site mounts its own munge key
    assert "psycopg" in lines  # PostgreSQL for overlays/ha
    inspect = podman("image", "inspect", "--format",
                     "{{.Config.User}}|{{json .Config.Cmd}}|{{json .Config.Healthcheck.Test}}",
                     image)
    user, cmd, health = inspect.stdout.strip().split("|")
    assert user == f"{UID}:{UID}"
    assert cmd == '["runbook","serve","--host","0.0.0.0","--init-db"]'
    assert "RUNBOOK_HEALTH_URL" in health and "urllib.request" in health


def test_serve_passes_the_image_healthcheck(image: str, tmp_path: Path) -> None:
    """As in the pod: a read-only root file system; /tmp and the data folder are volumes
    (emptyDirs or the PVC: root-owned, group 10001 through fsGroup, mode 2777); the /alerts
    token in RUNBOOK_ALERTS_TOKEN (the pod's Secret gpu-runbook-bot-alerts)."""
    refused = run(image, options=("--read-only", "--tmpfs", "/tmp"))  # the CMD, no token
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "set RUNBOOK_ALERTS_TOKEN" in refused.stderr
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, 0, int(UID))
    data.chmod(0o2777)
    started = podman("run", "-d", "--network", "none", "--read-only", "--tmpfs", "/tmp",
                     "-e", "RUNBOOK_ALERTS_TOKEN=image-test-token-0123456789abcdef",
                     "-v", f"{data}:/var/lib/gpu-runbook-bot", image)
    assert started.returncode == 0, started.stderr
    cid = started.stdout.strip().splitlines()[-1]
    try:
        deadline = time.monotonic() + 60
        while True:
            check = podman("healthcheck", "run", cid)
            if check.returncode == 0:
                break
            assert time.monotonic() < deadline, (check.stdout + check.stderr,
                                                 podman("logs", cid).stderr)
            time.sleep(0.5)
        logs = podman("logs", cid)
        assert "serving on http://0.0.0.0:8080" in logs.stdout + logs.stderr
        assert (data / "bot.db").exists()  # the default SQLite database, on the volume
    finally:
        podman("rm", "-f", "-t", "2", cid)


def test_munged_sidecar_serves_credentials_as_the_bot_user(image: str, tmp_path: Path) -> None:
    """As in the pod (deploy/kubernetes/base/deployment.yaml): a read-only root file system,
    the key root-owned and group-readable (a Secret volume with fsGroup 10001), the state and
    socket folders root-owned, group 10001, mode 2777 (emptyDirs with that fsGroup)."""
    keys, sockets, state = tmp_path / "key", tmp_path / "socket", tmp_path / "state"
    for folder in (keys, sockets, state):
        folder.mkdir()
    for folder in (sockets, state):
        os.chown(folder, 0, int(UID))
        folder.chmod(0o2777)
    key = keys / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chown(key, 0, int(UID))
    key.chmod(0o440)
    started = podman("run", "-d", "--read-only", "--network", "none", "--no-healthcheck",
                     "-e", "MUNGE_STATE_DIR=/var/lib/munge-state",
                     "-v", f"{keys}:/etc/munge-key:ro", "-v", f"{state}:/var/lib/munge-state",
                     "-v", f"{sockets}:/run/munge", image, "run-munged")
    assert started.returncode == 0, started.stderr
    cid = started.stdout.strip().splitlines()[-1]
    try:
        deadline = time.monotonic() + 20
        while not (sockets / "munge.socket.2").exists():
            assert time.monotonic() < deadline, podman("logs", cid).stderr
            time.sleep(0.1)
        out = run(image, "sh", "-c", "munge -n | unmunge", options=(
            "--read-only", "-v", f"{sockets}:/run/munge"))
        assert out.returncode == 0, out.stdout + out.stderr + podman("logs", cid).stderr
        assert "STATUS:          Success (0)" in out.stdout
        assert f"UID:             runbook ({UID})" in out.stdout
    finally:
        podman("rm", "-f", "-t", "2", cid)


@pytest.mark.lab
def test_slurm_clients_reach_the_labs_slurmctld(image: str, lab: Lab, tmp_path: Path) -> None:
    """slurm.conf mounted at /etc/slurm (as the ConfigMap is), munge through the socket."""
    conf = tmp_path / "slurm"
    conf.mkdir()
    etc = Path(lab["slurm_conf"]).parent
    for name in ("slurm.conf", "gres.conf"):
        if (etc / name).exists():
            shutil.copy(etc / name, conf / name)
            (conf / name).chmod(0o644)
    run_dir = lab.dir / "run"
    out = run(image, "sh", "-c", "sinfo -h -o '%N %t' && scontrol show node "
              f"{lab['nodes'][0]} | head -1", network="host", options=(
                  "-v", f"{conf}:/etc/slurm:ro",
                  "-v", f"{run_dir}:{run_dir}", "-e", "SLURM_CONF=/etc/slurm/slurm.conf"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"NodeName={lab['nodes'][0]}" in out.stdout
