"""The ``audit.ship.syslog:`` section of the bot configuration: a syslog receiver over TCP
(RFC 6587), with TLS (RFC 5425) when ``tls`` is set."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_SD_ID = re.compile(r'^[!#-<>-Z^-~]{1,32}$')  # printable ASCII except = [ \ ] "


class SyslogConfig(BaseModel):
    """Where the audit log goes as syslog messages, one per event.

    ``port``: default 6514 with TLS (RFC 5425), else 514. ``ca_file`` (PEM) verifies the
    receiver's certificate (default: the system's CAs) for ``server_name`` (default
    ``host``); ``cert_file`` and ``key_file`` are this client's own, when the receiver
    asks for one. ``hostname`` is the messages' HOSTNAME (default: this machine's name)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(min_length=1, max_length=253)
    port: int | None = Field(default=None, ge=1, le=65535)
    tls: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str | None = None
    timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    hostname: str | None = Field(default=None, pattern=r"^[!-~]{1,255}$")
    # the STRUCTURED-DATA element carrying seq and hash; 32473 is the enterprise number
    # RFC 5612 reserves for examples: a site with its own number puts it here
    sd_id: str = "audit@32473"

    @field_validator("sd_id")
    @classmethod
    def _sd_id(cls, value: str) -> str:
        if not _SD_ID.match(value):
            raise ValueError(f"{value!r} is not an SD-ID: 1-32 printable ASCII characters, "
                             'none of = [ \\ ] "')
        return value

    @model_validator(mode="after")
    def _tls_files(self) -> SyslogConfig:
        if not self.tls and (self.ca_file or self.cert_file or self.key_file
                             or self.server_name):
            raise ValueError("ca_file, cert_file, key_file and server_name need tls: true")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together: set both or neither")
        return self

    @property
    def resolved_port(self) -> int:
        return self.port or (6514 if self.tls else 514)

    @property
    def address(self) -> str:
        """The receiver, as the shipper names its cursor: syslog+tls://host:port."""
        return f"syslog{'+tls' if self.tls else ''}://{self.host}:{self.resolved_port}"
