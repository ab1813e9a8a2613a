"""The etcd adapter's registry entry: the ``etcd.*`` actions over etcdctl."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.etcd.actions import ACTION_CLASSES, EtcdActions
from adapters.etcd.config import EtcdConfig
from adapters.registry import Adapter, Built


def _build(config: EtcdConfig, backends: Mapping[str, Any]) -> Built:
    actions = EtcdActions(config)
    return Built(actions.all(), actions.backend)


ADAPTER = Adapter("etcd", "etcd", EtcdConfig, ACTION_CLASSES, _build)
