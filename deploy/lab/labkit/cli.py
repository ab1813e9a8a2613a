"""The `lab` command: up, down, status, env, fault, driver, service, slack."""
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import daemons as d
from . import (
    etcd,
    faults,
    kube,
    mig,
    monitoring,
    otlp,
    packages,
    procs,
    render,
    reset,
    roots,
    rsyslog,
    slack,
    slackclient,
    slurmswitch,
)
from .layout import (
    ACCOUNT,
    CAPPED_QOS,
    CAPPED_QOS_GPUS,
    CLUSTER,
    DEFAULT_DRIVER,
    DEFAULT_NODES,
    GPU_TYPE,
    GPUS_PER_NODE,
    MAX_NODES,
    MAX_SLURMD,
    MAX_SOCKET_PATH,
    PARTITION,
    QOS,
    SCALE_KUBE_NODES,
    SCALE_NODES,
    SECOND_ACCOUNT,
    SERVICE_OFFSETS,
    Info,
    LabError,
    Layout,
    Ports,
    lab_dir,
    node_names,
    pick_ports,
)

# Scale labs define many nodes but run slurmd for only the first few.
ALL_SLURMD_UP_TO = 16
SCALE_SLURMD = 4
# Stop order: clients of a daemon go before the daemon.
STOP_GROUPS = [["slack", "rsyslog", "otlp"], ["prometheus"], ["alertmanager", "dcgm"],
               ["kubeapi"], ["etcd"], ["slurmrestd"], ["slurmd-*"], ["slurmctld"], ["slurmdbd"],
               ["mariadb"], ["munge"]]


def registry(layout: Layout, info: Info) -> list[d.Daemon]:
    """Every daemon of the lab, in start order."""
    ports, nodes, started = ports_of(info), info["nodes"], info["slurmd_nodes"]
    return [
        d.munge(layout),
        d.mariadb(layout, ports),
        d.slurmdbd(layout, ports),
        d.slurmctld(layout, ports),
        *(d.slurmd(layout, ports, n, nodes.index(n)) for n in started),
        d.slurmrestd(layout, ports),
        kube.daemon(layout, ports, *kube.of(info)),
        etcd.daemon(layout, ports),
        *monitoring.daemons(layout, ports, watched(info)),
        slack.daemon(layout, ports),
        *audit_receivers(layout, ports),
    ]


def watched(info: Info) -> list[str]:
    """The nodes with GPU telemetry: all of them, but in scale labs only the nodes running
    slurmd and the first Kubernetes nodes (1,500 scrape targets a second cost a core)."""
    slurm, (pool, _) = info["nodes"], kube.of(info)
    if len(slurm) > ALL_SLURMD_UP_TO:
        slurm = info["slurmd_nodes"]
    if len(pool) > ALL_SLURMD_UP_TO:
        pool = pool[:SCALE_SLURMD]
    return monitoring.nodes_of(slurm, pool)


def audit_receivers(layout: Layout, ports: Ports) -> list[d.Daemon]:
    """rsyslogd and the OTLP receiver; the latter only where a Python with
    opentelemetry-proto is (the project's venv: `make venv`)."""
    receiver = otlp.daemon(layout, ports)
    return [rsyslog.daemon(layout, ports), *([receiver] if receiver else [])]


@contextmanager
def locked(layout: Layout) -> Iterator[None]:
    """Serialise up/down/service so parallel callers (CI, xdist) don't race."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with open(layout.root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def running_daemons(layout: Layout, info: Info) -> dict[str, int]:
    names = list(info.get("daemons", {})) or [p.stem for p in layout.pids.glob("*.pid")]
    return {n: pid for n in names if (pid := procs.running_pid(layout, n))}


def ports_of(info: Info) -> Ports:
    return Ports(info["port_base"], len(info["nodes"]))


# --- up --------------------------------------------------------------------

def plan(layout: Layout, info: Info, nodes_arg: int | None, slurmd_arg: int | None,
         kube_arg: int | None = None, slurm_arg: str | None = None) -> Info:
    """Reuse a running lab's shape; otherwise pick nodes and free ports."""
    if running_daemons(layout, info):
        if nodes_arg not in (None, len(info["nodes"])) or kube_arg not in (
                None, len(kube.of(info)[0])):
            raise LabError(f"lab at {layout.root} runs {len(info['nodes'])} nodes and "
                           f"{len(kube.of(info)[0])} Kubernetes nodes; run `lab down` "
                           "before changing --nodes or --kube-nodes")
        have = slurm_of(info)
        if slurm_arg not in (None, have):
            raise LabError(f"lab at {layout.root} runs Slurm {have}; run `lab down` before "
                           "changing --slurm")
        return info
    count = nodes_arg or DEFAULT_NODES  # a stopped lab takes today's default shape
    if not 1 <= count <= MAX_NODES:
        raise LabError(f"--nodes must be between 1 and {MAX_NODES}")
    if kube_arg is not None and not 1 <= kube_arg <= MAX_NODES:
        raise LabError(f"--kube-nodes must be between 1 and {MAX_NODES}")
    if slurmd_arg is not None and not 1 <= slurmd_arg <= MAX_SLURMD:
        raise LabError(f"--slurmd must be between 1 and {MAX_SLURMD}")
    nodes = node_names(count)
    default_started = count if count <= ALL_SLURMD_UP_TO else SCALE_SLURMD
    started = nodes[: min(slurmd_arg or default_started, count)]
    ports = pick_ports(layout.root, count, info.get("port_base"))
    planned = base_info(layout, ports, nodes, started)
    version = slurm_arg or roots.HOST_VERSION  # a stopped lab takes the host's Slurm too
    planned["slurm"] = {"version": version, "suite": roots.suite(version)}
    if kube_arg is not None:  # else today's pool (kube.KUBE_NODES): lab.json stays as it was
        planned["kube_nodes"], planned["handoff_nodes"] = kube.shape(nodes, started, kube_arg)
    return planned


