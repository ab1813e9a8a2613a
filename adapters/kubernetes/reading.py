"""The node view's Kubernetes reader: ``QuickReader`` (urllib3, no official client) when the
configuration allows one, else the official client. Apart from both, so that neither module
imports the other back (client.py builds its errors with quickread's helpers)."""

from __future__ import annotations

from typing import Any

from adapters.kubernetes.access import Access, Unsupported, resolve
from adapters.kubernetes.config import KubernetesConfig
from adapters.kubernetes.quickread import QuickReader


def make_reader(config: KubernetesConfig) -> Any:
    """A QuickReader when the configuration allows one, else ``client.ClientBackend``."""
    try:
        access: Access | None = resolve(config)
    except (Unsupported, OSError, ValueError, LookupError, TypeError, AttributeError):
        access = None  # the official client reads it, and says what is wrong
    if access is None:
        from adapters.kubernetes.client import make_backend  # its import is slow: only now

        return make_backend(config)
    return QuickReader(config, access)
