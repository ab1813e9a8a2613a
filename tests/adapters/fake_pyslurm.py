"""An in-memory pyslurm 25.11 for the pyslurm backend's unit tests (pyslurm itself needs
libslurm 25.11 to import): the classes, attributes and errors it documents, over a
``FakeCluster`` whose changes show in the next ``load()``.

``install(monkeypatch)`` puts this module in ``sys.modules["pyslurm"]`` over a fresh cluster.
Only what the backend uses is here; a name pyslurm lacks is missing here too.
"""

from __future__ import annotations

import enum
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from kit.hostlist import compress, expand

__version__ = "25.11.2"
SLURM_API_VERSION = (25, 11, 2)  # slurm_api_version(): the headers pyslurm was built with
LOCAL_CLUSTER = "lab"

# slurm_errno.h numbers and slurm_strerror()'s words for the errors the fake raises
STRERROR = {
    1005: "Protocol version has changed, re-link your code",
    1800: "Unable to contact slurm controller (connect failure)",
    2017: "Invalid job id specified",
    2018: "Invalid node name specified",
    2053: "Requested reservation is invalid",
    2082: "Duplicate reservation name",
}
# pyslurm.core.node._node_state_from_str: the states a Node update may ask for
NODE_UPDATE_STATES = frozenset({
    "CANCEL_REBOOT", "DOWN", "DRAIN", "FAIL", "FUTURE", "NORESP", "NO_RESP", "POWER_DOWN",
    "POWER_DOWN_ASAP", "POWER_DOWN_FORCE", "POWER_UP", "RESUME", "UNDRAIN",
})
NODE_WRITABLE = frozenset({
    "configured_gres", "address", "hostname", "extra", "comment", "weight",
    "available_features", "active_features", "cpu_binding", "state", "reason",
})


class PyslurmError(Exception):
    """The base Exception for all Pyslurm errors."""


class RPCError(PyslurmError):
    def __init__(self, errno: int = 1, msg: str | None = None) -> None:
        self.errno = errno
        self.msg = msg or STRERROR.get(errno, "Unspecified error")
        super().__init__(self.msg)


# -- the cluster behind the API -------------------------------------------------------------


@dataclass
class NodeState:
    base: str = "IDLE"  # IDLE, MIXED, ALLOCATED, DOWN...
    flags: set[str] = field(default_factory=set)  # DRAIN, NOT_RESPONDING...
    reason: str | None = None
    reason_user: str | None = None
    reason_time: int | None = None
    configured_gres: dict[str, int] = field(default_factory=lambda: {"gpu:h100": 8})
    alloc_tres: dict[str, str] = field(default_factory=dict)  # "gres/gpu": "2"
    features: list[str] = field(default_factory=list)
    active_features: list[str] = field(default_factory=list)
    boot_time: int = 1_700_000_000


@dataclass
class JobState:
    name: str
    user_name: str
    account: str
    state: str  # RUNNING, PENDING...
    nodes: str | None = None  # allocated, as a hostlist expression
    required_nodes: str | None = None
    requeue_count: int = 0


@dataclass
class ReservationState:
    name: str
    nodes: str
    users: list[str]
    flags: int
    reoccurrence: str
    start_time: int
    end_time: int


@dataclass
class DbJobState:
    account: str
    submit_time: int
    eligible_time: int
    start_time: int  # 0 while pending
    end_time: int  # 0 while running
    gpus: dict[str, int] = field(default_factory=dict)  # "gpu": 2, "gpu:h100": 2


