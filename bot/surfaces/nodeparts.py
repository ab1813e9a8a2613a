"""What ``runbook node`` reads, and nothing more: the configuration, the database, the
Slurm, Kubernetes and Prometheus backends and the node inventory. No action, catalogue or
check is built, so the command starts in a fraction of the time a full bot takes
(bench/cold_start.py). Each backend is the one its adapter builds (adapters/*/adapter.py),
but Kubernetes and Prometheus are read without their client libraries where the
configuration allows it (adapters.kubernetes.quickread, adapters.prometheus.quick: the
same requests, the same answers and errors).
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bot.runbooks.inventory import PoolInventory, build, discovery_sources
from bot.store.recent import SqliteFile, quick_sqlite

if TYPE_CHECKING:
    from bot.config import Config
    from bot.store.db import Engine

# The systems the node view reads: adapter name (also its configuration section) -> the
# module and factory its adapter builds the backend with, imported only when configured.
VIEW_BACKENDS = {
    "slurm": ("adapters.slurm.transports.choice", "make_backend"),
    "kubernetes": ("adapters.kubernetes.reading", "make_reader"),
    "prometheus": ("adapters.prometheus.quick", "QuickPrometheus"),
}


@dataclass
class NodeParts:
    """The parts of ``bot.service.Service`` the node view uses (it takes either)."""

    config: Config
    db: Engine | SqliteFile  # SqliteFile: read without SQLAlchemy (bot.store.recent)
    inventory: PoolInventory
    backends: dict[str, Any]
    warnings: list[str] = field(default_factory=list)  # e.g. a pool that could not be listed


def node_parts(config: Config) -> NodeParts:
    """The database (a SQLite file at the head revision read with sqlite3 alone, else
    connected and migrated to head as for every command), the backends of the configured
    systems the node view reads, and the pools listed once."""
    url = config.resolved_database_url()
    database: Engine | SqliteFile | None = quick_sqlite(url)
    if database is None:
        from bot.store import db

        database = db.connect(url, create=config.database.create)
    backends: dict[str, Any] = {}
    for name, (module, factory) in VIEW_BACKENDS.items():
        section = getattr(config, name)
        if section is not None:
            backends[name] = getattr(importlib.import_module(module), factory)(section)
            if name == "slurm":  # first: Slurm answers while the rest is set up
                backends[name] = OneListing(backends[name])
                backends[name].start()
    sources = discovery_sources(config, backends)
    inventory = build(config.inventory, sources, config.pools, config.mig.layouts,
                      config.drivers.floors())
    return NodeParts(config, database, inventory, backends, list(sources.problems))


class OneListing:
    """A Slurm backend that lists the nodes (with their jobs) once for this command: the
    inventory's listing and the view's read of the same nodes are one ``sinfo --json``
    and one ``squeue --json``, not two of each. ``start`` lists in a thread, so that
    Slurm answers while the other clients are imported and set up."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._listed: list[Any] | None = None
        self._failed: Exception | None = None  # raised once, to the first who asks

    def start(self) -> None:
        threading.Thread(target=self._list, name="slurm-listing", daemon=True).start()

    def _list(self) -> None:
        with self._lock:
            if self._listed is None and self._failed is None:
                try:
                    self._listed = list(self._backend.nodes(None, with_jobs=True))
                except Exception as exc:  # handed to the first caller of nodes()
                    self._failed = exc

    def nodes(self, names: list[str] | None = None, *, with_jobs: bool = True) -> list[Any]:
        self._list()
        with self._lock:
            failed, self._failed = self._failed, None
            if failed is not None:  # the next call asks Slurm again, as before
                raise failed
            listed = list(self._listed or [])
        if names is None:
            return listed
        by_name = {node.name: node for node in listed}
        return [by_name[name] for name in names if name in by_name]

    def __getattr__(self, name: str) -> Any:  # everything else: the backend itself
        return getattr(self._backend, name)
