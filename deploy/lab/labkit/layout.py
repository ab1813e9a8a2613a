"""Where the lab lives: folder, file paths, node names and ports."""
from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LAB_DIR_ENV = "RUNBOOK_LAB_DIR"
PORT_BASE_ENV = "RUNBOOK_LAB_PORT_BASE"
# Marker put into every daemon's environment so a pid can be proven to be ours.
MARKER_ENV = "GRB_LAB_DIR"
# lab.json and fault files: plain JSON objects.
Info = dict[str, Any]

CLUSTER = "grblab"
PARTITION = "gpu"
ACCOUNT = "ml-research"
QOS = "gpu-normal"
# fairshare-review: a second account, and a QOS with a GPU limit (GrpTRES gres/gpu) for it.
SECOND_ACCOUNT = "cv-research"
CAPPED_QOS, CAPPED_QOS_GPUS = "gpu-capped", 16
GPU_TYPE = "h100"
GPUS_PER_NODE = 8
DEFAULT_NODES = 5  # gpu05 is also in the Kubernetes pool (gpu05..gpu08)
DEFAULT_DRIVER = "535.161.08"

# Ports: slots of SLOT_SIZE below the Linux ephemeral range (32768+), so a
# daemon never races an outgoing connection for its port.
PORT_FLOOR = 10000
SLOT_SIZE = 400
SLOTS = (32768 - PORT_FLOOR) // SLOT_SIZE - 1
# +390..+399 sit above the slurmd ports: +390 is the port the bot's own HTTP server
# (`runbook serve`) uses in the lab (Alertmanager's webhook, Slack's request URL; the lab
# starts nothing there), +391 the lab's Slack fake (deploy/lab/slackapi), +392 rsyslogd and
# +393 the OTLP receiver (deploy/lab/otlpsink), where the bot ships its audit log;
# +394.. are free.
BOT_OFFSET = SLOT_SIZE - 10
SLACK_OFFSET = BOT_OFFSET + 1
SERVICE_OFFSETS = {"slurmctld": 0, "slurmdbd": 1, "slurmrestd": 2, "mariadb": 3,
                   "kubeapi": 4, "etcd": 5, "etcd_peer": 6,
                   "dcgm": 7, "prometheus": 8, "alertmanager": 9, "bot": BOT_OFFSET,
                   "slack": SLACK_OFFSET, "rsyslog": BOT_OFFSET + 2, "otlp": BOT_OFFSET + 3}
SLURMD_OFFSET = 10
MAX_SLURMD = BOT_OFFSET - SLURMD_OFFSET  # slurmd ports +10..+389
# Nodes past MAX_SLURMD never run slurmd: they share one port nothing listens on (+399).
IDLE_PORT_OFFSET = SLOT_SIZE - 1
MAX_NODES = 4096
# `lab up --scale`: 1,024 Slurm nodes (4 run slurmd) and 512 Kubernetes nodes.
SCALE_NODES, SCALE_KUBE_NODES = 1024, 512
# Unix socket paths are limited to 108 bytes (sun_path).
MAX_SOCKET_PATH = 100

REPO_DIR = Path(__file__).resolve().parents[3]


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def default_lab_dir() -> Path:
    return Path("/tmp") / f"grb-lab-{short_hash(str(REPO_DIR))}"


def lab_dir() -> Path:
    env = os.environ.get(LAB_DIR_ENV)
    return Path(env).resolve() if env else default_lab_dir()


def node_names(count: int, first: int = 1, width: int = 0) -> list[str]:
    """gpu01..gpuNN, zero-padded to the widest name (at least 2 digits): gpu0001..gpu1024."""
    width = width or max(2, len(str(first + count - 1)))
    return [f"gpu{i:0{width}d}" for i in range(first, first + count)]


def hostlist(names: list[str]) -> str:
    """Compress gpu01..gpuNN (contiguous, same width) into gpu[01-NN]."""
    if len(names) == 1:
        return names[0]
    first, last = names[0][3:], names[-1][3:]
    return f"gpu[{first}-{last}]"


@dataclass
class Ports:
    base: int
    nodes: int

    def service(self, name: str) -> int:
        return self.base + SERVICE_OFFSETS[name]

    def slurmd(self, index: int) -> int:
        if index >= MAX_SLURMD:
            return self.base + IDLE_PORT_OFFSET
        return self.base + SLURMD_OFFSET + index

    def all(self) -> list[int]:
        services = [self.base + off for off in SERVICE_OFFSETS.values()]
        return services + [self.slurmd(i) for i in range(min(self.nodes, MAX_SLURMD))]


@dataclass
class Layout:
    """All paths of one lab folder."""

    root: Path
    paths: dict[str, Path] = field(init=False)

    def __post_init__(self) -> None:
        r = self.root
        self.paths = {
            "etc": r / "etc",
            "run": r / "run",
            "pids": r / "pids",
            "log": r / "log",
            "state": r / "state",
            "spool": r / "spool",
            "dev": r / "dev",
            "bin": r / "bin",
            "faults": r / "faults",
            "mysql": r / "mysql",
        }

    def __getattr__(self, name: str) -> Path:
        paths: dict[str, Path] = self.__dict__.get("paths", {})
        if name in paths:
            return paths[name]
        raise AttributeError(name)

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.run / "munge.socket.2"

    @property
    def mariadb_socket(self) -> Path:
        return self.run / "mysqld.sock"

    @property
    def lab_json(self) -> Path:
        return self.root / "lab.json"

    @property
    def bot_yaml(self) -> Path:
        return self.root / "bot.yaml"

    @property
    def jwt_key(self) -> Path:
        return self.etc / "jwt_hs256.key"

    def make_dirs(self) -> None:
        for path in self.paths.values():
            path.mkdir(parents=True, exist_ok=True)
        # Slurm's key files and slurmdbd.conf must not be world readable.
        self.etc.chmod(0o700)

    def read_info(self) -> Info:
        try:
            info: Info = json.loads(self.lab_json.read_text())
        except (OSError, ValueError):
            return {}
        return info

    def write_info(self, info: Info) -> None:
        tmp = self.lab_json.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        tmp.replace(self.lab_json)


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like the daemons: a port in TIME_WAIT after `down` is still usable.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_ports(root: Path, nodes: int, previous_base: int | None) -> Ports:
    """Explicit base from the environment, else the previous one, else a slot
    derived from the lab folder's hash, probing further slots when taken."""
    explicit = os.environ.get(PORT_BASE_ENV)
    if explicit:
        ports = Ports(int(explicit), nodes)
        busy = [p for p in ports.all() if not port_free(p)]
        if busy:
            raise LabError(f"{PORT_BASE_ENV}={explicit}: ports in use: {busy[:5]}")
        return ports
    first_slot = int(short_hash(str(root)), 16) % SLOTS
    candidates = [previous_base] if previous_base else []
    candidates += [PORT_FLOOR + ((first_slot + i) % SLOTS) * SLOT_SIZE for i in range(SLOTS)]
    for base in candidates:
        ports = Ports(base, nodes)
        if all(port_free(p) for p in ports.all()):
            return ports
    raise LabError(f"no free port slot found; set {PORT_BASE_ENV}")


class LabError(Exception):
    """A failure with a message meant for the user (no traceback)."""