@dataclass
class FakeCluster:
    """What slurmctld and slurmdbd hold; every RPC is logged in ``calls``."""

    version: str = "25.11.2"  # slurmctld's, as slurmctld.Config.load().version gives it
    nodes: dict[str, NodeState] = field(default_factory=dict)
    jobs: dict[int, JobState] = field(default_factory=dict)
    reservations: dict[str, ReservationState] = field(default_factory=dict)
    db_jobs: list[DbJobState] = field(default_factory=list)
    associations: list[tuple[str, str]] = field(default_factory=list)  # (account, user)
    dbd_agent_queue_size: int = 0
    controller_error: RPCError | None = None  # raised by every slurmctld RPC when set
    dbd_up: bool = True
    slurm_conf: str | None = None  # what slurm_init() was given
    user: str = "root"
    calls: list[str] = field(default_factory=list)

    def rpc(self, name: str) -> None:
        self.calls.append(name)
        if self.controller_error is not None:
            raise self.controller_error

    def dbd(self, name: str) -> None:
        self.calls.append(name)
        if not self.dbd_up:
            raise RPCError(msg="Failed to open onnection to slurmdbd")  # (sic) pyslurm's words

    def count(self, prefix: str) -> int:
        return sum(1 for call in self.calls if call.startswith(prefix))

    def update_node(self, node_names: str, umsg: dict[str, Any]) -> None:
        """slurm_update_node: all named nodes or (an unknown name) none."""
        self.rpc(f"slurm_update_node {node_names}")
        names = expand(node_names)
        if any(name not in self.nodes for name in names):
            raise RPCError(2018)
        for name in names:
            self._apply(self.nodes[name], umsg)

    def _apply(self, node: NodeState, umsg: dict[str, Any]) -> None:
        state = (umsg.get("state") or "").upper()
        if state == "DRAIN":
            node.flags.add("DRAIN")
        elif state == "DOWN":
            node.base = "DOWN"
        elif state in {"RESUME", "UNDRAIN"}:
            node.flags.discard("DRAIN")
            if state == "RESUME" and node.base == "DOWN":
                node.base = "IDLE"
            node.reason = node.reason_user = node.reason_time = None
        if umsg.get("reason") is not None:
            node.reason, node.reason_user = umsg["reason"], self.user
            node.reason_time = int(time.time())
        for key, attribute in (("available_features", "features"),
                               ("active_features", "active_features")):
            if umsg.get(key) is not None:
                setattr(node, attribute, umsg[key].split(","))

    def requeue(self, job_id: int) -> None:
        self.rpc(f"slurm_requeue {job_id}")
        job = self.jobs.get(job_id)
        if job is None:
            raise RPCError(2017)
        job.state, job.nodes = "PENDING", None
        job.requeue_count += 1

    def create_reservation(self, wanted: ReservationState) -> None:
        self.rpc(f"slurm_create_reservation {wanted.name}")
        if wanted.name in self.reservations:
            raise RPCError(2082)
        if any(name not in self.nodes for name in expand(wanted.nodes)):
            raise RPCError(2018)
        self.reservations[wanted.name] = wanted

    def delete_reservation(self, name: str) -> None:
        self.rpc(f"slurm_delete_reservation {name}")
        if self.reservations.pop(name, None) is None:
            raise RPCError(2053)


CLUSTER = FakeCluster()


def install(monkeypatch: pytest.MonkeyPatch, cluster: FakeCluster | None = None) -> FakeCluster:
    """This module as ``pyslurm``, over ``cluster`` (a fresh one by default)."""
    chosen = cluster or FakeCluster()
    monkeypatch.setattr(sys.modules[__name__], "CLUSTER", chosen)
    monkeypatch.setitem(sys.modules, "pyslurm", sys.modules[__name__])
    return chosen


def slurm_api_version() -> tuple[int, int, int]:
    return SLURM_API_VERSION


def slurm_init(config_path: str | None = None) -> None:
    CLUSTER.slurm_conf = config_path


def nodelist_to_range_str(nodelist: list[str] | str) -> str:
    return compress(nodelist.split(",") if isinstance(nodelist, str) else list(nodelist))


# -- collections: pyslurm.xcollections.MultiClusterMap --------------------------------------


class MultiClusterMap:
    """{cluster: {key: value}}; iterating gives keys, ``values()`` every value."""

    def __init__(self) -> None:
        self.data: dict[str, dict[Any, Any]] = {}

    def add(self, key: Any, value: Any) -> None:
        self.data.setdefault(LOCAL_CLUSTER, {})[key] = value

    def keys(self) -> list[Any]:
        return [key for items in self.data.values() for key in items]

    def values(self) -> list[Any]:
        return [value for items in self.data.values() for value in items.values()]

    def items(self) -> list[tuple[Any, Any]]:
        return [pair for items in self.data.values() for pair in items.items()]

    def get(self, key: Any, default: Any = None) -> Any:
        return self.data.get(LOCAL_CLUSTER, {}).get(key, default)

    def __getitem__(self, key: Any) -> Any:
        return self.data[LOCAL_CLUSTER][key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.keys())

    def __len__(self) -> int:
        return sum(len(items) for items in self.data.values())


