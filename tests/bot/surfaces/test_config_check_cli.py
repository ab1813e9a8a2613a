"""`runbook config check --offline` run as a site runs it, on the two configurations the
product ships: the lab's template (rendered as `lab up` renders it) and the Kubernetes base
configuration (deploy/kubernetes/base/config/config.yaml) with the files the pod mounts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
BASE_CONFIG = REPO / "deploy" / "kubernetes" / "base" / "config" / "config.yaml"
# the files of the base configuration that only the pod has (its ConfigMaps)
POD_FILES = {"/etc/slurm/slurm.conf": "file", "/etc/gpu-runbook-bot/runbooks": "folder"}


def config_check(config: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNBOOK_")}
    return subprocess.run([sys.executable, "-m", "bot", "config", "check", "--config",
                           str(config), "--offline"], capture_output=True, text=True,
                          env={**env, **extra}, timeout=120, check=False)


def lab_config(folder: Path) -> Path:
    """The lab's bot.yaml as `lab up` writes it, and the files `lab up` makes beside it."""
    sys.path.insert(0, str(REPO / "deploy" / "lab"))
    from labkit import render
    from labkit.layout import Layout, Ports

    layout = Layout(folder)
    text = render.bot_yaml(layout, ["gpu01", "gpu02", "gpu03"], Ports(41000, 3),
                           "http://127.0.0.1:41001")
    layout.etc.mkdir(parents=True)
    for made in (layout.slurm_conf, folder / "kubeconfig", layout.etc / "alerts-token"):
        made.write_text("made by lab up\n")
    config = folder / "bot.yaml"
    config.write_text(text)
    return config


def test_the_labs_configuration_can_do_every_shipped_runbook(tmp_path: Path) -> None:
    done = config_check(lab_config(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith(f"{tmp_path / 'bot.yaml'}: ok (")
    assert lines[-1].endswith(" 0 not available here, 0 in part, offline)")
    assert lines[:-1] == [f"note: the database {tmp_path / 'bot.db'} is not there yet: "
                          "`runbook db init` creates it (database.create: any command)"]


def test_a_file_the_lab_config_names_that_is_missing_fails_the_check(tmp_path: Path) -> None:
    config = lab_config(tmp_path)
    (tmp_path / "kubeconfig").unlink()
    done = config_check(config)
    assert done.returncode == 2
    assert done.stdout.splitlines()[0] == (
        f"error: kubernetes.kubeconfig: {tmp_path / 'kubeconfig'}: no such file")


def pod_config(folder: Path) -> Path:
    """The base configuration, its pod-only paths moved to files and folders made here."""
    text = BASE_CONFIG.read_text()
    for path, kind in POD_FILES.items():
        here = folder / path.lstrip("/")
        here.parent.mkdir(parents=True, exist_ok=True)
        if kind == "file":
            here.write_text("# the site's\n")
        else:
            here.mkdir()
        text = text.replace(path, str(here))
    config = folder / "config.yaml"
    config.write_text(text)
    return config


def test_the_kubernetes_base_configuration_says_what_it_cannot_run(tmp_path: Path) -> None:
    """The base configures Slurm (cli) and Kubernetes but no Prometheus, Alertmanager, etcd,
    MariaDB or host commands: the runbooks that need those are named, and that is no error."""
    volume = tmp_path / "var" / "lib" / "gpu-runbook-bot"  # overlays/single's PVC
    volume.mkdir(parents=True)
    done = config_check(pod_config(tmp_path), RUNBOOK_DB_URL=f"sqlite:///{volume / 'bot.db'}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[:-1] == [
        "not available here: drift-report: needs the prometheus section",
        "not available here: restore-etcd: needs the etcd section, host_commands.etcd-switch, "
        "the prometheus section",
        "not available here: restore-slurmdbd: needs the mariadb section, "
        "host_commands.slurmdbd-stop, host_commands.slurmdbd-start",
        "not available here: upgrade-slurm: needs the mariadb section",
        "in part here: close-window: its steps under when: need the alertmanager section",
        "in part here: mig-reconfigure: its steps under when: need host_commands.mig-reload",
        "in part here: open-window: its steps under when: need the alertmanager section",
        "in part here: swap-gpu: its steps under when: need the prometheus section",
        "in part here: upgrade-driver: its steps under when: need the prometheus section",
        f"note: the database {volume / 'bot.db'} is not there yet: `runbook db init` creates "
        "it",  # serve --init-db at the pod's first start
    ]
    assert done.stdout.splitlines()[-1].endswith(
        "ok (3 files and folders, 23 runbooks, 4 not available here, 5 in part, offline)")


def test_outside_the_pod_the_base_configuration_misses_the_pods_files() -> None:
    done = config_check(BASE_CONFIG)
    assert done.returncode == 2
    errors = [line for line in done.stdout.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: slurm.slurm_conf: /etc/slurm/slurm.conf: no such file",
        "error: runbooks.paths[0]: /etc/gpu-runbook-bot/runbooks: no such file or folder",
    ]


def test_a_broken_configuration_is_named_line_by_line(tmp_path: Path) -> None:
    config = tmp_path / "bot.yaml"
    config.write_text("server:\n  prot: 80\n")
    done = config_check(config)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stdout.splitlines() == [
        f'error: {config}:2: server.prot: unknown field (did you mean "port"?)',
        f"{config}: 1 problem(s)"]
