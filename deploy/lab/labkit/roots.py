"""Slurm versions other than the host's: Debian roots built once per machine, run chrooted.

`lab up --slurm 24.11|26.05` runs Slurm from a debootstrapped Debian root (trixie, sid) kept
in a cache folder; daemons run chrooted in a private mount namespace (nothing to unmount),
clients through the root's loader. 22.05 is the host's own packages and uses none of this.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

from .layout import REPO_DIR, LabError, Layout

HOST_VERSION = "22.05"
SUITES = {"24.11": "trixie", "26.05": "sid"}
VERSIONS = [HOST_VERSION, *SUITES]
HOST_TOOLS = ["debootstrap"]  # host packages a root needs to be built
CACHE_ENV = "RUNBOOK_LAB_SLURM_ROOTS"
DEFAULT_CACHE = Path("/var/cache/gpu-runbook-bot/slurm-roots")
MIRROR_ENV = "RUNBOOK_LAB_DEBIAN_MIRROR"
FALLBACK_MIRROR = "http://deb.debian.org/debian"
# python3-minimal: the fake GPU tools (labbin/fakegpu.py) run inside the root under srun.
PACKAGES = ["slurmctld", "slurmd", "slurmdbd", "slurmrestd", "slurm-client", "munge",
            "slurm-wlm-jwt-plugin", "python3-minimal"]
RECIPE = 1  # bump when the build steps change: every root is rebuilt
STAMP = ".grb-slurm-root.json"
ROOT_FILE = "slurm-root"  # $LAB/etc/slurm-root: the root this lab's Slurm runs from
# $LAB/etc/slurm-daemons.json: daemon -> root, for daemons `lab slurm-install` switched
DAEMONS_FILE = "slurm-daemons.json"
# $LAB/etc/slurm-plugins -> <slurmctld's root>/PLUGINS: slurm.conf's PluginDir (see plugin_dir)
PLUGIN_LINK = "slurm-plugins"
PLUGINS = "usr/lib/x86_64-linux-gnu/slurm-wlm"
LIBRARY_PATH = [PLUGINS, "usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu"]
CLIENTS = ["scontrol", "sinfo", "squeue", "sbatch", "srun", "salloc", "scancel", "sacct",
           "sacctmgr", "sdiag", "sshare", "sprio", "sstat", "sreport", "strigger", "sattach",
           "sbcast", "scrontab"]
WRAPPER_MARK = "# lab: Slurm client from a Debian root"
# Run as `sh -c SCRIPT lab-root ROOT BINDS ARGV...` inside `unshare --mount`: the mounts live
# in the daemon's own namespace and vanish with its last process (a killed test leaks none).
# /tmp and the lab folder appear at their own paths, so slurm.conf's paths work unchanged
# (and the checkout, /root and /home: a job's working directory is the submitter's);
# /etc/hosts: the host's name resolves as on the host. / is also at /.host, where
# lab-reboot goes back to the host to restart a slurmd.
CHROOT_SCRIPT = r"""
root=$1 binds=$2; shift 2
mkdir -p "$root/.host" && mount --rbind / "$root/.host" || exit 111
for dir in /proc /sys /dev /tmp; do mount --rbind "$dir" "$root$dir" || exit 111; done
for file in /etc/hosts /etc/resolv.conf; do
  [ ! -f "$file" ] || { touch "$root$file" && mount --bind "$file" "$root$file"; } || exit 111
