"""The ``prometheus:`` section of the bot configuration."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from adapters.actions import Seconds

_URL = re.compile(r"^https?://[^\s/]+(/\S*)?$")


class PrometheusConfig(BaseModel):
    """Where Prometheus answers and how patiently to ask it.

    ``timeout`` bounds each HTTP request (connect and read), in seconds. A request that
    cannot connect, times out or gets a 5xx is tried ``retries`` more times, waiting
    ``retry_backoff`` seconds, then twice that, and so on; a 4xx (a bad query) is never
    retried. ``headers`` go with every request (``Authorization: Bearer ...`` for a
    proxy in front of Prometheus). ``verify_tls: false`` skips certificate checks.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str  # e.g. http://prometheus.example:9090 (a path prefix is kept)
    timeout: float = Field(default=10.0, gt=0)
    retries: int = Field(default=2, ge=0, le=10)
    retry_backoff: float = Field(default=0.5, ge=0)
    headers: dict[str, str] | None = None
    verify_tls: bool = True
    # how long a repaired node's GPUs are watched in DCGM before it returns (the health
    # check's GPU gate: no new XID or ECC error, every GPU reporting); a runbook's settle=
    gpu_settle: Seconds = Field(default=120.0, le=3600)

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not _URL.match(value):
            raise ValueError(f"{value!r} is not a URL like http://prometheus:9090")
        return value.rstrip("/")