# -- nodes ----------------------------------------------------------------------------------


class Node:
    """pyslurm.Node: read attributes after ``load``; keyword arguments are the changes a
    ``modify`` sends (an empty string or list is sent as NULL: "unchanged")."""

    def __init__(self, name: str | None = None, **kwargs: Any) -> None:
        self.name = name
        self.cluster = LOCAL_CLUSTER
        self.umsg: dict[str, Any] = {}
        self.state: str | None = None
        self.reason: str | None = None
        self.reason_user: str | None = None
        self.reason_time: int | None = None
        self.configured_gres: dict[str, Any] = {}
        self.allocated_gres: dict[str, Any] = {}
        self.available_features: list[str] = []
        self.active_features: list[str] = []
        self.boot_time: int | None = None
        for key, value in kwargs.items():
            self._set(key, value)

    def _set(self, key: str, value: Any) -> None:
        if key not in NODE_WRITABLE:
            raise AttributeError(f"attribute '{key}' of 'pyslurm.Node' objects is not writable")
        if key == "state" and value and str(value).upper() not in NODE_UPDATE_STATES:
            raise ValueError(f"Invalid Node state: {value}")
        setattr(self, key, value)
        sent = ",".join(value) if isinstance(value, list) else value
        self.umsg[key] = sent or None

    @staticmethod
    def _from(name: str, node: NodeState) -> Node:
        loaded = Node(name)
        loaded.state = "+".join([node.base, *sorted(node.flags)])
        loaded.reason, loaded.reason_user = node.reason, node.reason_user
        loaded.reason_time, loaded.boot_time = node.reason_time, node.boot_time
        loaded.configured_gres = dict(node.configured_gres)
        # Node.allocated_gres is gres_from_tres_dict(allocated_tres): "gres/" keys, str values
        loaded.allocated_gres = {key.removeprefix("gres/"): value
                                 for key, value in node.alloc_tres.items()
                                 if key.startswith("gres/")}
        loaded.available_features = list(node.features)
        loaded.active_features = list(node.active_features)
        return loaded

    @staticmethod
    def load(name: str) -> Node:
        CLUSTER.rpc(f"slurm_load_node_single {name}")
        if name not in CLUSTER.nodes:
            raise RPCError(msg=f"Node '{name}' does not exist")
        return Node._from(name, CLUSTER.nodes[name])

    def modify(self, changes: Node) -> None:
        CLUSTER.update_node(str(self.name), changes.umsg)


class Nodes(MultiClusterMap):
    def __init__(self, nodes: list[str | Node] | str | None = None) -> None:
        super().__init__()
        items = nodes.split(",") if isinstance(nodes, str) else nodes or []
        for item in items:
            node = Node(item) if isinstance(item, str) else item
            self.add(node.name, node)

    @staticmethod
    def load(preload_passwd_info: bool = False) -> Nodes:
        CLUSTER.rpc("slurm_load_node")
        return Nodes([Node._from(name, node) for name, node in CLUSTER.nodes.items()])

    def modify(self, changes: Node) -> None:
        """One slurm_update_node for every node in the collection."""
        CLUSTER.update_node(nodelist_to_range_str(self.keys()), changes.umsg)


# -- jobs -----------------------------------------------------------------------------------


class Job:
    def __init__(self, job_id: int) -> None:
        self.id = job_id
        self.cluster = LOCAL_CLUSTER
        self.name = self.user_name = self.account = self.state = ""
        self.allocated_nodes: str | None = None
        self.required_nodes: str | None = None
        self.requeue_count = 0

    @staticmethod
    def _from(job_id: int, job: JobState) -> Job:
        loaded = Job(job_id)
        loaded.name, loaded.user_name, loaded.account = job.name, job.user_name, job.account
        loaded.state, loaded.requeue_count = job.state, job.requeue_count
        loaded.allocated_nodes, loaded.required_nodes = job.nodes, job.required_nodes
        return loaded

    @staticmethod
    def load(job_id: int) -> Job:
        CLUSTER.rpc(f"slurm_load_job {job_id}")
        if job_id not in CLUSTER.jobs:
            raise RPCError(2017)
        return Job._from(job_id, CLUSTER.jobs[job_id])

    def requeue(self, hold: bool = False) -> None:
        CLUSTER.requeue(self.id)


