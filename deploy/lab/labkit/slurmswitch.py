"""`lab slurm-install`: one Slurm daemon switched to another release the lab can run.

The daemon stops, its root changes ($LAB/etc/slurm-daemons.json), it starts again and is
waited for; state, spool and the accounting database stay (slurmdbd converts it as it
starts). Downgrades and mixes Slurm does not allow are refused before anything changes.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from . import daemons as d
from . import procs, roots
from .layout import Info, LabError, Layout

# Slurm's releases in order: the span rule counts releases, not years.
RELEASES = ["22.05", "23.02", "23.11", "24.05", "24.11", "25.05", "25.11", "26.05", "26.11"]
SLURM_DAEMONS = ("slurmdbd", "slurmctld")


def parse(version: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d{2}\.\d{2}\.\d+", version):
        raise LabError(f"VERSION must look like 26.05.5, not {version!r}")
    return tuple(int(part) for part in version.split("."))


def releases_apart(old: str, new: str) -> int:
    known = [r for r in (old[:5], new[:5]) if r in RELEASES]
    if len(known) < 2:
        return 0  # a release we do not know: no opinion
    return RELEASES.index(new[:5]) - RELEASES.index(old[:5])


def allowed_apart(newest: str) -> int:
    """Slurm: a daemon talks to others up to 2 releases older, 3 from 24.11 on."""
    return 3 if parse(newest) >= (24, 11, 0) else 2


def names(info: Info) -> list[str]:
    """The lab's Slurm daemons (slurmrestd follows slurmctld)."""
    return [*SLURM_DAEMONS, *(f"slurmd-{n}" for n in info.get("slurmd_nodes", []))]


def versions(layout: Layout, info: Info) -> dict[str, str]:
    """Each Slurm daemon's version (from its root), slurmrestd included."""
    seen: dict[Path | None, str] = {}
    out = {}
    for name in [*names(info), "slurmrestd"]:
        root = roots.root_of(layout, name)
        if root not in seen:
            seen[root] = roots.release(root)
        out[name] = seen[root]
    return out


def locate(layout: Layout, version: str) -> Path | None:
    """The root that runs `version` (built when missing); None for the host's Slurm."""
    parse(version)
    major = version[:5]
    if major == roots.HOST_VERSION:
        have = roots.release(None)
        if have == version:
            return None
    elif major in roots.SUITES:
        root = roots.ensure(major)
        have = roots.release(root)
        if have == version:
            return root
    runnable = [roots.release(None) + " (the host's packages)"]
    for release, suite in roots.SUITES.items():
        cached = roots.cache_dir() / suite
        shown = roots.release(cached) if cached.is_dir() else f"{release}.x"
        runnable.append(f"{shown} (Debian {suite} root)")
    raise LabError(f"the lab cannot run Slurm {version}: it runs {', '.join(runnable)}")


def no_downgrade(layout: Layout, info: Info, name: str, version: str) -> str:
    """Refuse a downgrade, changing nothing. Returns the daemon's version now."""
    have = versions(layout, info)[name]
    if parse(version) < parse(have):
        data = {"slurmdbd": "the accounting database", "slurmctld": "its state save"}
        raise LabError(f"{name} runs Slurm {have}: {version} would be a downgrade, which "
                       f"Slurm does not support ({data.get(name, 'its spool')} is "
                       f"{have}'s); nothing changed")
    return have


def check(layout: Layout, info: Info, name: str, version: str, root: Path | None) -> str:
    """Refuse, changing nothing, what Slurm would refuse. Returns the daemon's version now."""
    now = versions(layout, info)
    have = no_downgrade(layout, info, name, version)
    if root == roots.root_of(layout, name):
        return have
    if roots.current(layout) is None:
        raise LabError(f"this lab runs the host's Slurm {have}; other releases run in labs "
                       "started with `lab up --slurm 24.11|26.05` (Slurm cannot upgrade "
                       f"{have[:5]} to {version[:5]}: too many releases apart)")
    plugins = f"PluginDir={layout.etc / roots.PLUGIN_LINK}"
    if plugins not in layout.slurm_conf.read_text():
        raise LabError(f"{layout.slurm_conf} predates release switching (no {plugins}): "
                       "`lab down` and `lab up` again first")
    order_problem = order(now | {name: version})
    if order_problem:
        raise LabError(f"{name} {version}: {order_problem}; nothing changed")
    return have


