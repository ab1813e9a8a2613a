"""The ``pyslurm`` backend: the Slurm C API through pyslurm 25.11's object API.

``load_pyslurm`` imports pyslurm lazily and refuses one whose release, compiled-in Slurm
headers or cluster differ; every error pyslurm raises becomes a ``SlurmError``. pyslurm has
no call for reboot and run_on_node (``unsupported`` says so; ``backend: cli`` does them).
Unit-tested against tests/adapters/fake_pyslurm.py: no pyslurm installs next to Slurm 22.05.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from adapters.slurm import commands, parsing
from adapters.slurm import pyslurm_records as records
from adapters.slurm.backend import (
    AccountUsage,
    Job,
    NodeInfo,
    Reservation,
    SlurmctldUnreachable,
    SlurmError,
)
from adapters.slurm.config import SlurmConfig
from kit.hostlist import compress

PYPI_NOTE = "PyPI has only pyslurm 25.11.x (and 17.x/18.x), whose build requires Slurm 25.11"
AUTO_INIT = "PYSLURM_DISABLE_AUTO_INIT"  # read by pyslurm/__init__.py before slurm_init()
# What this backend calls: pyslurm 25.11's names (pyslurm.slurmctld.diag, pyslurm.db.* ...).
API_NEEDED = ("Node", "Nodes", "Job", "Jobs", "Reservation", "Reservations", "RPCError",
              "PyslurmError", "db", "slurmctld", "slurm_api_version")
UNSUPPORTED = {
    "reboot": "pyslurm 25.11 wraps no reboot call (libslurm's slurm_reboot_nodes): "
              "set slurm.backend: cli, which runs scontrol reboot",
    "run_on_node": "a job step needs srun's launch protocol, which neither pyslurm nor "
                   "libslurm's API offers: set slurm.backend: cli, which runs srun",
    "run_on_nodes": "a test across several nodes (nccl-test) is one srun job step over all "
                    "of them, and neither pyslurm nor libslurm's API launches job steps: set "
                    "slurm.backend: cli, which runs srun",
}


def _slurm(version: tuple[int, int]) -> str:
    return f"Slurm {version[0]}.{version[1]:02d}"


def _import_pyslurm(slurm_conf: str | None) -> Any:
    """Import pyslurm. On the first import with ``slurm_conf`` its own slurm_init() (which
    would read SLURM_CONF or the default path) is held back and run with that file;
    libslurm reads its configuration once per process."""
    if "pyslurm" in sys.modules or not slurm_conf:
        return importlib.import_module("pyslurm")
    previous = os.environ.get(AUTO_INIT)
    os.environ[AUTO_INIT] = "1"
    try:
        module = importlib.import_module("pyslurm")
    finally:
        if previous is None:
            os.environ.pop(AUTO_INIT, None)
        else:
            os.environ[AUTO_INIT] = previous
    module.slurm_init(slurm_conf)
    return module


def _import_failure(exc: ImportError, cluster_version: tuple[int, int] | None) -> str:
    where = _slurm(cluster_version) if cluster_version else "this cluster's Slurm"
    if "libslurm" in str(exc):
        return (f"pyslurm is installed but the libslurm it was built against is not here "
                f"({exc}): install pyslurm built for {where}, or set slurm.backend: cli")
    return (f"pyslurm is not installed ({exc}): {PYPI_NOTE} and refuses any other "
            "(\"Slurm version mismatch\"); set slurm.backend: cli, or build pyslurm from the "
            f"branch matching {where}")


def check_build(module: Any) -> tuple[int, int]:
    """pyslurm's release ("25.11.2" is for Slurm 25.11) against the Slurm headers it was
    compiled with (``slurm_api_version()``); the API this backend calls must be there."""
    raw = str(getattr(module, "__version__", ""))
    built = records.release(raw)
    if built is None:
        raise SlurmError(f"pyslurm reports no version ({raw!r}): reinstall it")
    missing = [name for name in API_NEEDED if not hasattr(module, name)]
    if missing:
        raise SlurmError(f"pyslurm {raw} lacks {', '.join(missing)}: the pyslurm backend "
                         "needs pyslurm 25.11's API; set slurm.backend: cli")
    api = tuple(module.slurm_api_version())[:2]
    if api != built:
        raise SlurmError(
            f"pyslurm {raw} is for {_slurm(built)} but was compiled against the headers of "
            f"Slurm {'.'.join(map(str, api))}: rebuild it against the Slurm it is named for")
    return built


def load_pyslurm(cluster_version: tuple[int, int] | None = None,
                 slurm_conf: str | None = None) -> Any:
    """Import pyslurm, or raise SlurmError naming what is missing or mismatched."""
    try:
        module = _import_pyslurm(slurm_conf)
    except ImportError as exc:
        raise SlurmError(_import_failure(exc, cluster_version)) from exc
    built = check_build(module)
    if cluster_version and built != cluster_version:
        raise SlurmError(
            f"pyslurm {module.__version__} is built for {_slurm(built)} but this cluster runs "
            f"{_slurm(cluster_version)}: install the pyslurm release matching "
            f"{_slurm(cluster_version)} or set slurm.backend: cli")
    return module


class PyslurmBackend:
    """``SlurmBackend`` over pyslurm 25.11: ``Nodes.load``/``Nodes.modify``, ``Jobs.load``,
    ``Job.requeue``, ``Reservations.load``/``Reservation.create``/``.delete``,
    ``db.Jobs.load(db.JobFilter)``, ``db.Associations.load`` and ``slurmctld.diag``.

    pyslurm must be built for the cluster's exact Slurm release: PyPI carries only pyslurm
    25.11.x, and its build refuses any other Slurm. The release slurmctld reports
    (``slurmctld.Config.load().version``) is checked before the first call that reaches it.
    """

    def __init__(self, config: SlurmConfig) -> None:
        self.config = config
        self._pyslurm = load_pyslurm(None, config.slurm_conf)
        self._built = check_build(self._pyslurm)
        self._cluster_checked = False
        with contextlib.suppress(SlurmctldUnreachable):  # checked again before each call
            self._check_cluster()

    def unsupported(self, operation: str) -> str | None:
        """Why this backend refuses ``operation`` (a SlurmBackend method name), else None."""
        return UNSUPPORTED.get(operation)

    def _refuse(self, operation: str) -> SlurmError:
        return SlurmError(f"{operation} is not supported by the pyslurm backend: "
                          f"{UNSUPPORTED[operation]}")

    # -- plumbing ---------------------------------------------------------------------

    def _rpc(self, call: str, do: Callable[[], Any]) -> Any:
        """Run one pyslurm call; its RPCError (or ValueError: a value it refused) becomes a
        SlurmError (SlurmctldUnreachable when slurmctld does not answer)."""
        try:
            return do()
        except (self._pyslurm.PyslurmError, ValueError) as exc:
            raise records.rpc_error(exc, call) from exc

    def _check_cluster(self) -> None:
        if self._cluster_checked:
            return
        config = self._rpc("slurmctld.Config.load()", self._pyslurm.slurmctld.Config.load)
        found = records.release(str(config.version))
        if found != self._built:
            raise SlurmError(
                f"pyslurm {self._pyslurm.__version__} is built for {_slurm(self._built)} but "
                f"slurmctld runs Slurm {config.version}: install the pyslurm release matching "
                "the cluster, or set slurm.backend: cli")
        self._cluster_checked = True

    def _call(self, call: str, do: Callable[[], Any], *, controller: bool = True) -> Any:
        """``_rpc`` after the cluster's release is known to match; calls that only reach
        slurmdbd (``controller=False``) go ahead while slurmctld does not answer."""
        try:
            self._check_cluster()
        except SlurmctldUnreachable:
            if controller:
                raise
        return self._rpc(call, do)

    # -- reads ------------------------------------------------------------------------

    def nodes(self, names: list[str] | None = None, *, with_jobs: bool = True) -> list[NodeInfo]:
        loaded = self._call("Nodes.load()", self._pyslurm.Nodes.load)
        found = {node.name: records.node_info(node) for node in loaded.values()}
        chosen = (list(found.values()) if names is None
                  else [found[name] for name in names if name in found])
        if not with_jobs:
            return chosen
        jobs_by_node: dict[str, list[int]] = {}
        for job in self._all_jobs():
            if job.active:
                for name in job.nodes:
                    jobs_by_node.setdefault(name, []).append(job.id)
        return [replace(node, jobs=sorted(jobs_by_node.get(node.name, []))) for node in chosen]

    def _all_jobs(self) -> list[Job]:
        loaded = self._call("Jobs.load()", self._pyslurm.Jobs.load)
        return [records.job_record(job) for job in loaded.values()]

    def jobs(self, names: list[str]) -> list[Job]:
        wanted = set(names)
        return [job for job in self._all_jobs()
                if (job.active or job.state == "PENDING") and wanted.intersection(job.nodes)]

    def reservations(self) -> list[Reservation]:
        loaded = self._call("Reservations.load()", self._pyslurm.Reservations.load)
        return [records.reservation_record(found) for found in loaded.values()]

    def accounting(self, start: datetime, end: datetime) -> list[AccountUsage]:
        db = self._pyslurm.db
        # naive datetimes are local time, as sacct reads -S/-E
        db_filter = {"start_time": int(start.timestamp()), "end_time": int(end.timestamp())}
        loaded = self._call("db.Jobs.load(db.JobFilter(start_time, end_time))",
                            lambda: db.Jobs.load(db.JobFilter(**db_filter)), controller=False)
        return parsing.parse_accounting(records.accounting_data(loaded.values()), start, end)

    def accounts(self) -> list[str]:
        """The accounts of slurmdbd's associations (pyslurm 25.11 has no db.Accounts)."""
        loaded = self._call("db.Associations.load()", self._pyslurm.db.Associations.load,
                            controller=False)
        return sorted({assoc.account for assoc in loaded.values() if assoc.account})

    def dbd_queue(self) -> int:
        stats = self._call("slurmctld.diag()", self._pyslurm.slurmctld.diag)
        return int(stats.dbd_agent_queue_size or 0)

    # -- changes ----------------------------------------------------------------------

    def _modify_nodes(self, names: list[str], what: str, changes: dict[str, Any]) -> None:
        """One Nodes.modify() for the whole batch: pyslurm sends a single slurm_update_node
        RPC naming the nodes as one hostlist expression (nodelist_to_range_str)."""
        module = self._pyslurm
        self._call(f"Nodes.modify({compress(names)}: {what})",
                   lambda: module.Nodes(list(names)).modify(module.Node(**changes)))

    def update_nodes(self, names: list[str], state: str, reason: str | None = None) -> None:
        if not names:
            return
        changes: dict[str, Any] = {"state": state}
        if reason is not None:
            changes["reason"] = reason
        self._modify_nodes(names, f"state={state}", changes)

    def update_features(self, names: list[str], features: list[str]) -> None:
        if not names:
            return
        if not features:
            # pyslurm copies an empty list as NULL, which slurm_update_node reads as "unchanged"
            raise SlurmError("the pyslurm backend cannot clear a node's features (pyslurm sends "
                             "an empty list as 'no change'): set slurm.backend: cli")
        self._modify_nodes(names, f"features={','.join(features)}",
                           {"available_features": list(features),
                            "active_features": list(features)})

    def requeue(self, job_ids: list[int]) -> None:
        """pyslurm wraps slurm_requeue(job_id) only: one Job.requeue() per job."""
        done: list[int] = []
        for job_id in job_ids:
            try:
                self._call(f"Job({job_id}).requeue()", self._pyslurm.Job(job_id).requeue)
            except SlurmError as exc:
                if not done:
                    raise
                raise type(exc)(f"{exc.message} (jobs {','.join(map(str, done))} were "
                                "requeued before it)", exc.argv, exc.stderr) from exc
            done.append(job_id)

    def create_reservation(self, name: str, nodes: list[str], start: str,
                           duration_seconds: float, flags: list[str], users: list[str]) -> None:
        members, reoccurrence = records.reservation_settings(flags)
        settings = {"name": name, "nodes": compress(nodes), "users": list(users),
                    "flags": members, "start_time": records.start_epoch(start, time.time()),
                    # after start_time: pyslurm's duration setter computes end_time from it
                    "duration": commands.reservation_minutes(duration_seconds)}
        if reoccurrence:
            settings["reoccurrence"] = reoccurrence
        module = self._pyslurm
        self._call(f"Reservation({name}).create()",
                   lambda: module.Reservation(**settings).create())

    def delete_reservation(self, name: str) -> None:
        module = self._pyslurm
        self._call(f"Reservation({name}).delete()", lambda: module.Reservation(name).delete())

    def reboot(self, names: list[str], nextstate: str, reason: str) -> None:
        raise self._refuse("reboot")

    def node_run_line(self, node: str, reservation: str | None, argv: list[str],
                      env_names: Iterable[str] = ()) -> str:
        return commands.show(commands.srun(node, reservation, argv, env_names))

    def run_on_node(self, node: str, reservation: str | None, argv: list[str],
                    timeout: float, env: Mapping[str, str] | None = None
                    ) -> tuple[int, str, str]:
        raise self._refuse("run_on_node")

    def run_on_nodes(self, nodes: list[str], reservation: str | None, argv: list[str],
                     timeout: float, env: Mapping[str, str] | None = None,
                     tasks_per_node: int = 1) -> tuple[int, str, str]:
        raise self._refuse("run_on_nodes")