class Jobs(MultiClusterMap):
    @staticmethod
    def load(preload_passwd_info: bool = False, frozen: bool = False) -> Jobs:
        CLUSTER.rpc("slurm_load_jobs")
        loaded = Jobs()
        for job_id, job in CLUSTER.jobs.items():
            loaded.add(job_id, Job._from(job_id, job))
        return loaded


# -- reservations ---------------------------------------------------------------------------


class ReservationFlags(enum.Flag):
    MAINTENANCE = enum.auto()
    MAGNETIC = enum.auto()
    FLEX = enum.auto()
    IGNORE_RUNNING_JOBS = enum.auto()
    ANY_NODES = enum.auto()
    STATIC_NODES = enum.auto()
    PARTITION_NODES_ONLY = enum.auto()
    USER_DELETION = enum.auto()
    PURGE = enum.auto()
    SPECIFIC_NODES = enum.auto()
    NO_JOB_HOLD_AFTER_END = enum.auto()
    OVERLAP = enum.auto()
    ALL_NODES = enum.auto()
    SKIP = enum.auto()
    SCHED_FAILED = enum.auto()

    @classmethod
    def from_list(cls, inp: list[str]) -> ReservationFlags:
        """As pyslurm's: a name that is no member is dropped without a word."""
        out = cls(0)
        for flag in cls:
            if flag.name in inp:
                out |= flag
        return out


class ReservationReoccurrence(enum.StrEnum):  # pyslurm's is a (str, Enum)
    NO = "NO"
    DAILY = "DAILY"
    HOURLY = "HOURLY"
    WEEKLY = "WEEKLY"
    WEEKDAY = "WEEKDAY"
    WEEKEND = "WEEKEND"


class Reservation:
    """pyslurm.Reservation: keyword arguments are set in order, as pyslurm's __init__ does
    (``duration`` computes ``end_time`` from ``start_time``, or from now)."""

    def __init__(self, name: str | None = None, **kwargs: Any) -> None:
        self.name = name
        self.cluster = LOCAL_CLUSTER
        self.nodes: str | None = None
        self.users: list[str] = []
        self.start_time: int | None = None
        self.end_time: int | None = None
        self._flags = ReservationFlags(0)
        self._reoccurrence = ReservationReoccurrence.NO
        for key, value in kwargs.items():
            if not hasattr(self, key):
                raise AttributeError(f"'pyslurm.Reservation' object has no attribute '{key}'")
            setattr(self, key, value)

    @property
    def flags(self) -> ReservationFlags:
        return self._flags

    @flags.setter
    def flags(self, value: ReservationFlags | list[str]) -> None:
        self._flags = ReservationFlags.from_list(value) if isinstance(value, list) else value

    @property
    def reoccurrence(self) -> ReservationReoccurrence:
        return self._reoccurrence

    @reoccurrence.setter
    def reoccurrence(self, value: str) -> None:
        self._reoccurrence = ReservationReoccurrence(value)  # ValueError for another word

    @property
    def duration(self) -> int:
        if self.start_time and self.end_time and self.end_time >= self.start_time:
            return (self.end_time - self.start_time) // 60
        return 0

    @duration.setter
    def duration(self, minutes: int) -> None:
        if not self.start_time:
            self.start_time = int(time.time())
        self.end_time = self.start_time + int(minutes) * 60

    @property
    def is_active(self) -> bool:
        now = time.time()
        return bool(self.start_time and self.end_time and self.start_time <= now <= self.end_time)

    @staticmethod
    def _from(found: ReservationState) -> Reservation:
        return Reservation(found.name, nodes=found.nodes, users=list(found.users),
                           flags=ReservationFlags(found.flags), reoccurrence=found.reoccurrence,
                           start_time=found.start_time, end_time=found.end_time)

    @staticmethod
    def load(name: str) -> Reservation:
        found = Reservations.load().get(name)
        if not found:
            raise RPCError(msg=f"Reservation '{name}' doesn't exist")
        return found  # type: ignore[no-any-return]

    def create(self) -> Reservation:
        if not self.start_time or not (self.duration and self.end_time):
            raise RPCError(msg="You must at least specify a start_time,  combined with an "
                               "end_time or a duration.")
        CLUSTER.create_reservation(ReservationState(
            name=str(self.name), nodes=self.nodes or "", users=list(self.users),
            flags=self._flags.value, reoccurrence=self._reoccurrence.value,
            start_time=self.start_time, end_time=int(self.end_time or 0)))
        return self

    def delete(self) -> None:
        CLUSTER.delete_reservation(str(self.name))


