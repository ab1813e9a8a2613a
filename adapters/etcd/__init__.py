"""etcd: the backend Protocol, its etcdctl/etcdutl implementation and the ``etcd.*`` actions.

    config = EtcdConfig(endpoints=["https://10.0.0.1:2379"], name="etcd1",
                        initial_cluster="etcd1=https://10.0.0.1:2380",
                        initial_advertise_peer_urls="https://10.0.0.1:2380")
    actions = EtcdActions(config).all()
"""

from typing import TYPE_CHECKING

from adapters.lazy import exports

if TYPE_CHECKING:
    from adapters.etcd.actions import (
        ACTION_CLASSES,
        EtcdActions,
        HealthAction,
        KeyCountAction,
        KeysPresentAction,
        SnapshotRestoreAction,
        SnapshotSaveAction,
        SnapshotStatusAction,
    )
    from adapters.etcd.adapter import ADAPTER
    from adapters.etcd.backend import (
        EndpointHealth,
        EtcdBackend,
        EtcdCommands,
        EtcdctlBackend,
        EtcdError,
        SnapshotStatus,
    )
    from adapters.etcd.config import EtcdConfig

__getattr__ = exports(__name__, {
    "adapters.etcd.actions": (
        "ACTION_CLASSES", "EtcdActions", "HealthAction", "KeyCountAction", "KeysPresentAction",
        "SnapshotRestoreAction", "SnapshotSaveAction", "SnapshotStatusAction",
    ),
    "adapters.etcd.adapter": ("ADAPTER",),
    "adapters.etcd.backend": (
        "EndpointHealth", "EtcdBackend", "EtcdCommands", "EtcdctlBackend", "EtcdError",
        "SnapshotStatus",
    ),
    "adapters.etcd.config": ("EtcdConfig",),
})

__all__ = [
    "ACTION_CLASSES",
    "ADAPTER",
    "EndpointHealth",
    "EtcdActions",
    "EtcdBackend",
    "EtcdCommands",
    "EtcdConfig",
    "EtcdError",
    "EtcdctlBackend",
    "HealthAction",
    "KeyCountAction",
    "KeysPresentAction",
    "SnapshotRestoreAction",
    "SnapshotSaveAction",
    "SnapshotStatus",
    "SnapshotStatusAction",
]
