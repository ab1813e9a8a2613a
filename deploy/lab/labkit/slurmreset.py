"""`lab reset`'s Slurm part: no jobs, no reservations, nodes idle with no features.

Nodes running slurmd are resumed (and pending reboots cancelled); the others (scale labs)
keep the state they start in (unknown, not responding) and only lose a drain.
"""
from __future__ import annotations

import re
import time

from . import daemons as d
from .layout import Info, LabError, Layout
from .mig import hostlist

SETTLE_TIMEOUT = 30.0
FIELD = re.compile(r"(\w+)=(\S*)")
NO_FEATURES = ("", "(null)")
NEEDS_RESUME = {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING"}
REBOOTING = {"REBOOT_REQUESTED", "REBOOT_ISSUED"}


def scontrol(layout: Layout, *args: str) -> str:
    out = d.run(["scontrol", *args], env=d.slurm_env(layout), timeout=60)
    if out.returncode != 0:
        raise LabError(f"scontrol {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


def job_ids(layout: Layout) -> list[str]:
    out = d.run(["squeue", "--all", "-h", "-o", "%A"], env=d.slurm_env(layout))
    if out.returncode != 0:
        raise LabError(f"squeue failed: {out.stderr.strip()}")
    return out.stdout.split()


def cancel_jobs(layout: Layout) -> int:
    """scancel every job, then wait until squeue lists none."""
    ids = job_ids(layout)
    if ids:
        d.run(["scancel", *ids], env=d.slurm_env(layout))
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while (left := job_ids(layout)) and time.monotonic() < deadline:
        time.sleep(0.3)
    if left:
        raise LabError(f"jobs still listed {SETTLE_TIMEOUT:.0f}s after scancel: {left}")
    return len(ids)


def delete_reservations(layout: Layout) -> list[str]:
    names = re.findall(r"ReservationName=(\S+)", scontrol(layout, "-o", "show", "reservation"))
    for name in names:
        scontrol(layout, "delete", f"ReservationName={name}")
    return names


def nodes(layout: Layout) -> dict[str, Info]:
    """NodeName -> {State: [flags], AvailableFeatures, ActiveFeatures} from scontrol."""
    found = {}
    for line in scontrol(layout, "-o", "show", "node").splitlines():
        fields = dict(FIELD.findall(line.split(" Reason=")[0]))
        if "NodeName" in fields:
            fields["flags"] = set(fields.get("State", "").split("+"))
            found[fields["NodeName"]] = fields
    return found


def clear_features(layout: Layout, now: dict[str, Info]) -> list[str]:
    """slurm.conf gives the lab's nodes no features: remove any set since."""
    names = [n for n, f in now.items() if f.get("AvailableFeatures") not in NO_FEATURES
             or f.get("ActiveFeatures") not in NO_FEATURES]
    if names:
        scontrol(layout, "update", f"NodeName={hostlist(names)}", "AvailableFeatures=",
                 "ActiveFeatures=")
    return names


def restore_nodes(layout: Layout, info: Info) -> list[str]:
    """Nodes running slurmd back to idle; a drain on the others undone. Returns the nodes
    whose state was changed."""
    now = nodes(layout)
    live = set(info["slurmd_nodes"])
    rebooting = [n for n in live if now.get(n, {}).get("flags", set()) & REBOOTING]
    if rebooting:
        scontrol(layout, "cancel_reboot", hostlist(sorted(rebooting)))
    resume = sorted(n for n in live if now.get(n, {}).get("flags", set()) & NEEDS_RESUME)
    if resume:
        scontrol(layout, "update", f"NodeName={hostlist(resume)}", "State=RESUME")
    undrain = sorted(n for n, f in now.items() if n not in live and f["flags"] & {"DRAIN"})
    if undrain:  # on an UNKNOWN node Slurm 22.05 drops the drain but answers "Invalid node
        # state specified": check the outcome instead
        d.run(["scontrol", "update", f"NodeName={hostlist(undrain)}", "State=UNDRAIN"],
              env=d.slurm_env(layout), timeout=60)
        still = [n for n, f in nodes(layout).items() if n in undrain and "DRAIN" in f["flags"]]
        if still:
            raise LabError(f"nodes still drained after State=UNDRAIN: {hostlist(still)}")
    wait_idle(layout, sorted(live))
    return sorted({*rebooting, *resume, *undrain})


def wait_idle(layout: Layout, names: list[str]) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        now = nodes(layout)
        busy = {n: now[n].get("State") for n in names if now.get(n, {}).get("State") != "IDLE"}
        if not busy:
            return
        if time.monotonic() > deadline:
            raise LabError(f"nodes not idle {SETTLE_TIMEOUT:.0f}s after the reset: {busy}")
        time.sleep(0.3)