def slurm_of(info: Info) -> str:
    """The lab's Slurm release (lab up --slurm); labs made before it have the host's."""
    return str(info.get("slurm", {}).get("version", roots.HOST_VERSION))


def base_info(layout: Layout, ports: Ports, nodes: list[str], started: list[str]) -> Info:
    return {
        "state": "starting",
        "lab_dir": str(layout.root),
        "slurm_conf": str(layout.slurm_conf),
        "bot_config": str(layout.bot_yaml),
        "bin_dir": str(layout.bin),
        "faults_dir": str(layout.faults),
        "log_dir": str(layout.log),
        "cluster": CLUSTER, "partition": PARTITION, "account": ACCOUNT, "qos": QOS,
        "second_account": SECOND_ACCOUNT, "capped_qos": CAPPED_QOS,
        "capped_qos_gpus": CAPPED_QOS_GPUS,
        "user": "root", "gpu_type": GPU_TYPE, "gpus_per_node": GPUS_PER_NODE,
        "default_driver_version": DEFAULT_DRIVER,
        "nodes": nodes, "slurmd_nodes": started,
        "port_base": ports.base,
        "ports": {
            **{name: ports.service(name) for name in SERVICE_OFFSETS},
            "slurmd": {n: ports.slurmd(i) for i, n in enumerate(nodes)},
        },
        "munge": {"socket": str(layout.munge_socket), "key": str(layout.etc / "munge.key")},
        "mariadb": {
            "socket": str(layout.mariadb_socket), "host": "127.0.0.1",
            "port": ports.service("mariadb"), "user": render.MARIADB_USER,
            "password": render.MARIADB_PASSWORD, "database": render.MARIADB_DATABASE,
            "admin_user": "root (unix socket auth, as OS root)",
        },
        "slurmrestd": {"url": f"http://127.0.0.1:{ports.service('slurmrestd')}"},
    }


def write_secret(path: Path, size: int) -> None:
    """Random key, mode 0600 from the start (Slurm refuses readable keys)."""
    if not path.exists():
        path.touch(mode=0o600)
        path.write_bytes(os.urandom(size))


def check_socket_paths(layout: Layout) -> None:
    for path in (layout.munge_socket, layout.mariadb_socket):
        if len(str(path)) > MAX_SOCKET_PATH:
            raise LabError(f"socket path too long for unix sockets: {path}; "
                           "use a shorter RUNBOOK_LAB_DIR")


def bring_up(layout: Layout, info: Info) -> list[str]:
    """Start whatever is not running, in dependency order. Returns started names."""
    everything = registry(layout, info)
    by_name = {daemon.name: daemon for daemon in everything}
    started = []
    for name in ("munge", "mariadb", "slurmdbd", "slurmctld"):
        if d.start(layout, by_name[name]):
            started.append(name)
        if name == "mariadb":
            d.grant_slurm_user(layout)
        if name == "slurmdbd":
            d.ensure_accounting(layout)
        if name == "slurmctld":
            d.ensure_fairshare_accounting(layout)
    slurmds = [x for x in everything if x.name.startswith("slurmd-")]
    launched = [(x, *d.launch(layout, x)) for x in slurmds]  # all at once, then wait
    for daemon, pid, was_started in launched:
        d.wait_for(daemon.ready, f"{daemon.name} (node idle in sinfo)", daemon.logs, pid=pid)
        if was_started:
            started.append(daemon.name)
    if d.start(layout, by_name["slurmrestd"]):
        started.append("slurmrestd")
    if not procs.running_pid(layout, kube.NAME):
        kube.fresh_state(layout)  # a new API server starts from the seed
    kube.write_kubeconfig(layout, ports_of(info))
    if d.start(layout, by_name[kube.NAME]):
        started.append(kube.NAME)
    if d.start(layout, by_name[etcd.NAME]):
        started.append(etcd.NAME)
    for name in monitoring.NAMES:  # simulator, Alertmanager, then Prometheus
        if d.start(layout, by_name[name]):
            started.append(name)
    if not procs.running_pid(layout, slack.NAME):
        slack.fresh_state(layout)  # a new Slack fake starts with an empty workspace
    if d.start(layout, by_name[slack.NAME]):
        started.append(slack.NAME)
    for name in (rsyslog.NAME, otlp.NAME):
        if name not in by_name:
            print(f"lab: {name} not started: no Python with opentelemetry-proto "
                  f"(run `make venv` or set {otlp.PYTHON_ENV})", file=sys.stderr)
        elif d.start(layout, by_name[name]):
            started.append(name)
    return started