class Reservations(MultiClusterMap):
    @staticmethod
    def load() -> Reservations:
        CLUSTER.rpc("slurm_load_reservations")
        loaded = Reservations()
        for name, found in CLUSTER.reservations.items():
            loaded.add(name, Reservation._from(found))
        return loaded


# -- pyslurm.db -----------------------------------------------------------------------------


class JobFilter:
    """pyslurm.db.JobFilter (the attributes the backend may set; others raise)."""

    def __init__(self, **kwargs: Any) -> None:
        self.start_time: int | None = None
        self.end_time: int | None = None
        self.accounts: list[str] = []
        self.users: list[str] = []
        for key, value in kwargs.items():
            if not hasattr(self, key):
                raise AttributeError(f"'pyslurm.db.JobFilter' object has no attribute '{key}'")
            setattr(self, key, value)


class GPU:
    def __init__(self, count: int, gpu_type: str | None = None) -> None:
        self.count = int(count)
        self.type = gpu_type


class DbJob:
    def __init__(self, job_id: int, found: DbJobState) -> None:
        self.id, self.cluster, self.account = job_id, LOCAL_CLUSTER, found.account
        self.submit_time, self.eligible_time = found.submit_time, found.eligible_time
        self.start_time, self.end_time = found.start_time, found.end_time
        self.gpus = {name: GPU(count, name.partition(":")[2] or None)
                     for name, count in found.gpus.items()}


class DbJobs(MultiClusterMap):
    @staticmethod
    def load(db_filter: JobFilter | None = None, db_connection: Any = None) -> DbJobs:
        """Jobs eligible or running in [start_time, end_time] (all users: none named)."""
        CLUSTER.dbd("slurmdb_jobs_get")
        chosen = db_filter or JobFilter()
        begin, end = chosen.start_time or 0, chosen.end_time or 2**62
        loaded = DbJobs()
        for job_id, found in enumerate(CLUSTER.db_jobs, start=1):
            if found.eligible_time < end and (found.end_time == 0 or found.end_time >= begin):
                loaded.add(job_id, DbJob(job_id, found))
        return loaded


class Association:
    def __init__(self, assoc_id: int, account: str, user: str) -> None:
        self.id, self.account, self.user, self.cluster = assoc_id, account, user, LOCAL_CLUSTER


class Associations(MultiClusterMap):
    @staticmethod
    def load(db_filter: Any = None, db_connection: Any = None) -> Associations:
        CLUSTER.dbd("slurmdb_associations_get")
        loaded = Associations()
        for assoc_id, (account, user) in enumerate(CLUSTER.associations, start=1):
            loaded.add(assoc_id, Association(assoc_id, account, user))
        return loaded


class db:  # the pyslurm.db package
    Job = DbJob
    Jobs = DbJobs
    JobFilter = JobFilter
    GPU = GPU
    Association = Association
    Associations = Associations


# -- pyslurm.slurmctld ----------------------------------------------------------------------


class Config:
    def __init__(self, version: str) -> None:
        self.version = version

    @staticmethod
    def load() -> Config:
        CLUSTER.rpc("slurm_load_ctl_conf")
        return Config(CLUSTER.version)


class Statistics:
    def __init__(self, dbd_agent_queue_size: int) -> None:
        self.dbd_agent_queue_size = dbd_agent_queue_size
        self.agent_queue_size = 0

    @staticmethod
    def load() -> Statistics:
        CLUSTER.rpc("slurm_get_statistics")
        return Statistics(CLUSTER.dbd_agent_queue_size)


def _diag() -> Statistics:
    return Statistics.load()


class slurmctld:  # the pyslurm.slurmctld package
    Config = Config
    Statistics = Statistics
    diag = staticmethod(_diag)
