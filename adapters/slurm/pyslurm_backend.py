"""The ``pyslurm`` backend, and ``make_backend`` which picks a backend from the configuration.

pyslurm is imported lazily, and a missing or mismatched one says precisely what is wrong;
everything but reading nodes and jobs is refused (``backend: cli`` does it).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from adapters.slurm import parsing
from adapters.slurm.backend import (
    AccountUsage,
    Job,
    NodeInfo,
    Reservation,
    SlurmBackend,
    SlurmError,
)
from adapters.slurm.cli import CliBackend
from adapters.slurm.config import SlurmConfig

PYPI_NOTE = "PyPI has only pyslurm 25.11.x (and 17.x/18.x), whose build requires Slurm 25.11"


def load_pyslurm(cluster_version: tuple[int, int] | None) -> Any:
    """Import pyslurm, or raise SlurmError naming what is missing or mismatched."""
    where = f"Slurm {cluster_version[0]}.{cluster_version[1]:02d}" if cluster_version else "Slurm"
    try:
        module = importlib.import_module("pyslurm")
    except ImportError as exc:
        raise SlurmError(
            f"pyslurm is not installed ({exc}): {PYPI_NOTE} and refuses {where} "
            "(\"Slurm version mismatch\"); use slurm.backend: cli, or build pyslurm from the "
            "branch matching this cluster's Slurm release"
        ) from exc
    raw = str(getattr(module, "__version__", "") or getattr(module, "version", lambda: "")())
    try:
        found = parsing.parse_version(raw)
    except ValueError:
        found = None
    if cluster_version and found and found != cluster_version:
        raise SlurmError(
            f"pyslurm {raw} is built for Slurm {found[0]}.{found[1]:02d} but this cluster runs "
            f"{where}: install the pyslurm release matching {where} or use slurm.backend: cli"
        )
    return module


class PyslurmBackend:
    """``SlurmBackend`` reads (``nodes``, ``jobs``) through pyslurm; every other operation
    raises ``SlurmError("... not supported by the pyslurm backend")``.

    pyslurm must be built against the cluster's exact Slurm release: PyPI carries only
    pyslurm 25.11.x (plus 17.x/18.x), and its build refuses any other Slurm ("Slurm version
    mismatch: requires Slurm 25.11, found 22.5"). The reads are written against pyslurm's
    23.x+ object API and not run here: no matching pyslurm installs next to Slurm 22.05.
    """

    def __init__(self, config: SlurmConfig) -> None:
        self.config = config
        try:
            cluster: tuple[int, int] | None = CliBackend(config).version()
        except SlurmError:
            cluster = None
        self._pyslurm = load_pyslurm(cluster)

    def _unsupported(self, what: str) -> SlurmError:
        return SlurmError(f"{what} is not supported by the pyslurm backend: "
                          "set slurm.backend: cli")

    def nodes(self, names: list[str] | None = None, *, with_jobs: bool = True) -> list[NodeInfo]:
        try:
            loaded = self._pyslurm.Nodes.load()
        except Exception as exc:  # pyslurm raises its own RPCError
            raise SlurmError(f"pyslurm Nodes.load() failed: {exc}") from exc
        wanted = set(names) if names is not None else None
        out = []
        for name, node in dict(loaded).items():
            if wanted is not None and name not in wanted:
                continue
            words = parsing.states(getattr(node, "state", "") or "")
            out.append(parsing.parse_node({
                "name": name,
                "state": words,
                "reason": getattr(node, "reason", None),
                "reason_set_by_user": getattr(node, "reason_user", None),
                "reason_changed_at": getattr(node, "reason_time", None),
                "gres": _gres_text(getattr(node, "configured_gres", None)),
                "gres_used": _gres_text(getattr(node, "allocated_gres", None)),
                "boot_time": getattr(node, "boot_time", None),
            }))
        jobs_by_node: dict[str, list[int]] = {}
        for job in self._jobs() if with_jobs else []:
            if job.active:
                for node_name in job.nodes:
                    jobs_by_node.setdefault(node_name, []).append(job.id)
        return [replace(n, jobs=sorted(jobs_by_node.get(n.name, []))) for n in out]

    def _jobs(self) -> list[Job]:
        try:
            loaded = self._pyslurm.Jobs.load()
        except Exception as exc:
            raise SlurmError(f"pyslurm Jobs.load() failed: {exc}") from exc
        jobs = []
        for job_id, job in dict(loaded).items():
            jobs.append(parsing.parse_job({
                "job_id": job_id,
                "name": getattr(job, "name", ""),
                "user_name": getattr(job, "user_name", ""),
                "account": getattr(job, "account", ""),
                "job_state": getattr(job, "state", ""),
                "nodes": getattr(job, "allocated_nodes", None) or getattr(job, "nodes", None),
                "required_nodes": getattr(job, "required_nodes", None),
            }))
        return jobs

    def jobs(self, names: list[str]) -> list[Job]:
        wanted = set(names)
        return [j for j in self._jobs()
                if (j.active or j.state == "PENDING") and wanted.intersection(j.nodes)]

    def update_nodes(self, names: list[str], state: str, reason: str | None = None) -> None:
        raise self._unsupported("update_nodes (drain/resume)")

    def update_features(self, names: list[str], features: list[str]) -> None:
        raise self._unsupported("update_features")

    def requeue(self, job_ids: list[int]) -> None:
        raise self._unsupported("requeue")

    def reservations(self) -> list[Reservation]:
        raise self._unsupported("reservations")

    def create_reservation(self, name: str, nodes: list[str], start: str,
                           duration_seconds: float, flags: list[str], users: list[str]) -> None:
        raise self._unsupported("create_reservation")

    def delete_reservation(self, name: str) -> None:
        raise self._unsupported("delete_reservation")

    def reboot(self, names: list[str], nextstate: str, reason: str) -> None:
        raise self._unsupported("reboot")

    def run_on_node(self, node: str, reservation: str | None, argv: list[str],
                    timeout: float, env: Mapping[str, str] | None = None
                    ) -> tuple[int, str, str]:
        raise self._unsupported("run_on_node (srun)")

    def accounting(self, start: datetime, end: datetime) -> list[AccountUsage]:
        raise self._unsupported("accounting")

    def accounts(self) -> list[str]:
        raise self._unsupported("accounts (sacctmgr)")

    def dbd_queue(self) -> int:
        raise self._unsupported("dbd_queue (sdiag)")


def _gres_text(value: Any) -> str:
    """pyslurm gives gres as {"gpu:h100": 8}; turn it into Slurm's "gpu:h100:8"."""
    if isinstance(value, dict):
        return ",".join(f"{key}:{count}" for key, count in value.items())
    return parsing.text(value)


def make_backend(config: SlurmConfig) -> SlurmBackend:
    """The backend the configuration asks for (``cli`` by default)."""
    if config.backend == "pyslurm":
        return PyslurmBackend(config)
    return CliBackend(config)