def finish_info(layout: Layout, info: Info) -> Info:
    token, expires = d.make_token(layout)
    url = info["slurmrestd"]["url"]
    info["slurmrestd"]["api_version"] = d.rest_api_version(url, token)
    info["jwt"] = {"user": "root", "token": token, "expires_at": expires,
                   "key_file": str(layout.jwt_key)}
    version = d.run(["sinfo", "--version"], env=d.slurm_env(layout)).stdout.split()
    info["slurm_version"] = version[-1] if version else "unknown"
    info["slurm_daemons"] = slurmswitch.versions(layout, info)  # differ after slurm-install
    info["kubeapi"] = kube.info(layout, ports_of(info), *kube.of(info))
    info["etcd"] = etcd.info(layout, ports_of(info))
    info["monitoring"] = monitoring.info(layout, ports_of(info), watched(info))
    info["slack"] = slack.info(layout, ports_of(info))
    info["audit_receivers"] = {"syslog": rsyslog.info(layout, ports_of(info)),
                               "otlp": otlp.info(layout, ports_of(info))}
    info["daemons"] = daemon_table(layout, info)
    info["state"] = "up"
    return info


def daemon_table(layout: Layout, info: Info) -> Info:
    everything = registry(layout, info)
    return {
        x.name: {"pid": procs.running_pid(layout, x.name), "port": x.port,
                 "logs": [str(p) for p in x.logs]}
        for x in everything
    }


def cmd_up(args: argparse.Namespace) -> int:
    layout = Layout(lab_dir())
    began = time.monotonic()
    with locked(layout):
        packages.ensure_packages(allow_install=not args.no_install,
                                 extra=[] if args.slurm in (None, roots.HOST_VERSION)
                                 else roots.HOST_TOOLS)
        if args.scale:
            args.nodes, args.kube_nodes = (args.nodes or SCALE_NODES,
                                           args.kube_nodes or SCALE_KUBE_NODES)
        info = plan(layout, layout.read_info(), args.nodes, args.slurmd, args.kube_nodes,
                    args.slurm)
        check_socket_paths(layout)
        layout.make_dirs()
        if not running_daemons(layout, info):
            root = roots.select(layout, slurm_of(info))  # before slurm.conf: its PluginDir
            info["slurm"]["root"] = str(root) if root else None
            render.write_slurm_files(layout, ports_of(info), info["nodes"])
            write_secret(layout.jwt_key, 32)
        faults.install_tools(layout)
        mig.write_config(layout)  # nvidia-mig-parted's config and the MIG device files
        info["daemons"] = daemon_table(layout, info)  # lets `down` clean up a failed start
        layout.write_info(info)
        started = bring_up(layout, info)
        if monitoring.ALERTMANAGER not in started:
            monitoring.refresh_alertmanager(layout, ports_of(info))
        info = finish_info(layout, info)
        layout.write_info(info)
        layout.bot_yaml.write_text(render.bot_yaml(layout, info["nodes"], ports_of(info),
                                                   info["slurmrestd"]["url"]))
    took = time.monotonic() - began
    if started:
        print(f"lab up at {layout.root}: {len(info['nodes'])} nodes, "
              f"{len(info['slurmd_nodes'])} slurmd, {len(kube.of(info)[0])} Kubernetes "
              f"nodes, started {len(started)} daemons in {took:.1f}s"
              + (f" (Slurm {info['slurm_version']})" if roots.current(layout) else ""))
    else:
        print(f"lab already running at {layout.root} ({len(info['nodes'])} nodes); nothing to do")
    print(f"  eval \"$({shlex.quote(sys.argv[0])} env)\"")
    return 0


# --- down ------------------------------------------------------------------

def stop_names(layout: Layout, info: Info) -> list[list[str]]:
    names = set(info.get("daemons", {})) | {p.stem for p in layout.pids.glob("*.pid")}
    groups = []
    for group in STOP_GROUPS:
        wanted = [n for n in sorted(names) if any(
            n == g or (g.endswith("*") and n.startswith(g[:-1])) for g in group)]
        groups.append(wanted)
    return groups


def cmd_down(args: argparse.Namespace) -> int:
    layout = Layout(lab_dir())
    if not layout.root.exists():
        print(f"no lab at {layout.root}")
        return 0
    with locked(layout):
        info = layout.read_info()
        running = running_daemons(layout, info)
        for group in stop_names(layout, info):
            procs.stop(layout, group)
        leftovers = procs.sweep(layout)
        if info:
            info["state"] = "down"
            info["daemons"] = daemon_table(layout, info) if "nodes" in info else {}
            layout.write_info(info)
    print(f"lab at {layout.root}: stopped {len(running)} daemons"
          + (f" and {len(leftovers)} leftover processes" if leftovers else ""))
    if args.purge:
        purge(layout)
    return 0


def purge(layout: Layout) -> None:
    # Refuse to delete anything that does not look like a lab folder.
    if not (layout.lab_json.exists() or layout.pids.is_dir()):
        raise LabError(f"{layout.root} does not look like a lab folder; not deleting it")
    shutil.rmtree(layout.root)
    print(f"removed {layout.root}")


