"""Session-scoped pytest fixture `lab`: one real Slurm lab per test session.

Load it with `pytest -p tests.lab.fixture` or `pytest_plugins = ["tests.lab.fixture"]`
in a conftest. `lab up` runs once; `lab down` runs at the end of the session when this
session started the lab and no other session still uses it (RUNBOOK_LAB_KEEP=1
keeps it running; a lab started by hand before the session is left running).
Daemon output never reaches pytest's stdout/stderr: everything is captured.
"""
from __future__ import annotations

import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
LAB_CMD = REPO / "deploy" / "lab" / "lab"
UP_TIMEOUT = 600  # generous: the first run may apt-get install packages
TAIL_LINES = 30


@dataclass
class Lab:
    """A running lab: parsed lab.json plus an environment for its clients."""

    info: dict[str, Any]
    env: dict[str, str] = field(repr=False)

    @property
    def dir(self) -> Path:
        return Path(self.info["lab_dir"])

    def __getitem__(self, key: str) -> Any:
        return self.info[key]

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run a client command (sinfo, srun, ...) against the lab."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout, check=False)

    def lab(self, *args: str, timeout: float = UP_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """Run `deploy/lab/lab ARGS` for this lab."""
        return lab_command(*args, env=self.env, timeout=timeout)

    def reload(self) -> None:
        self.info = json.loads((self.dir / "lab.json").read_text())


def lab_command(*args: str, env: dict[str, str] | None = None,
                timeout: float = UP_TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LAB_CMD), *args], env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, check=False)


IMPATIENT_MESSAGE_TIMEOUT = 3  # seconds: a client gives up on a stopped slurmctld after 2 s


@dataclass
class SlurmClients:
    """A test's own slurm.conf for the Slurm clients of the bot it builds (the adapter's
    ``slurm.slurm_conf``, which it exports as SLURM_CONF): a copy of the lab's, beside links
    to the lab's other files; the daemons keep reading the lab's own file.

    A Slurm client tries to connect to a stopped slurmctld once a second for MessageTimeout
    seconds (the default 10: a failure costs 9 s) and then says "Unable to contact slurm
    controller (connect failure)". A test that stops slurmctld calls ``impatient()`` just
    before it stops it: the clients started from then on say the same after 2 s.
    ``patient()`` puts the lab's text back just before slurmctld is started again, so a running
    controller always gets the default MessageTimeout to answer in."""

    lab_conf: Path
    path: Path

    def impatient(self) -> None:
        self._write(IMPATIENT_MESSAGE_TIMEOUT)

    def patient(self) -> None:
        self._write(None)

    def _write(self, message_timeout: int | None) -> None:
        lines = [line for line in self.lab_conf.read_text().splitlines()
                 if not line.replace(" ", "").lower().startswith("messagetimeout=")]
        if message_timeout is not None:
            lines.append(f"MessageTimeout={message_timeout}")
        self.path.write_text("\n".join(lines) + "\n")


def slurm_clients(lab: Lab, folder: Path) -> SlurmClients:
    """A ``SlurmClients`` in ``folder`` (created), patient to begin with."""
    lab_conf = Path(lab["slurm_conf"])
    folder.mkdir(parents=True, exist_ok=True)
    for sibling in lab_conf.parent.iterdir():  # gres.conf, plugstack.conf...: the lab's
        if sibling.name != lab_conf.name:
            (folder / sibling.name).symlink_to(sibling)
    clients = SlurmClients(lab_conf, folder / lab_conf.name)
    clients.patient()
    return clients