def order(after: dict[str, str]) -> str | None:
    """What Slurm would refuse in this mix: slurmdbd >= slurmctld >= every slurmd, the
    oldest at most 2 (3) releases behind the newest."""
    dbd, ctld = after["slurmdbd"], after["slurmctld"]
    if parse(ctld) > parse(dbd):
        return (f"slurmctld would run {ctld}, newer than slurmdbd's {dbd}: upgrade slurmdbd "
                "first (Slurm: slurmdbd >= slurmctld >= slurmd)")
    newer = sorted(n for n, v in after.items()
                   if n.startswith("slurmd-") and parse(v) > parse(ctld))
    if newer:
        return (f"slurmd on {', '.join(n[7:] for n in newer)} would be newer than slurmctld's "
                f"{ctld}: upgrade slurmctld first (Slurm: slurmdbd >= slurmctld >= slurmd)")
    values = [v for n, v in after.items() if n != "slurmrestd"]
    oldest, newest = min(values, key=parse), max(values, key=parse)
    apart, limit = releases_apart(oldest, newest), allowed_apart(newest)
    if apart > limit:
        return (f"{oldest} and {newest} would be {apart} releases apart; Slurm allows at "
                f"most {limit}")
    return None


def node_version(layout: Layout, node: str) -> tuple[str, str]:
    """(Version=, State=) of `scontrol show node NODE`."""
    out = d.run(["scontrol", "show", "node", "-o", node], env=d.slurm_env(layout)).stdout
    fields = dict(part.split("=", 1) for part in out.split() if "=" in part)
    return fields.get("Version", ""), fields.get("State", "")


def wait_slurmd(layout: Layout, daemon: d.Daemon, node: str, version: str) -> None:
    """Until NODE's slurmd registered with VERSION and responds."""
    def ready() -> bool:
        seen, state = node_version(layout, node)
        return seen == version and "NOT_RESPONDING" not in state and bool(state)

    d.wait_for(ready, f"{daemon.name} registered at Slurm {version}", daemon.logs,
               pid=procs.running_pid(layout, daemon.name))


def restart(layout: Layout, name: str, root: Path | None,
            make: Callable[[str], d.Daemon]) -> float:
    """Stop daemon `name`, move it to `root` (slurmctld: the clients and the PluginDir link
    too), start it from a fresh `make(name)` and wait until ready. Returns seconds."""
    began = time.monotonic()
    procs.stop(layout, [name])
    if root is not None:
        roots.set_root(layout, name, root)
        if name == "slurmctld":
            roots.link_plugins(layout, root)
            roots.write_clients(layout, root)
    d.start(layout, make(name))
    return time.monotonic() - began


def rest_after(layout: Layout, info: Info, make: Callable[[str], d.Daemon]) -> None:
    """slurmrestd follows slurmctld's release; lab.json's api_version with it."""
    root = roots.root_of(layout, "slurmctld")
    if root is None or roots.root_of(layout, "slurmrestd") == root:
        return
    restart(layout, "slurmrestd", root, make)
    info["slurmrestd"]["api_version"] = d.rest_api_version(info["slurmrestd"]["url"],
                                                           info["jwt"]["token"])


def record(layout: Layout, info: Info) -> dict[str, str]:
    """lab.json and state/slurm-release after a switch: the clients' (slurmctld's) release
    is the lab's; the newest daemon's release owns the state (down/up keeps it only then)."""
    now = versions(layout, info)
    root = roots.root_of(layout, "slurmctld")
    info["slurm_daemons"] = now
    info["slurm_version"] = now["slurmctld"]
    major = now["slurmctld"][:5]
    info["slurm"] = {**info.get("slurm", {}), "version": major, "suite": roots.SUITES.get(major),
                     "root": str(root) if root else None}
    newest = max((v for n, v in now.items() if n != "slurmrestd"), key=parse)
    (layout.state / "slurm-release").write_text(f"{newest[:5]}\n")
    return now