# --- status / env / fault / driver / service ---------------------------------

def cmd_status(args: argparse.Namespace) -> int:
    layout = Layout(lab_dir())
    info = layout.read_info()
    if "nodes" not in info:
        print(f"no lab at {layout.root}")
        return 1
    all_up = True
    print(f"lab at {layout.root}")
    root = roots.root_of(layout, "slurmctld")
    versions = slurmswitch.versions(layout, info)
    mixed = len(set(versions.values())) > 1
    print(f"  slurm {info.get('slurm_version', slurm_of(info))} "
          + (f"from the Debian root {root}" if root else "(the host's packages)")
          + (" (clients follow slurmctld; daemons differ: see below)" if mixed else ""))
    for name, entry in daemon_table(layout, info).items():
        pid, port = entry["pid"], entry["port"]
        all_up &= pid is not None
        state = f"running  pid {pid:<7}" if pid else "stopped           "
        shown = f"  slurm {versions[name]}" if mixed and name in versions else ""
        print(f"  {name:<16} {state} port {port if port else '-'}{shown}")
    if "etcd" in info:
        print(f"  etcd data dir: {etcd.data_dir(layout)}")
    if "monitoring" in info:
        mon = info["monitoring"]
        print(f"  prometheus {mon['prometheus_url']}  alertmanager {mon['alertmanager_url']}  "
              f"dcgm {mon['dcgm_url']}  bot webhook {mon['bot_webhook_url']}")
    if "slack" in info:
        sl = info["slack"]
        print(f"  slack api {sl['api_url']}  channel {sl['channel']}  "
              f"bot events {sl['bot_events_url']}")
    if "audit_receivers" in info:
        ar = info["audit_receivers"]
        print(f"  audit log: syslog {ar['syslog']['address']} -> {ar['syslog']['received']}  "
              f"otlp {ar['otlp']['logs_url']} -> {ar['otlp']['received']}")
    if procs.running_pid(layout, "slurmctld"):
        out = d.run(["sinfo"], env=d.slurm_env(layout))
        print(out.stdout.rstrip() or out.stderr.rstrip())
    return 0 if all_up else 1


def cmd_env(args: argparse.Namespace) -> int:
    layout = Layout(lab_dir())
    exports = {
        "SLURM_CONF": str(layout.slurm_conf),
        "RUNBOOK_LAB_DIR": str(layout.root),
        "RUNBOOK_CONFIG": str(layout.bot_yaml),
        "KUBECONFIG": str(kube.kubeconfig_path(layout)),
    }
    mon = layout.read_info().get("monitoring")
    if mon:
        exports.update(PROMETHEUS_URL=mon["prometheus_url"],
                       ALERTMANAGER_URL=mon["alertmanager_url"])
    token = monitoring.read_alerts_token(layout)
    if token:  # what the bot's POST /alerts requires (server.alerts_token_file holds it too)
        exports["RUNBOOK_ALERTS_TOKEN"] = token
    etcd_info = layout.read_info().get("etcd")
    if etcd_info:
        exports.update(ETCDCTL_API="3", ETCDCTL_ENDPOINTS=etcd_info["endpoint"])
    # SLACK_API_URL, SLACK_BOT_TOKEN, SLACK_SIGNING_SECRET, LAB_SLACK_APP_TOKEN (never
    # SLACK_APP_TOKEN: its presence switches the bot to Socket Mode)
    exports.update(slack.env_exports(layout, layout.read_info()))
    receivers = layout.read_info().get("audit_receivers")
    if receivers:  # where the lab's bot.yaml ships the audit log (audit.ship)
        exports.update(LAB_SYSLOG_ADDRESS=receivers["syslog"]["address"],
                       LAB_SYSLOG_RECEIVED=receivers["syslog"]["received"],
                       LAB_OTLP_ENDPOINT=receivers["otlp"]["endpoint"],
                       LAB_OTLP_RECEIVED=receivers["otlp"]["received"])
    for key, value in exports.items():
        print(f"export {key}={shlex.quote(value)}")
    print(f"export PATH={shlex.quote(str(layout.bin))}:\"$PATH\"")
    return 0


def known_node(layout: Layout, node: str) -> None:
    nodes = layout.read_info().get("nodes")
    if node in kube.of(layout.read_info())[0] or node == kube.FAULT_NODE:
        return  # the Kubernetes pool's nodes and the API server itself
    if node in SLURM_INSTALL_TARGETS:
        return  # `install=fail` for slurm-install of slurmdbd or slurmctld
    if nodes and node not in nodes:
        raise LabError(f"unknown node {node!r}; lab nodes are {nodes[0]}..{nodes[-1]}")


def cmd_fault(args: argparse.Namespace) -> int:
    layout = Layout(lab_dir())
    known_node(layout, args.node)
    data = faults.apply(layout, args.node, args.pairs)
    print(json.dumps(data or {"node": args.node}, sort_keys=True))
    return 0


def cmd_swap(args: argparse.Namespace) -> int:
    layout = Layout(lab_dir())
    known_node(layout, args.node)
    if not 0 <= args.gpu < GPUS_PER_NODE:
        raise LabError(f"GPU must be 0..{GPUS_PER_NODE - 1}, got {args.gpu}")
    data = faults.swap(layout, args.node, args.gpu)
    print(json.dumps({"node": args.node, "gpu": args.gpu, "swaps": data["swaps"]},
                     sort_keys=True))
    return 0


