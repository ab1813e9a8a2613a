"""Make sure the Debian packages the lab runs are installed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

PACKAGES = [
    "slurm-wlm", "slurmctld", "slurmd", "slurmdbd", "slurmrestd", "slurm-client",
    "munge", "mariadb-server", "slurm-wlm-jwt-plugin",
    "etcd-server", "etcd-client",
    "prometheus", "prometheus-alertmanager",
    "rsyslog",  # the syslog receiver of the bot's audit log (labkit/rsyslog.py)
]


def _installed(package: str) -> bool:
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package],
        capture_output=True, text=True, check=False,
    )
    return result.returncode == 0 and result.stdout.endswith("installed")


def missing_packages(wanted: list[str] | None = None) -> list[str]:
    wanted = PACKAGES if wanted is None else wanted
    if not shutil.which("dpkg-query"):
        return list(wanted)
    return [p for p in wanted if not _installed(p)]


def install_command(packages: list[str]) -> list[str]:
    return ["apt-get", "install", "-y", "--no-install-recommends", *packages]


def _can_install() -> bool:
    debian = os.path.exists("/etc/debian_version") and bool(shutil.which("apt-get"))
    return os.geteuid() == 0 and debian


def ensure_packages(allow_install: bool, extra: list[str] | None = None,
                    only_extra: bool = False) -> None:
    """Install what is missing (root on Debian), else print the command and exit 2. `extra`:
    more packages (debootstrap for a Slurm root, labkit/roots.py)."""
    missing = missing_packages([*([] if only_extra else PACKAGES), *(extra or [])])
    if not missing:
        return
    command = install_command(missing)
    if not (allow_install and _can_install()):
        print("lab: missing packages; install them with:", file=sys.stderr)
        print(" ".join(command))
        sys.exit(2)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    print(f"lab: installing {' '.join(missing)}", file=sys.stderr)
    # Output goes to stderr so `lab env`-style stdout stays clean; stdin is
    # closed because CI has none.
    for cmd in (["apt-get", "update"], command):
        subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr, check=True)
