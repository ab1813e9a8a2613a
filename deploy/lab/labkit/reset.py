"""`lab reset`: a running lab back to the state `lab up` leaves, without restarting it.

Slurm (slurmreset), faults and MIG layouts, the Kubernetes API (restarted on its seed),
Alertmanager's silences and alerts, the Slack fake, and the bot's SQLite database.
"""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from . import daemons as d
from . import kube, monitoring, procs, slack, slackclient, slurmreset
from .layout import Info, LabError, Layout, Ports

QUIET_TIMEOUT = 15.0
SQLITE = "sqlite:///"
DB_SUFFIXES = ("", "-wal", "-shm", "-journal")
Step = tuple[str, str]  # (what, what was done)


def http_json(url: str, method: str = "GET", body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raise LabError(f"{method} {url}: HTTP {exc.code} {exc.read()[:200]!r}") from None
    except OSError as exc:
        raise LabError(f"{method} {url}: {exc}") from None
    return json.loads(raw) if raw else None


def clear_faults(layout: Layout, kube_daemon: d.Daemon) -> list[str]:
    """Every node's fault file and MIG layout, with the API server stopped meanwhile and
    restarted on a fresh state file (it seeds the pool again and writes the pool's driver
    fault files, as at `lab up`). Returns the nodes whose MIG layout was set: their Slurm
    config must follow (the caller restarts slurmctld and their slurmd)."""
    procs.stop(layout, [kube.NAME])
    for path in layout.faults.glob("*.json"):
        path.unlink(missing_ok=True)
    mig_dir = layout.state / "mig"
    mig_nodes = sorted(p.name for p in mig_dir.glob("*")) if mig_dir.is_dir() else []
    for name in mig_nodes:
        (mig_dir / name).unlink(missing_ok=True)
    kube.fresh_state(layout)
    d.start(layout, kube_daemon)
    return [n for n in mig_nodes if not n.startswith(".")]


def firing_in_prometheus(ports: Ports) -> int:
    found = http_json(f"{monitoring.url(ports, monitoring.PROMETHEUS)}/api/v1/alerts")
    return len(found["data"]["alerts"])


def wait_quiet(ports: Ports) -> int:
    """Wait until Prometheus has no alert pending or firing (the faults are gone: a scrape and
    an evaluation later); how many are left at the timeout."""
    deadline = time.monotonic() + QUIET_TIMEOUT
    while (left := firing_in_prometheus(ports)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def quiet_alerts(ports: Ports, rounds: int = 3) -> str:
    """Prometheus quiet, then Alertmanager's alerts ended and silences expired; again while
    Prometheus sent a new one meanwhile (an alert whose `for:` ran out while the faults were
    being cleared under load reaches Alertmanager after its reset)."""
    said = ""
    for _ in range(rounds):
        left = wait_quiet(ports)
        silences, ended = reset_alertmanager(ports)
        said = (f"{left} alerts still firing in Prometheus; expired {silences} silences, "
                f"ended {ended} alerts")
        time.sleep(1.5)  # one evaluation and one send of Prometheus (resend delay 2 s)
        if not firing_in_prometheus(ports) and not active_in_alertmanager(ports):
            break
    return said


def active_in_alertmanager(ports: Ports) -> int:
    am = f"{monitoring.url(ports, monitoring.ALERTMANAGER)}/api/v2"
    return len(http_json(f"{am}/alerts"))


def iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


def reset_alertmanager(ports: Ports) -> tuple[int, int]:
    """Expire every silence and end every alert (re-posted with endsAt now; startsAt must
    come before it, and an alert posted with only endsAt starts then)."""
    am = f"{monitoring.url(ports, monitoring.ALERTMANAGER)}/api/v2"
    silences = [s for s in http_json(f"{am}/silences") if s["status"]["state"] != "expired"]
    for s in silences:
        http_json(f"{am}/silence/{s['id']}", method="DELETE")
    alerts = http_json(f"{am}/alerts")
    now = datetime.now(UTC)
    if alerts:  # (an empty generatorURL is refused: not a URI)
        http_json(f"{am}/alerts", method="POST", body=[
            {"labels": a["labels"], "annotations": a.get("annotations", {}),
             "startsAt": iso(min(datetime.fromisoformat(a["startsAt"]),
                                 now - timedelta(seconds=1))),
             "endsAt": iso(now),
             **({"generatorURL": a["generatorURL"]} if a.get("generatorURL") else {})}
            for a in alerts])
    return len(silences), len(alerts)


def bot_database(layout: Layout) -> str:
    """Delete the bot's SQLite database (the lab's bot.yaml: database_url) and its audit
    checkpoints; a bot running on them keeps its open handle, so stop it first."""
    text = layout.bot_yaml.read_text() if layout.bot_yaml.exists() else ""
    found = re.search(r"^database_url:\s*(\S+)", text, re.MULTILINE)
    url = found.group(1) if found else ""
    if not url.startswith(SQLITE):
        return f"left alone: not a SQLite database ({url or 'no database_url'})"
    path = url[len(SQLITE):]
    gone = [p for s in DB_SUFFIXES if (p := layout.root / f"{path}{s}") and p.exists()]
    for p in [*gone, layout.root / "audit.checkpoints"]:
        p.unlink(missing_ok=True)
    return f"deleted {path}" if gone else f"{path} already absent"


def forget_slack(ports: Ports) -> str:
    slackclient.reset(slack.url(ports))
    return "messages, calls, acks and faults forgotten"


def timed(steps: list[Step], what: str, action: Callable[[], str]) -> None:
    began = time.monotonic()
    done = action()
    steps.append((what, f"{done} ({time.monotonic() - began:.1f}s)"))


def services(layout: Layout, info: Info, steps: list[Step]) -> None:
    """Alerts (once the cleared faults stopped them firing), Slack and the bot's database."""
    ports = Ports(info["port_base"], len(info["nodes"]))
    timed(steps, "alerts", lambda: quiet_alerts(ports))
    if procs.running_pid(layout, slack.NAME):
        timed(steps, "slack", lambda: forget_slack(ports))
    timed(steps, "bot database", lambda: bot_database(layout))


def slurm(layout: Layout, info: Info, steps: list[Step]) -> None:
    timed(steps, "slurm jobs", lambda: f"cancelled {slurmreset.cancel_jobs(layout)}")
    timed(steps, "reservations",
          lambda: f"deleted {len(slurmreset.delete_reservations(layout))}")


def check_running(layout: Layout, info: Info) -> None:
    missing = [n for n in ("slurmctld", kube.NAME, monitoring.ALERTMANAGER)
               if not procs.running_pid(layout, n)]
    if "nodes" not in info or missing:
        raise LabError(f"the lab at {layout.root} is not running"
                       + (f" ({', '.join(missing)} stopped)" if "nodes" in info else "")
                       + "; `lab up` starts it")


def report(steps: list[Step], took: float) -> str:
    width = max(len(what) for what, _ in steps)
    lines = [f"  {what:<{width}}  {done}" for what, done in steps]
    return "\n".join([*lines, f"lab reset in {took:.1f}s"])


def node_steps(layout: Layout, info: Info, steps: list[Step]) -> None:
    timed(steps, "slurm nodes",
          lambda: f"restored {len(slurmreset.restore_nodes(layout, info))} (now idle)")
    timed(steps, "features", lambda: "cleared on "
          f"{len(slurmreset.clear_features(layout, slurmreset.nodes(layout)))} nodes")


def faults(layout: Layout, kube_daemon: d.Daemon, steps: list[Step]) -> list[str]:
    began = time.monotonic()
    mig_nodes = clear_faults(layout, kube_daemon)
    steps.append(("faults", "cleared; Kubernetes API restarted on its seed"
                  + (f"; MIG layouts reset on {', '.join(mig_nodes)}" if mig_nodes else "")
                  + f" ({time.monotonic() - began:.1f}s)"))
    return mig_nodes
