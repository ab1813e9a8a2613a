"""The Alertmanager adapter's registry entry: silences, and the backend of alerts checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.alertmanager.actions import ACTION_CLASSES, AlertmanagerActions
from adapters.alertmanager.backend import HttpAlertmanagerBackend
from adapters.alertmanager.config import AlertmanagerConfig
from adapters.registry import Adapter, Built


def _build(config: AlertmanagerConfig, backends: Mapping[str, Any]) -> Built:
    backend = HttpAlertmanagerBackend(config)
    return Built(AlertmanagerActions(config, backend).all(), backend)


ADAPTER = Adapter("alertmanager", "alertmanager", AlertmanagerConfig, ACTION_CLASSES, _build)
