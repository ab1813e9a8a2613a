"""``FakeEtcd``: an in-memory ``EtcdBackend`` for tests of the reading actions, type-checked
against the Protocol.

It holds keys, not a cluster: it takes no snapshot and restores none. Nothing outside tests
may use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from adapters.etcd.backend import EndpointHealth, SnapshotStatus

if TYPE_CHECKING:
    from adapters.etcd.backend import EtcdBackend


class FakeEtcd:
    """``keys`` and their values; the endpoint answers unhealthy for the first
    ``sick_polls`` health checks (``polls`` counts them)."""

    def __init__(self, keys: dict[str, str], sick_polls: int = 0,
                 endpoint: str = "http://e:2379") -> None:
        self.keys = keys
        self.sick_polls = sick_polls
        self.polls = 0
        self.endpoint = endpoint

    def health(self, *, timeout: float | None = None) -> dict[str, EndpointHealth]:
        self.polls += 1
        healthy = self.polls > self.sick_polls
        return {self.endpoint: EndpointHealth(self.endpoint, healthy,
                                              None if healthy else "context deadline exceeded")}

    def key_count(self, prefix: str = "", *, timeout: float | None = None) -> int:
        return sum(1 for key in self.keys if key.startswith(prefix))

    def get(self, key: str, *, timeout: float | None = None) -> str | None:
        return self.keys.get(key)

    def snapshot_save(self, path: Path, *, timeout: float | None = None) -> str:
        raise NotImplementedError("FakeEtcd takes no snapshot")

    def snapshot_status(self, path: Path, *, timeout: float | None = None) -> SnapshotStatus:
        raise NotImplementedError("FakeEtcd takes no snapshot")

    def snapshot_restore(self, snapshot: Path, data_dir: Path, *,
                         timeout: float | None = None) -> SnapshotStatus:
        raise NotImplementedError("FakeEtcd restores no snapshot")

    def restored_from(self, data_dir: Path) -> dict[str, Any] | None:
        return None  # no directory was ever restored here


if TYPE_CHECKING:
    _checked: EtcdBackend = FakeEtcd({})