def cmd_driver(args: argparse.Namespace) -> int:
    layout = Layout(lab_dir())
    known_node(layout, args.node)
    print(faults.driver(layout, args.node))
    return 0


def cmd_service(args: argparse.Namespace) -> int:
    layout = Layout(lab_dir())
    info = layout.read_info()
    if "nodes" not in info:
        raise LabError(f"no lab at {layout.root}; run `lab up` first")
    everything = registry(layout, info)
    by_name = {x.name: x for x in everything}
    daemon = by_name.get(args.name)
    if daemon is None:
        raise LabError(f"unknown service {args.name!r}; one of {', '.join(by_name)}")
    if args.action == "status":
        pid = procs.running_pid(layout, daemon.name)
        print(f"{daemon.name}: " + (f"running pid {pid}" if pid else "stopped"))
        return 0 if pid else 1
    with locked(layout):
        if args.action == "reboot" and not daemon.name.startswith("slurmd-"):
            raise LabError("only a node's slurmd can be rebooted (slurmd-gpuNN)")
        if args.action in ("stop", "restart", "reboot"):
            procs.stop(layout, [daemon.name])
        if args.action == "reboot":  # -b: slurmd reports that the node has just booted
            daemon = dataclasses.replace(daemon, argv=[*daemon.argv, "-b"])
        if args.action in ("start", "restart", "reboot"):
            d.start(layout, daemon)
            if daemon.name == "slurmctld":
                # Wait until the slurmds re-registered, so callers see a usable cluster.
                for x in everything:
                    if x.name.startswith("slurmd-") and procs.running_pid(layout, x.name):
                        d.wait_for(x.ready, x.name, x.logs)
        info["daemons"] = daemon_table(layout, info)
        layout.write_info(info)
    print(f"{daemon.name}: {args.action} done")
    return 0


def reload_slurm_conf(layout: Layout, info: Info, nodes: list[str]) -> None:
    """slurm.conf and gres.conf rendered again; slurmctld, then the nodes' slurmd restarted."""
    everything = registry(layout, info)
    by_name = {x.name: x for x in everything}
    render.write_slurm_files(layout, ports_of(info), info["nodes"])
    procs.stop(layout, [*(f"slurmd-{n}" for n in nodes), "slurmctld"])
    d.start(layout, by_name["slurmctld"])
    for x in everything:
        if x.name.startswith("slurmd-") and procs.running_pid(layout, x.name):
            d.wait_for(x.ready, x.name, x.logs)
    for node in nodes:
        d.start(layout, by_name[f"slurmd-{node}"])


def cmd_reset(args: argparse.Namespace) -> int:
    layout = Layout(lab_dir())
    info = layout.read_info()
    reset.check_running(layout, info)
    began, steps = time.monotonic(), []
    with locked(layout):
        everything = registry(layout, info)
        stopped = [x for x in everything if not procs.running_pid(layout, x.name)]
        for x in stopped:  # e.g. a slurmd a test stopped
            d.start(layout, x)
        steps.append(("daemons", "started " + (", ".join(x.name for x in stopped) or "none")))
        reset.slurm(layout, info, steps)
        mig_nodes = reset.faults(layout, {x.name: x for x in everything}[kube.NAME], steps)
        mig_nodes = [n for n in mig_nodes if n in info["slurmd_nodes"]]
        if mig_nodes:
            reload_slurm_conf(layout, info, mig_nodes)
        reset.node_steps(layout, info, steps)
        try:
            reset.services(layout, info, steps)
        finally:  # kubeapi (and maybe slurmds) got new pids, even when a step failed
            info["daemons"] = daemon_table(layout, info)
            layout.write_info(info)
    print(reset.report(steps, time.monotonic() - began))
    return 0


def cmd_mig_reload(args: argparse.Namespace) -> int:
    """The site's Slurm side of a MIG change: gres.conf and the node's Gres= in slurm.conf
    follow the node's layout; Slurm 22.05 needs slurmctld restarted (reconfigure leaves the
    node's CfgTRES stale and job steps fail) and the node's slurmd restarted, in this order
    with slurmd stopped meanwhile, so the node never registers against the old Gres."""
    layout = Layout(lab_dir())
    info = layout.read_info()
    if args.node not in info.get("slurmd_nodes", []):
        raise LabError(f"{args.node} runs no slurmd in this lab")
    with locked(layout):
        reload_slurm_conf(layout, info, [args.node])
        info["daemons"] = daemon_table(layout, info)
        layout.write_info(info)
    print(f"{args.node}: Gres={mig.slurm_gres(layout, args.node)}; slurmctld and "
          f"slurmd-{args.node} restarted")
    return 0


SLURM_INSTALL_TARGETS = ("slurmdbd", "slurmctld")