done
for dir in $binds; do
  case "$dir/" in /tmp/*) ;; *) [ ! -d "$dir" ] || { mkdir -p "$root$dir" &&
    mount --rbind "$dir" "$root$dir"; } || exit 111;; esac
done
exec chroot "$root" /usr/bin/env PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"
"""


def suite(version: str) -> str | None:
    if version not in VERSIONS:
        raise LabError(f"--slurm must be one of {', '.join(VERSIONS)}, not {version!r}")
    return SUITES.get(version)


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def current(layout: Layout) -> Path | None:
    """The root this lab's Slurm runs from; None for the host's Slurm (22.05)."""
    try:
        text = (layout.etc / ROOT_FILE).read_text().strip()
    except OSError:
        return None
    return Path(text) if text else None


def daemon_roots(layout: Layout) -> dict[str, str]:
    """The daemons `lab slurm-install` moved to a root: name -> root path."""
    try:
        data = json.loads((layout.etc / DAEMONS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def root_of(layout: Layout, name: str) -> Path | None:
    """The root daemon `name` (slurmdbd, slurmctld, slurmd-gpuNN, slurmrestd) runs from."""
    chosen = daemon_roots(layout).get(name)
    return Path(chosen) if chosen else current(layout)


def set_root(layout: Layout, name: str, root: Path) -> None:
    data = daemon_roots(layout) | {name: str(root)}
    tmp = layout.etc / f".{DAEMONS_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(layout.etc / DAEMONS_FILE)


def release(root: Path | None) -> str:
    """The Slurm version a root runs (its stamp: 26.05.5-1 -> 26.05.5); None: the host's."""
    if root is not None:
        packages = stamp(root).get("installed")
        found = str(packages.get("slurmctld", "")) if isinstance(packages, dict) else ""
        if found:
            return found.split(":")[-1].split("-")[0]
    argv = ["slurmctld", "-V"] if root is None else ["chroot", str(root), "slurmctld", "-V"]
    out = subprocess.run(argv, capture_output=True, text=True, check=False,
                         stdin=subprocess.DEVNULL).stdout.split()
    return out[-1] if out else ""


def mirror() -> str:
    """The Debian mirror apt already uses (first `.../debian` URI), else deb.debian.org."""
    if os.environ.get(MIRROR_ENV):
        return os.environ[MIRROR_ENV]
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        try:
            words = path.read_text().split()
        except OSError:
            continue
        for word in words:
            if word.startswith(("http://", "https://")) and word.rstrip("/").endswith("/debian"):
                return word.rstrip("/")
    return FALLBACK_MIRROR


def wanted(version: str) -> dict[str, object]:
    return {"slurm": version, "suite": SUITES[version], "packages": PACKAGES, "recipe": RECIPE}


def stamp(root: Path) -> dict[str, object]:
    try:
        data: dict[str, object] = json.loads((root / STAMP).read_text())
    except (OSError, ValueError):
        return {}
    return data


def usable(root: Path, version: str) -> bool:
    """Built by this recipe for these packages, and its slurmctld is the wanted version."""
    found = stamp(root)
    installed = found.get("installed")
    return (found.get("wanted") == wanted(version) and isinstance(installed, dict)
            and str(installed.get("slurmctld", "")).startswith(f"{version}.")
            and (root / "usr/sbin/slurmctld").exists())


def ensure(version: str, rebuild: bool = False) -> Path:
    """The root for `version`, built first when missing or stale (one builder at a time)."""
    name = suite(version)
    if name is None:
        raise LabError(f"Slurm {HOST_VERSION} is the host's own: no root")
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / name
    with open(cache / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second lab waits, then finds the root built
        if rebuild or not usable(root, version):
            build(version, root)
    return root


def build(version: str, root: Path) -> None:
    """debootstrap + apt-get into a temp folder, renamed over `root` once complete."""
    for tool in ("debootstrap", "unshare", "chroot"):
        if not shutil.which(tool):
            raise LabError(f"building the Slurm {version} root needs {tool} "
                           "(apt-get install debootstrap)")
    began = time.monotonic()
    tmp = root.with_name(f".{root.name}.build-{os.getpid()}")
    for stale in [*root.parent.glob(f".{root.name}.build-*"),  # a killed build's leftovers
                  *root.parent.glob(f".{root.name}.old-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    log = root.with_name(f"{root.name}.build.log")
    print(f"lab: building the Slurm {version} root ({SUITES[version]}, {mirror()}) in "
          f"{root}; log {log}", file=sys.stderr)
    with open(log, "w") as out:
        step(out, log, "debootstrap", ["unshare", "--mount", "--propagation", "private",
                                       "debootstrap",
                        "--variant=minbase", SUITES[version], str(tmp), mirror()])
        (tmp / "usr/sbin/policy-rc.d").write_text("#!/bin/sh\nexit 101\n")  # no daemon starts
        (tmp / "usr/sbin/policy-rc.d").chmod(0o755)
        step(out, log, "apt-get install", ["unshare", "--mount", "--propagation", "private",
                                           "sh", "-c", INSTALL_SCRIPT, "lab-root", str(tmp),
                                           *PACKAGES])
    versions = installed(tmp)
    took = round(time.monotonic() - began)
    data = {"wanted": wanted(version), "installed": versions, "built_at": int(time.time()),
            "build_seconds": took}
    (tmp / STAMP).write_text(json.dumps(data, indent=2) + "\n")
    old = root.with_name(f".{root.name}.old-{os.getpid()}")
    if root.exists():
        root.rename(old)
    tmp.rename(root)
    shutil.rmtree(old, ignore_errors=True)
    print(f"lab: Slurm {versions.get('slurmctld')} root ready in {took}s", file=sys.stderr)


# sid's Release file is past its Valid-Until on a frozen mirror: don't check it.
INSTALL_SCRIPT = r"""
set -e
root=$1; shift
mount -t proc proc "$root/proc"
export DEBIAN_FRONTEND=noninteractive
chroot "$root" apt-get -q -o Acquire::Check-Valid-Until=false update
chroot "$root" apt-get -q -y --no-install-recommends install "$@"
chroot "$root" apt-get clean
"""


def step(out: TextIO, log: Path, what: str, argv: list[str]) -> None:
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                            check=False, env=dict(os.environ, LC_ALL="C"))
    if result.returncode != 0:
        lines = log.read_text(errors="replace").splitlines()[-20:]
        raise LabError(f"{what} failed (exit {result.returncode}):\n" + "\n".join(lines))


def installed(root: Path) -> dict[str, str]:
    out = subprocess.run(["chroot", str(root), "dpkg-query", "-W", "-f=${Package} ${Version}\\n",
                          *PACKAGES], capture_output=True, text=True, check=False).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def inside(root: Path, relative: str) -> Path:
    """`relative` in the root with its symlinks followed as inside it (absolute ones too)."""
    path = root / relative
    for _ in range(40):
        if not path.is_symlink():
            return path
        target = os.readlink(path)
        path = root / target.lstrip("/") if target.startswith("/") else path.parent / target
    raise LabError(f"too many symlinks: {root / relative}")


def loader_argv(root: Path, binary: str) -> list[str]:
    """Run one of the root's programs on the host: the root's own loader and libraries."""
    paths = ":".join(str(root / p) for p in LIBRARY_PATH)
    return [str(inside(root, "lib64/ld-linux-x86-64.so.2")), "--library-path", paths,
            "--argv0", Path(binary).name, str(inside(root, binary))]


def daemon_argv(layout: Layout, argv: list[str], name: str) -> list[str]:
    """A Slurm daemon's argv: unchanged for the host's Slurm, else chrooted into its root."""
    root = root_of(layout, name)
    if root is None:
        return argv
    link_roots(root)
    binds = [layout.root, REPO_DIR, Path("/root"), Path("/home")]
    if any(" " in str(path) for path in binds):
        raise LabError(f"paths with spaces cannot be bound into the Slurm root: {binds}")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", CHROOT_SCRIPT,
            "lab-root", str(root), " ".join(map(str, binds)), *argv]


def plugin_dir(layout: Layout) -> str | None:
    """slurm.conf's PluginDir: $LAB/etc/slurm-plugins, a link to slurmctld's root's plugins.
    On the host (the clients) that is slurmctld's release; inside any root's chroot the
    link's target leads to that root's own plugins (`link_roots`), so one slurm.conf serves
    daemons of several releases."""
    if current(layout) is None:
        return None
    link_plugins(layout, root_of(layout, "slurmctld"))
    return str(layout.etc / PLUGIN_LINK)


def link_plugins(layout: Layout, root: Path | None) -> None:
    if root is None:
        return
    link, target = layout.etc / PLUGIN_LINK, root / PLUGINS
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    tmp = layout.etc / f".{PLUGIN_LINK}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target)
    tmp.replace(link)


def link_roots(root: Path) -> None:
    """ROOT/<path of each root of the cache> -> /: inside the chroot, its own host path and
    its siblings' lead to its / (Slurm refuses a PluginDir that does not exist; a daemon of
    one release reads the other's PluginDir path as its own plugins)."""
    for name in {root.name, *SUITES.values()}:
        link = root / str(root.parent / name).lstrip("/")
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):  # another lab linked it meanwhile
                link.symlink_to("/")


def select(layout: Layout, version: str) -> Path | None:
    """Record the lab's Slurm (building its root when needed); client wrappers in $LAB/bin."""
    root = ensure(version) if suite(version) else None
    layout.etc.mkdir(parents=True, exist_ok=True)
    forget_other_release(layout, version)
    (layout.etc / DAEMONS_FILE).unlink(missing_ok=True)  # every daemon on the one root again
    if root:
        link_roots(root)
        # slurmrestd reads slurm.conf as `slurm` (keys stay 0600): the folders let it pass
        layout.root.chmod(layout.root.stat().st_mode & 0o7777 | 0o111)
        layout.etc.chmod(0o711)
    (layout.etc / ROOT_FILE).write_text(f"{root or ''}\n")
    write_clients(layout, root)
    return root


def forget_other_release(layout: Layout, version: str) -> None:
    """Slurm state written by another release goes (slurmctld's state, spool, MariaDB's data:
    Slurm refuses downgrades and upgrades past two or three releases). Folders from before
    `--slurm` hold 22.05's. Accounts and QOS are made again at `up`; job history is lost."""
    marker = layout.state / "slurm-release"
    try:
        before = marker.read_text().strip()
    except OSError:
        before = HOST_VERSION if (layout.state / "slurmctld").exists() else version
    if before != version:
        print(f"lab: removing Slurm {before}'s state, accounting database and spool from "
              f"{layout.root} for Slurm {version}", file=sys.stderr)
        for path in (layout.state / "slurmctld", layout.spool, layout.mysql):
            shutil.rmtree(path, ignore_errors=True)
        layout.make_dirs()
    marker.write_text(f"{version}\n")


def write_clients(layout: Layout, root: Path | None) -> None:
    """$LAB/bin/scontrol etc. for a root's Slurm (removed for the host's): the root's client
    with the lab's SLURM_CONF unless one is set; inside the chroot (a job's PATH) the root's
    own binary."""
    layout.bin.mkdir(parents=True, exist_ok=True)
    for name in CLIENTS:
        path = layout.bin / name
        if path.is_file() and WRAPPER_MARK in path.read_text(errors="replace"):
            path.unlink()
        binary = f"usr/bin/{name}"
        if root is None or not inside(root, binary).exists():
            continue
        argv = " ".join(loader_argv(root, binary))
        path.write_text(f"""#!/bin/sh
{WRAPPER_MARK} ({root})
: "${{SLURM_CONF:={layout.slurm_conf}}}"
export SLURM_CONF
[ -x {root / binary} ] || exec /{binary} "$@"
exec {argv} "$@"
""")
        path.chmod(0o755)
