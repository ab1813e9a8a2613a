"""The ``audit.ship.otlp:`` section of the bot configuration: an OpenTelemetry collector
that takes logs over OTLP/HTTP (protobuf)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_URL = re.compile(r"^https?://[^\s/]+(/\S*)?$")
LOGS_PATH = "/v1/logs"
SECRET_KEYS = ("headers", "token", "api_key", "authorization")


class OtlpConfig(BaseModel):
    """Where the audit log goes as OpenTelemetry log records.

    ``endpoint``: the collector's base URL (``/v1/logs`` is added), or the full URL of its
    logs when it has a path, as OTEL_EXPORTER_OTLP_LOGS_ENDPOINT. Headers (an API key, an
    Authorization) come from ``headers_file``, ``Name: value`` lines read at every batch:
    never from this file. HTTPS: ``ca_file``, and a client ``cert_file``/``key_file``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str
    headers_file: Path | None = None
    timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    compression: Literal["none", "gzip"] = "none"
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data: object) -> object:
        if isinstance(data, dict) and (found := [k for k in data if k in SECRET_KEYS]):
            raise ValueError(f"{', '.join(found)}: secrets do not belong in the configuration "
                             "file; put the headers in a file named by headers_file")
        return data

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if not _URL.match(value):
            raise ValueError(f"{value!r} is not a URL like http://collector:4318")
        return value

    @model_validator(mode="after")
    def _tls_files(self) -> OtlpConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together: set both or neither")
        if not self.endpoint.startswith("https:") and (self.ca_file or self.cert_file):
            raise ValueError("ca_file, cert_file and key_file need an https:// endpoint")
        return self

    @property
    def logs_url(self) -> str:
        """Where the records are posted: the endpoint, with /v1/logs when it has no path."""
        if urlsplit(self.endpoint).path in ("", "/"):
            return self.endpoint.rstrip("/") + LOGS_PATH
        return self.endpoint