def cmd_slurm_install(args: argparse.Namespace) -> int:
    """The lab's stand-in for a site's Slurm package install (upgrade-slurm): DAEMON (NODE's
    slurmd) switched to VERSION, any release the lab runs (labkit/slurmswitch.py), and
    restarted; the same VERSION just restarts it. `lab fault slurmdbd|slurmctld|NODE
    install=fail` makes it fail first, changing nothing."""
    layout = Layout(lab_dir())
    info = layout.read_info()
    if args.daemon == "slurmd" and args.node not in info.get("slurmd_nodes", []):
        raise LabError(f"slurm-install slurmd needs a NODE that runs slurmd, not {args.node!r}")
    target = args.node if args.daemon == "slurmd" else args.daemon
    if faults.read(layout, target).get("install") == "fail":
        raise LabError(f"installing Slurm {args.version} for {target} failed (lab fault "
                       "install=fail)")
    name = f"slurmd-{args.node}" if args.daemon == "slurmd" else args.daemon
    with locked(layout):
        slurmswitch.no_downgrade(layout, info, name, args.version)
        root = slurmswitch.locate(layout, args.version)
        have = slurmswitch.check(layout, info, name, args.version, root)

        def make(daemon: str) -> d.Daemon:
            return {x.name: x for x in registry(layout, info)}[daemon]

        began = time.monotonic()
        slurmswitch.restart(layout, name, root, make)
        if args.daemon == "slurmd":
            slurmswitch.wait_slurmd(layout, make(name), args.node, args.version)
        if args.daemon == "slurmctld":  # the running slurmds registered again
            for x in registry(layout, info):
                if x.name.startswith("slurmd-") and procs.running_pid(layout, x.name):
                    d.wait_for(x.ready, x.name, x.logs)
            slurmswitch.rest_after(layout, info, make)
        slurmswitch.record(layout, info)
        info["daemons"] = daemon_table(layout, info)
        layout.write_info(info)
    change = f"Slurm {have} -> {args.version}" if have != args.version else \
        f"Slurm {args.version} (already)"
    print(f"{name}: {change}, restarted and ready in {time.monotonic() - began:.1f}s")
    return 0


def cmd_slurm_root(args: argparse.Namespace) -> int:
    packages.ensure_packages(allow_install=True, extra=roots.HOST_TOOLS, only_extra=True)
    root = roots.ensure(args.version, rebuild=args.rebuild)
    print(f"{root} (Slurm {roots.release(root)})")
    return 0


def cmd_etcd_switch(args: argparse.Namespace) -> int:
    layout = Layout(lab_dir())
    info = layout.read_info()
    if "etcd" not in info:
        raise LabError(f"no lab etcd at {layout.root}; run `lab up` first")
    with locked(layout):
        previous, took = etcd.switch(layout, ports_of(info), Path(args.data_dir))
        info["etcd"] = etcd.info(layout, ports_of(info))
        info["daemons"] = daemon_table(layout, info)
        layout.write_info(info)
    print(f"etcd: now on {info['etcd']['data_dir']} (was {previous}), healthy after {took:.1f}s")
    return 0


def cmd_backfill(args: argparse.Namespace) -> int:
    layout = Layout(lab_dir())
    info = layout.read_info()
    if "nodes" not in info:
        raise LabError(f"no lab at {layout.root}; run `lab up` first")
    with locked(layout):
        out = monitoring.backfill(layout, ports_of(info), watched(info), Path(args.file))
        info["daemons"] = daemon_table(layout, info)
        layout.write_info(info)
    print(out or f"backfilled {args.file}")
    return 0


# --- slack ---------------------------------------------------------------------

def lab_slack() -> slackclient.LabSlack:
    layout = Layout(lab_dir())
    info = layout.read_info()
    if "slack" not in info or not slack.secrets_file(layout).exists():
        raise LabError(f"no lab Slack at {layout.root}; run `lab up` first")
    if not procs.running_pid(layout, slack.NAME):
        raise LabError("the lab's Slack fake is stopped: `lab service slack start`")
    return slackclient.LabSlack.from_info(info)


def print_delivery(what: str, delivery: slackclient.Delivery) -> int:
    if delivery.status == 0:
        print(f"{what}: the bot is not reachable: {delivery.error}", file=sys.stderr)
        return 1
    print(f"HTTP {delivery.status} ({delivery.elapsed * 1000:.0f} ms)")
    if delivery.body:
        print(delivery.body)
    return 0 if 200 <= delivery.status < 300 else 1


def print_envelope(sl: slackclient.LabSlack, sent: Info, wait: float) -> int:
    print(f"envelope {sent['envelope_id']} sent to connection {sent['delivered_to']}")
    try:
        ack = slackclient.wait_for_ack(sl.url, sent["envelope_id"], timeout=wait)
    except TimeoutError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print(f"ack after {ack.get('latency_ms')} ms" + (" (late: Slack waits 3 s)"
                                                      if ack.get("late") else ""))
    if ack.get("payload"):
        print(json.dumps(ack["payload"], indent=2))
    return 0


def cmd_slack(args: argparse.Namespace) -> int:
    sl = lab_slack()
    try:
        return slack_action(sl, args)
    except slackclient.FakeError as exc:
        raise LabError(f"the Slack fake refused: {exc}") from None
    except LookupError as exc:
        raise LabError(str(exc)) from None