def client_env(info: dict[str, Any], base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.pop("SLURM_JWT", None)  # would switch Slurm clients from munge to JWT
    env.update(
        SLURM_CONF=info["slurm_conf"],
        RUNBOOK_LAB_DIR=info["lab_dir"],
        RUNBOOK_CONFIG=info["bot_config"],
        PATH=f"{info['bin_dir']}{os.pathsep}{env.get('PATH', os.defpath)}",
    )
    env.pop("SLACK_APP_TOKEN", None)  # its presence would switch the bot to Socket Mode
    token_file = Path(info.get("monitoring", {}).get("alerts_token_file") or "/nonexistent")
    if token_file.is_file():  # the bot's POST /alerts takes it, as `lab env` exports it
        env["RUNBOOK_ALERTS_TOKEN"] = token_file.read_text().strip()
    slack = info.get("slack")
    if slack:  # as `lab env` exports them
        tokens = json.loads(Path(slack["tokens_file"]).read_text())
        env.update(SLACK_API_URL=slack["api_url"], SLACK_BOT_TOKEN=tokens["bot_token"],
                   SLACK_SIGNING_SECRET=tokens["signing_secret"],
                   LAB_SLACK_APP_TOKEN=tokens["app_token"])
    return env


def lab_log_tails(lab: Lab | dict[str, Any] | str | Path, lines: int = TAIL_LINES) -> str:
    """The last lines of every daemon log of a lab (a Lab, its lab.json dict, or its folder)."""
    if isinstance(lab, Lab):
        folder = lab.dir
    elif isinstance(lab, dict):
        folder = Path(lab["lab_dir"])
    else:
        folder = Path(lab)
    logs = sorted((folder / "log").glob("*.log")) + sorted((folder / "log").glob("*.out"))
    parts = []
    for log in logs:
        text = log.read_text(errors="replace").splitlines()[-lines:]
        if text:
            parts.append(f"--- {log.name} ---\n" + "\n".join(text))
    return "\n".join(parts) or f"(no daemon logs under {folder / 'log'})"


def lab_dir(env: dict[str, str] | None = None) -> Path:
    """The lab folder `lab env` reports for this environment."""
    for line in lab_command("env", env=env).stdout.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[1].startswith("RUNBOOK_LAB_DIR="):
            return Path(words[1].split("=", 1)[1])
    raise RuntimeError("`lab env` printed no RUNBOOK_LAB_DIR")


def start_lab(
    env: dict[str, str] | None = None, *up_args: str, stop_on_failure: bool = True
) -> Lab:
    """`lab up`; on failure stop what started and fail with the daemon logs."""
    env = dict(os.environ if env is None else env)
    result = lab_command("up", *up_args, env=env)
    folder = lab_dir(env)
    if result.returncode != 0:
        tails = lab_log_tails(folder)
        if stop_on_failure:
            lab_command("down", env=env)
        output = f"{result.stdout}{result.stderr}"
        pytest.fail(f"lab up failed ({result.returncode}):\n{output}\n{tails}", pytrace=False)
    info = json.loads((folder / "lab.json").read_text())
    return Lab(info=info, env=client_env(info, env))


# Concurrent pytest sessions of one checkout share the lab. Each holds a lease
# (a file named by its pid); the last one out stops the lab, and only when a
# session started it (a lab a developer started by hand is left running).
OWNED = "started-by-pytest"


@contextmanager
def _leases(folder: Path) -> Iterator[Path]:
    leases = folder / "leases"
    leases.mkdir(parents=True, exist_ok=True)
    with open(leases / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield leases


def _other_live_leases(leases: Path) -> list[Path]:
    live = []
    for lease in leases.glob("[0-9]*"):
        pid = int(lease.name)
        if pid != os.getpid() and Path(f"/proc/{pid}").exists():
            live.append(lease)
        elif pid != os.getpid():
            lease.unlink(missing_ok=True)  # a session that died without teardown
    return live


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    folder = lab_dir()
    with _leases(folder) as leases:
        owner = leases / OWNED
        if lab_command("status").returncode != 0:
            if not _other_live_leases(leases):
                # Start from a clean folder: a run killed midway may have left state
                # behind (etcd switched to another data dir, faults, reservations).
                lab_command("down", "--purge")
                leases.mkdir(parents=True, exist_ok=True)
            owner.touch()  # a lab that pytest starts, pytest stops
        handle = start_lab(stop_on_failure=owner.exists() and not _other_live_leases(leases))
        (leases / str(os.getpid())).touch()
    yield handle
    with _leases(folder) as leases:
        (leases / str(os.getpid())).unlink(missing_ok=True)
        last_out = not _other_live_leases(leases)
        if last_out and (leases / OWNED).exists() and os.environ.get("RUNBOOK_LAB_KEEP") != "1":
            lab_command("down", env=handle.env)
            (leases / OWNED).unlink(missing_ok=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the daemon log tails to every failing test that used the lab."""
    report = yield
    handle = getattr(item, "funcargs", {}).get("lab")
    if report.failed and isinstance(handle, Lab):
        report.sections.append(("lab daemon logs", lab_log_tails(handle)))
    return report


@contextmanager
def version_lab(version: str, prefix: str = "grb-v-") -> Iterator[Lab]:
    """A lab of Slurm ``version`` (``lab up --slurm``) in a temporary folder of its own and
    its own ports, beside the shared lab; ``lab down --purge`` at the end, whatever happened.
    Skips (fails under CI) when no Slurm root is cached and debootstrap cannot build one."""
    sys.path.insert(0, str(REPO / "deploy" / "lab"))
    from labkit import roots

    if not roots.usable(roots.cache_dir() / roots.SUITES[version], version) and \
            not shutil.which("debootstrap"):
        message = f"no Slurm {version} root cached and no debootstrap to build one: `make deps`"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    folder = tempfile.mkdtemp(prefix=prefix)  # short: unix socket paths stay < 108 bytes
    env = dict(os.environ, RUNBOOK_LAB_DIR=folder)
    env.pop("RUNBOOK_LAB_PORT_BASE", None)
    try:
        yield start_lab(env, "--slurm", version, "--no-install")
    finally:
        lab_command("down", "--purge", env=env)