def slack_action(sl: slackclient.LabSlack, args: argparse.Namespace) -> int:
    if args.action == "command":
        if args.socket:
            sent = slackclient.socket_command(sl.url, args.text, user_id=args.user,
                                              channel_id=args.channel, command=args.command,
                                              wait=args.wait)
            return print_envelope(sl, sent, args.wait)
        return print_delivery(sl.events_url, sl.command(
            args.text, args.user, channel_id=args.channel, command=args.command,
            trigger_id=args.trigger_id, timestamp=args.timestamp))
    if args.action == "click":
        if args.socket:
            sent = slackclient.socket_click(sl.url, args.action_id, args.value,
                                            user_id=args.user, message_ts=args.ts,
                                            channel_id=args.channel, wait=args.wait)
            return print_envelope(sl, sent, args.wait)
        return print_delivery(sl.events_url, sl.click(
            args.action_id, args.value, args.user, message_ts=args.ts,
            channel_id=args.channel, timestamp=args.timestamp))
    if args.action == "calls":
        found = slackclient.calls(sl.url, args.method)
        if args.json:
            print(json.dumps(found, indent=2))
        for c in [] if args.json else found:
            when = time.strftime("%H:%M:%S", time.localtime(c["time"]))
            outcome = "ok" if c["ok"] else c["error"]
            args_text = json.dumps(c["args"], sort_keys=True)
            print(f"#{c['id']:<4} {when} {c['method']:<22} {c['token']:<7} {c['status']} "
                  f"{outcome:<18} {args_text[:100]}")
        return 0
    if args.action == "messages":
        view = slackclient.messages(sl.url, None if args.all else args.channel)
        print(json.dumps(view, indent=2) if args.json else slackclient.render_messages(view))
        return 0
    if args.action == "acks":
        print(json.dumps(slackclient.socket_acks(sl.url), indent=2))
        return 0
    if args.action == "reset":
        slackclient.reset(sl.url)
        print("slack: calls, messages, acks, response URLs and faults forgotten")
        return 0
    # fault
    if args.pairs == ["clear"]:
        slackclient.clear_faults(sl.url)
        print("slack: faults cleared")
        return 0
    spec: Info = {}
    for pair in args.pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise LabError(f"expected key=value, got {pair!r}")
        spec[key] = value if key in ("method", "error") else _number(key, value)
    print(json.dumps(slackclient.arm_fault(sl.url, **spec), sort_keys=True))
    return 0


def _number(key: str, value: str) -> int | float:
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            raise LabError(f"{key} must be a number") from None


def slack_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("slack", help="play Slack towards the bot; inspect the Slack fake")
    sp.set_defaults(func=cmd_slack)
    acts = sp.add_subparsers(dest="action", required=True)

    def delivery_options(p: argparse.ArgumentParser, user: str) -> None:
        p.add_argument("--user", default=user, help=f"Slack user ID (default {user}; "
                       "U0ALICE, U0BOB on-call, U0CAROL, U0DAVE gpu-leads)")
        p.add_argument("--channel", default=slack.CHANNEL, help="channel ID (default %(default)s)")
        p.add_argument("--socket", action="store_true",
                       help="send as a Socket Mode envelope instead of a signed HTTP request")
        p.add_argument("--wait", type=float, default=5.0,
                       help="Socket Mode: seconds to wait for a client and its ack")
        p.add_argument("--timestamp", help="X-Slack-Request-Timestamp (a stale one: forged)")

    cmd = acts.add_parser("command", help="a signed slash command to the bot")
    cmd.add_argument("text", help="the command's text, e.g. 'run drain-node node=gpu03'")
    cmd.add_argument("--command", default=slackclient.COMMAND, help="default %(default)s")
    cmd.add_argument("--trigger-id", help="default: a new one")
    delivery_options(cmd, "U0ALICE")
    click = acts.add_parser("click", help="a signed button click (block_actions) to the bot")
    click.add_argument("action_id")
    click.add_argument("value")
    click.add_argument("--ts", help="the message's ts (default: the newest message with "
                       "that button)")
    delivery_options(click, "U0CAROL")
    calls = acts.add_parser("calls", help="the Web API calls the fake received")
    calls.add_argument("--method", help="only this method, e.g. chat.update")
    calls.add_argument("--json", action="store_true")
    msgs = acts.add_parser("messages", help="the channel as Slack would show it")
    msgs.add_argument("--channel", default=slack.CHANNEL)
    msgs.add_argument("--all", action="store_true", help="every channel with messages")
    msgs.add_argument("--json", action="store_true")
    acts.add_parser("acks", help="Socket Mode acks received")
    acts.add_parser("reset", help="forget calls, messages, acks, response URLs, faults")
    fault = acts.add_parser("fault", help="ratelimit=N [retry_after=S] [method=M] | "
                            "error=CODE [count=N] | status=503 | delay=S | clear")
    fault.add_argument("pairs", nargs="+", metavar="key=value")


def slurm_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    si = sub.add_parser("slurm-install", help="upgrade-slurm's install command: switch DAEMON "
                        "(NODE's slurmd) to Slurm VERSION (a release the lab runs: 22.05 from "
                        "the host, 24.11 and 26.05 from Debian roots), restart it and wait")
    si.add_argument("daemon", choices=["slurmdbd", "slurmctld", "slurmd"])
    si.add_argument("version")
    si.add_argument("node", nargs="?", default="")
    si.set_defaults(func=cmd_slurm_install)
    sr = sub.add_parser("slurm-root", help="build (when missing or stale) the Debian root a "
                        "Slurm release runs from, and print its path")
    sr.add_argument("version", choices=list(roots.SUITES))
    sr.add_argument("--rebuild", action="store_true", help="build it again even when current")
    sr.set_defaults(func=cmd_slurm_root)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lab", description="Local Slurm + MariaDB lab on loopback.")
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the lab (idempotent)")
    up.add_argument("--nodes", type=int, help=f"nodes in slurm.conf (default {DEFAULT_NODES})")
    up.add_argument("--slurmd", type=int, help=f"slurmd to start (default: all up to "
                    f"{ALL_SLURMD_UP_TO} nodes, else {SCALE_SLURMD})")
    up.add_argument("--kube-nodes", type=int, help="Kubernetes nodes, numbered on after the "
                    "Slurm nodes (default: gpu05..gpu08 and the hand-off node gpu04)")
    up.add_argument("--scale", action="store_true", help=f"a scale lab: --nodes {SCALE_NODES} "
                    f"--kube-nodes {SCALE_KUBE_NODES} ({SCALE_SLURMD} slurmd; telemetry for "
                    "the slurmd nodes and the first Kubernetes nodes only)")
    up.add_argument("--slurm", choices=roots.VERSIONS, help=f"Slurm release (default "
                    f"{roots.HOST_VERSION}, the host's packages; others run from a Debian root "
                    "built once per machine: see `lab slurm-root`)")
    up.add_argument("--no-install", action="store_true", help="never apt-get install")
    up.set_defaults(func=cmd_up)
    down = sub.add_parser("down", help="stop the lab's daemons")
    down.add_argument("--purge", action="store_true", help="also delete the lab folder")
    down.set_defaults(func=cmd_down)
    status = sub.add_parser("status", help="daemons and sinfo; exit 1 unless all up")
    status.set_defaults(func=cmd_status)
    sub.add_parser("env", help="shell exports: eval \"$(lab env)\"").set_defaults(func=cmd_env)
    fault = sub.add_parser("fault", help="NODE key=value... | NODE clear")
    fault.add_argument("node")
    fault.add_argument("pairs", nargs="+", metavar="key=value",
                       help="health=fail|pass (the bot's checks), nhc=fail|pass (Slurm's "
                       "HealthCheckProgram), driver=VERSION, vbios=VERSION, gpu=N, "
                       "upgrade=fail, xid=N "
                       "[xid_gpu=G], ecc_dbe=N, temp=T, util=U, gpu_missing=G[,G], "
                       "row_remap_failure=1, remapped_rows=N, exporter=down, any "
                       "key=value, or clear; NODE kube: api=500|hang|ok")
    fault.set_defaults(func=cmd_fault)
    swp = sub.add_parser("swap", help="replace GPU on NODE: it reports a new serial and "
                         "UUID (nvidia-smi, DCGM) until `lab fault NODE clear`")
    swp.add_argument("node")
    swp.add_argument("gpu", type=int)
    swp.set_defaults(func=cmd_swap)
    drv = sub.add_parser("driver", help="print the driver version NODE reports")
    drv.add_argument("node")
    drv.set_defaults(func=cmd_driver)
    sub.add_parser("reset", help="a running lab back to its state after `lab up`: jobs, "
                   "reservations, node states, features, faults, Kubernetes, alerts, Slack, "
                   "the bot's database").set_defaults(func=cmd_reset)
    svc = sub.add_parser("service", help="stop|start|restart|status one lab daemon")
    svc.add_argument("name", help="slurmdbd, slurmctld, slurmrestd, mariadb, munge, "
                     "kubeapi, etcd, dcgm, prometheus, alertmanager, slack, rsyslog, otlp, "
                     "slurmd-gpuNN")
    svc.add_argument("action", choices=["stop", "start", "restart", "reboot", "status"])
    svc.set_defaults(func=cmd_service)
    mr = sub.add_parser("mig-reload", help="gres.conf and slurm.conf follow NODE's MIG layout "
                        "(nvidia-mig-parted apply); restart slurmctld and NODE's slurmd")
    mr.add_argument("node")
    mr.set_defaults(func=cmd_mig_reload)
    sw = sub.add_parser("etcd-switch", help="restart the lab's etcd on another data directory "
                        "(a restored snapshot); later starts keep using it")
    sw.add_argument("data_dir", help="an etcd data directory holding member/ "
                    "(restored with --name grblab and the lab's peer URL)")
    sw.set_defaults(func=cmd_etcd_switch)
    slurm_parsers(sub)
    bf = sub.add_parser("backfill", help="write OpenMetrics history into the lab's Prometheus "
                        "(promtool tsdb create-blocks-from openmetrics; restarts Prometheus)")
    bf.add_argument("file", help="an OpenMetrics text file ending in `# EOF`")
    bf.set_defaults(func=cmd_backfill)
    slack_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except LabError as exc:
        print(f"lab: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # `lab status | head`: point stdout at /dev/null so the exit flush is quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
